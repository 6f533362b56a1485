"""SmartSearch's reward (``compute_score_with_format``) with pluggable per-round scorers (redundancy rule,
usefulness judge, and :class:`AnswerInResult`, the rule judge's answer test on the result text alone)."""


from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evaluation.metrics import contains_answer, f1_score
from training.protocols import research as research_protocol
from training.protocols import smartsearch as smartsearch_protocol
from training.protocols.base import last_boxed
from training.rewards.common import Reward, RewardBreakdown, as_golds, warn_once


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


@dataclass(frozen=True)
class JudgeVerdicts:
    """Usefulness verdicts judged elsewhere (e.g. by verl's agent loop), replayed as a :class:`RoundScorer`.

    ``verdicts[i]`` is round i's verdict: 1 useful, 0 not (a bad round), None a failed judge call (counted good).
    """

    verdicts: tuple[int | None, ...]

    def __call__(self, question: str, response: str, golds: Sequence[str]) -> list[bool | None]:
        """One verdict per round, in order (a list of the wrong length is ignored by the reward)."""
        return [None if v is None else v == 1 for v in self.verdicts]


@dataclass(frozen=True)
class AnswerInResult:
    """The rule judge's answer test as a :class:`RoundScorer`, read from the response text alone: a round is good
    when its ``<result>`` block contains a gold answer (whole words after SQuAD normalisation; ``yes``/``no`` golds
    never match), else bad. A gold-informed stand-in for SmartSearch's usefulness judge (the seed's PRM also sees
    the golden answer and asks whether the round's result answers its query intent), NOT that judge: it never reads
    the query's intent. ``training.smartsearch.judge.RuleJudge`` adds the gold-paragraph test where document ids are
    known. The reward option ``answer_judge`` adds it to the redundancy rule (RL presets without a judge endpoint)."""

    def __call__(self, question: str, response: str, golds: Sequence[str]) -> list[bool | None]:
        """One verdict per ``<result>`` block (see :class:`RoundScorer`)."""
        return [contains_answer([block.replace("result: ", "")], golds) is not None
                for block in re.findall(r"<result>(.*?)</result>", response, re.DOTALL)]


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
    answer_judge: bool = False,
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
        answer_judge: also judge every round with :class:`AnswerInResult` (a round is bad when its result holds no
            gold answer): the rule stand-in for the usefulness judge where no judge verdicts reach the reward.
    """
    golds = as_golds(golds)
    if answer_judge:
        scorers = (*scorers, AnswerInResult())
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


def smartsearch_scorers(info: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, float]]:
    """SmartSearch's round scorers from a verl sample's ``extra_info``: the redundancy rule (``max_redundancy``),
    plus the judge's verdicts when the agent loop reported ``round_useful`` (1/0/None per round); and the extra
    floats to report (``judge_failed``, ``branch``)."""
    max_redundancy = info.get("max_redundancy")
    rule = RedundancyRule(1 if max_redundancy is None else int(max_redundancy))
    useful = info.get("round_useful")
    if useful is None:
        warn_once("no extra_info['round_useful'] for the smartsearch reward (agent loop without `smartsearch` "
                  "judge settings?): bad rounds are counted by the redundancy rule only")
        return (rule,), {}
    if hasattr(useful, "tolist"):
        useful = useful.tolist()
    verdicts = tuple(None if v is None or v != v else int(v) for v in useful)  # v != v: NaN from a parquet round trip
    extra = {"judge_failed": float(sum(v is None for v in verdicts)),
             "branch": float(info.get("branch", 0) or 0)}
    return (rule, JudgeVerdicts(verdicts)), extra


def _verl_scorers(info: Mapping[str, Any], options: dict[str, Any]) -> dict[str, float]:
    if "scorers" in options:
        return {}
    options["scorers"], extra = smartsearch_scorers(info)
    return extra


def _trl_question(i: int, kwargs: Mapping[str, Any], options: dict[str, Any], eos_token_id: int | None) -> None:
    if "question" in kwargs:
        options.setdefault("question", str(kwargs["question"][i]))


SMARTSEARCH = Reward(smartsearch_reward, verl_options=_verl_scorers, trl_options=_trl_question)
"""The ``smartsearch`` reward (``training.rewards.registry``): judge verdicts from verl's ``extra_info``, the
question from TRL's ``question`` column."""
