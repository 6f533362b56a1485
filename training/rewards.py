"""Reward functions of the seeds as plain functions, callable outside any trainer.

Each function scores one *response* (the generated text after the prompt, documents included) against the
gold answers and returns a :class:`RewardBreakdown`. What each reproduces (see ``shared/notes/seeds.md``):

- :func:`research_reward`: ReSearch ``re_search.py``: 0 for a bad format or no EOS, else F1 of the last
  ``\\boxed{}`` inside ``<answer>`` if F1 > 0, else 0.1.
- :func:`r1searcher_stage1_reward` / :func:`r1searcher_stage2_reward`: R1-Searcher's reward servers.
- :func:`searchr1_em_reward` / :func:`searchr1_format_reward`: Search-R1 ``qa_em.py`` / ``qa_em_format.py``.
- :func:`smartsearch_reward`: SmartSearch ``compute_score_with_format`` with a pluggable per-round scorer.

The format checks are the protocol modules' validators (``training.protocols.<name>``), which reproduce each
seed's reward-side check; trainer adapters (verl, TRL) live in ``training.reward_adapters``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from evaluation.metrics import exact_match, f1_score, normalize_answer, token_cover_em
from infra.errors import ConfigError
from training.protocols import r1searcher as r1_protocol
from training.protocols import research as research_protocol
from training.protocols import searchr1 as searchr1_protocol
from training.protocols import smartsearch as smartsearch_protocol
from training.protocols.base import FormatCheck, last_boxed


@dataclass(frozen=True)
class RewardBreakdown:
    """A scalar reward with its parts (for logging) and a short human-readable reason."""

    score: float
    parts: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    def as_dict(self) -> dict[str, float | str]:
        """``{"score": ..., **parts, "reason": ...}`` for logs (the verl adapter returns the floats only)."""
        return {"score": float(self.score), **self.parts, "reason": self.reason}


def _golds(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


# --------------------------------------------------------------------------------------------------- ReSearch
def research_answer(response: str) -> str | None:
    """ReSearch's prediction: the last boxed content inside the first ``<answer>...</answer>``."""
    return research_protocol.extract_answer(response)


def research_reward(
    response: str, golds: str | Iterable[str], eos_token: str | None = None, finished: bool = True
) -> RewardBreakdown:
    """ReSearch reward: 0 (bad format), 0 (no EOS), 0 (no boxed answer), F1 if F1 > 0, else 0.1.

    Args:
        response: text after ``<|im_start|>assistant\\n`` (instruct) or ``Assistant:`` (base).
        golds: gold answers.
        eos_token: when given, the response must end with it (the seed's "over length" check) and it is
            stripped; when ``None`` the caller says whether generation ended with EOS through ``finished``.
        finished: used only when ``eos_token`` is ``None``.
    """
    check = research_protocol.validate(response)
    if not check.ok:
        return RewardBreakdown(0.0, {"format": 0.0}, "bad format: " + "; ".join(check.reasons))
    if eos_token is not None:
        if not response.endswith(eos_token):
            return RewardBreakdown(0.0, {"format": 1.0}, "over length")
        response = response[: -len(eos_token)]
    elif not finished:
        return RewardBreakdown(0.0, {"format": 1.0}, "over length")
    answer = research_answer(response)
    if answer is None:
        return RewardBreakdown(0.0, {"format": 1.0}, "cannot extract a boxed answer")
    f1 = f1_score(answer, _golds(golds))
    if f1 > 0:
        return RewardBreakdown(f1, {"format": 1.0, "f1": f1}, f"correct answer, f1 {f1:.3f}")
    return RewardBreakdown(0.1, {"format": 1.0, "f1": 0.0}, f"wrong answer but good format: {answer!r}")


# ------------------------------------------------------------------------------------------------ R1-Searcher
def r1searcher_answer(response: str) -> str:
    """R1-Searcher's prediction: text between the last ``<answer>`` and the next ``</answer>``, stripped."""
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


def r1searcher_solution(response: str, eos_token: str | None = None) -> str:
    """The text R1-Searcher's reward server scores: EOS runs stripped from both ends, one EOS appended, stripped.

    The appended EOS keeps trailing newlines (e.g. after ``<|end_of_documents|>``) in place and ends up in the
    prediction when the last ``<answer>`` is unclosed. Without ``eos_token`` only leading whitespace is removed.
    """
    if not eos_token:
        return response.lstrip()
    while response.startswith(eos_token):
        response = response[len(eos_token) :]
    while response.endswith(eos_token):
        response = response[: -len(eos_token)]
    return (response + eos_token).strip()


def r1searcher_stage1_reward(
    response: str, golds: str | Iterable[str], eos_token: str | None = None
) -> RewardBreakdown:
    """R1-Searcher stage 1 (``reward_server_llama_stage1.py``): answer ±1 + retrieve 0.5 + format 0.5.

    - answer: +1 if both answer tags are present and CEM (R1-Searcher normalization) holds, else -1;
    - retrieve: +0.5 if the seven query/document tag counts are equal and >= 1;
    - format: +0.5 if there is no ``<think>`` (the prompt opened it) and exactly one ``</think>``, ``<answer>``
      and ``</answer>``.

    Args:
        response: the text generated after the prompt's trailing ``<think>``.
        golds: gold answers (the seed has one; CEM is maximised over several).
        eos_token: the EOS text the seed appends (Qwen base ``<|endoftext|>``, Llama-3.1 ``<|eot_id|>``); see
            :func:`r1searcher_solution`.
    """
    sol = r1searcher_solution(response, eos_token)
    has_tags = "<answer>" in sol and "</answer>" in sol
    answer = 1.0 if has_tags and token_cover_em(r1searcher_answer(sol), _golds(golds)) else -1.0
    retrieve = 0.5 if r1_protocol.stage1_retrieve_ok(sol) else 0.0
    structure = 0.5 if r1_protocol.stage1_format_ok(sol) else 0.0
    parts = {"answer": answer, "retrieve": retrieve, "format": structure}
    return RewardBreakdown(answer + retrieve + structure, parts, f"cem {'hit' if answer > 0 else 'miss'}")


def r1searcher_stage2_reward(
    response: str, golds: str | Iterable[str], style: Literal["qwen", "llama"] = "qwen", eos_token: str | None = None
) -> RewardBreakdown:
    """R1-Searcher stage 2: answer F1 (0 without answer tags) minus 2 (Qwen) or 1 (Llama) on any violation.

    Qwen checks (``reward_server_qwen_zero.py``) and Llama checks (``reward_server_llama_stage2.py``) are listed
    in :func:`training.protocols.r1searcher.format_violations`; ``eos_token`` as in
    :func:`r1searcher_stage1_reward`.
    """
    if style not in ("qwen", "llama"):
        raise ConfigError(f"R1-Searcher style must be 'qwen' or 'llama', got {style!r}")
    sol = r1searcher_solution(response, eos_token)
    has_tags = "<answer>" in sol and "</answer>" in sol
    f1 = f1_score(r1searcher_answer(sol), _golds(golds), "r1searcher") if has_tags else 0.0
    violations = r1_protocol.format_violations(sol, style)
    penalty = (2.0 if style == "qwen" else 1.0) if violations else 0.0
    reason = "; ".join(violations) if violations else "format ok"
    return RewardBreakdown(f1 - penalty, {"f1": f1, "penalty": -penalty}, reason)


# -------------------------------------------------------------------------------------------------- Search-R1
def searchr1_answer(text: str, min_answer_matches: int = 1) -> str | None:
    """Search-R1's prediction: the last ``<answer>...</answer>``, or ``None`` with fewer than the required matches.

    The seed scores prompt + response and requires **2** matches because its prompt shows one example
    ``<answer> Beijing </answer>``. Scoring the response alone, 1 is the same rule; pass 2 for full sequences.
    """
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    return matches[-1].strip() if len(matches) >= min_answer_matches else None


def searchr1_em_reward(
    response: str, golds: str | Iterable[str], min_answer_matches: int = 1, format_score: float = 0.0
) -> RewardBreakdown:
    """Search-R1 ``qa_em.compute_score_em``: 1 if the extracted answer exactly matches a gold, else
    ``format_score`` (0), and 0 when no answer is extracted."""
    answer = searchr1_answer(response, min_answer_matches)
    if answer is None:
        return RewardBreakdown(0.0, {"em": 0.0}, "no answer extracted")
    em = exact_match(answer, _golds(golds))
    return RewardBreakdown(1.0 if em else format_score, {"em": em}, f"answer {answer!r}")


def searchr1_retrieval_hit(text: str, golds: str | Iterable[str]) -> bool:
    """True if a normalized gold is a substring of a normalized ``<information>`` block (Search-R1)."""
    blocks = [normalize_answer(b.strip()) for b in re.findall(r"<information>(.*?)</information>", text, re.DOTALL)]
    return any(normalize_answer(g) in b for b in blocks for g in _golds(golds))


def searchr1_sequence(text: str, require_assistant_marker: bool = False) -> FormatCheck:
    """Search-R1's ``is_valid_sequence``: the protocol validator applied after ``<|im_start|>assistant`` when that
    marker is present (full sequences, as the seed scores them), else to the whole text (a response)."""
    marker = re.search(r"<\|im_start\|>assistant\s*", text)
    if marker:
        return searchr1_protocol.validate(text[marker.end() :])
    if require_assistant_marker:
        return FormatCheck(ok=False, reasons=["Missing assistant marker"])
    return searchr1_protocol.validate(text)


def searchr1_format_reward(
    response: str,
    golds: str | Iterable[str],
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    retrieval_score: float = 0.0,
    min_answer_matches: int = 1,
) -> RewardBreakdown:
    """Search-R1 ``qa_em_format.compute_score_em`` with the v0.3 scores (0.2 / 0.1 / retrieval 0).

    Correct answer: 1.0 (valid sequence) or 1 - structure_format_score (invalid). Otherwise, valid sequence:
    structure_format_score (+ retrieval_score if a gold is in an ``<information>`` block); invalid: 0 without
    an answer, final_format_score with a wrong one.
    """
    check = searchr1_sequence(response)
    hit = check.ok and searchr1_retrieval_hit(response, golds)
    answer = searchr1_answer(response, min_answer_matches)
    em = exact_match(answer, _golds(golds)) if answer is not None else 0.0
    shaped = structure_format_score + (retrieval_score if hit else 0.0)
    if em:
        score = 1.0 if check.ok else 1.0 - structure_format_score
    elif check.ok:
        score = shaped
    else:
        score = 0.0 if answer is None else final_format_score
    parts = {"em": em, "valid_format": float(check.ok), "retrieval_hit": float(hit)}
    return RewardBreakdown(score, parts, "; ".join(check.reasons) or "valid sequence")


# ------------------------------------------------------------------------------------------------ SmartSearch
class RoundScorer(Protocol):
    """Judges every search round of a response: one verdict per ``</result>``, in order.

    ``True`` = good round, ``False`` = bad (low-quality) round, ``None`` = no verdict (counted good, as the seed
    counts a failed PRM call). A list of the wrong length is ignored, as the seed ignores a misaligned
    redundancy list. The PRM judge of SmartSearch implements this interface (it scores each cumulative prefix of
    :func:`smartsearch_round_prefixes` with the question and golden answer).
    """

    def __call__(self, question: str, response: str, golds: Sequence[str]) -> list[bool | None]: ...


def smartsearch_redundancy(response: str) -> list[int]:
    """Per ``<result>`` block: how many of its distinct fragments (split on blank lines after removing
    ``"result: "``) already appeared, exactly, in an earlier block."""
    seen: set[str] = set()
    counts = []
    for block in re.findall(r"<result>(.*?)</result>", response, re.DOTALL):
        fragments = set(block.replace("result: ", "").strip().split("\n\n"))
        counts.append(len(seen & fragments))
        seen |= fragments
    return counts


@dataclass(frozen=True)
class RedundancyRule:
    """SmartSearch's rule-level scorer: a round is bad when more than ``max_repeats`` fragments repeat."""

    max_repeats: int = 1

    def __call__(self, question: str, response: str, golds: Sequence[str]) -> list[bool | None]:
        """One verdict per ``<result>`` block (see :class:`RoundScorer`)."""
        return [count <= self.max_repeats for count in smartsearch_redundancy(response)]


def smartsearch_round_prefixes(response: str) -> list[str]:
    """Cumulative prefixes of the response, each ending at one ``</result>`` (what the PRM judges)."""
    return [response[: m.end()] for m in re.finditer(r"</result>", response)]


def smartsearch_split(solution_str: str) -> tuple[str, str] | None:
    """Split a full SmartSearch sequence as the seed does: (user message, text from the 4th ``<think>``).

    The system prompt holds three ``<think>``; the fourth is the generation prefix. ``None`` when either part is
    missing (the seed then scores 0).
    """
    user = re.search(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", solution_str, re.DOTALL)
    thinks = [m.start() for m in re.finditer(r"<think>", solution_str)]
    if not user or len(thinks) < 4:
        return None
    return user.group(1).strip(), solution_str[thinks[3] :]


def smartsearch_process(
    response: str, golds: Sequence[str], question: str = "", scorers: Sequence[RoundScorer] = (RedundancyRule(),)
) -> tuple[int, int]:
    """(good, bad) search rounds: one round per ``</result>``; bad when any aligned scorer says ``False``."""
    n_rounds = response.count("</result>")
    verdicts = [v for v in (s(question, response, golds) for s in scorers) if len(v) == n_rounds]
    bad = sum(1 for i in range(n_rounds) if any(v[i] is False for v in verdicts))
    return n_rounds - bad, bad


def smartsearch_reward(
    response: str,
    golds: str | Iterable[str],
    question: str = "",
    scorers: Sequence[RoundScorer] = (RedundancyRule(),),
    prefixed: bool = False,
) -> RewardBreakdown:
    """SmartSearch GRPO reward: outcome + process adjustment + format, zeroed by ``</search<``.

    outcome 1.0 if F1(last ``\\boxed{}``) >= 0.8; correct: ``max(1 - 0.1 * bad, 0.7)``, wrong:
    ``min(0.1 * good, 0.3)``; +0.1 when the ReSearch-style format check passes; 0 when ``</search<`` appears.

    Args:
        response: the generated response after the prompt, which ends with the ``<think>`` generation prefix.
        golds: gold answers.
        question: the user question (for model judges).
        scorers: per-round judges (:class:`RoundScorer`); the default is the redundancy rule; add the PRM judge
            when one is served.
        prefixed: True when ``response`` already starts with that ``<think>`` (the seed's slice at the fourth
            ``<think>``, see :func:`smartsearch_split`); otherwise it is prepended, as the seed's slice includes it.
    """
    golds = _golds(golds)
    text = response if prefixed else smartsearch_protocol.GENERATION_PREFIX + response
    f1 = f1_score(last_boxed(text) or "", golds)
    correct = f1 >= 0.8
    good, bad = smartsearch_process(text, golds, question, scorers)
    score = 1.0 if correct else 0.0
    if correct:
        score -= 0.1 * bad
        score = max(score, 0.7)
    else:
        score += 0.1 * good
        score = min(score, 0.3)
    process = score - (1.0 if correct else 0.0)
    check = research_protocol.validate(text)
    if check.ok:
        score += 0.1
    parts = {"f1": f1, "outcome": 1.0 if correct else 0.0, "process": process, "format": 0.1 if check.ok else 0.0,
             "good_rounds": float(good), "bad_rounds": float(bad)}
    if smartsearch_protocol.BAD_SEARCH_TAG in text:
        return RewardBreakdown(0.0, parts, "malformed tag '</search<'")
    return RewardBreakdown(score, parts, "; ".join(check.reasons) or "format ok")
