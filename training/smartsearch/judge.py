"""The usefulness judge (SmartSearch's model-level process reward) and the per-round quality of a trajectory.

For every search round, the cumulative prefix up to that round's ``</result>`` (starting at the generation
prefix ``<think>``, as the seed slices at the fourth ``<think>``) is judged with the question and the golden
answer: is the *last* round's query intent necessary and actionable, and does its result answer that intent?
The reply is ``<answer>0|1</answer><explanation>...</explanation>``; :func:`parse_verdict` reads it robustly
and anything else (junk, both digits, a failed call) is a failed call: verdict ``None``, counted and reported.
The format line shows the two replies rather than a ``0 or 1`` placeholder: with the placeholder, all 20 replies of
SmolLM2-135M in the session-8 CPU demo were unparseable (11 copied it); on the first 12 of the same prefixes this
wording got 10 verdicts (9 useful, 1 not).

A round is *low quality* when the verdict is 0 or its redundancy (repeated documents, the seed's exact-string
rule in ``training.rewards.smartsearch``) exceeds ``max_redundancy``. The judge also implements the reward's
``RoundScorer`` interface, so ``smartsearch_reward(..., scorers=(RedundancyRule(), judge))`` is the seed's reward.
Verdicts are cached by (question, prefix): a GRPO group's branches share their judged prefixes.

:class:`RuleJudge` (``judge.kind: rule``) is a deterministic, gold-informed stand-in for runs without a competent
judge model, NOT the seed's judge: a round is useful when its retrieved documents contain a gold answer (SQuAD
normalisation, whole words; ``yes``/``no`` golds never match a document) or a gold supporting paragraph (the
question's ``supporting_doc_ids``), else not useful. It never fails a call and never reads the query's intent, so
it says nothing about whether a query was *necessary*; it exists so that every stage of the curriculum runs on a
machine whose only model is a 135M policy.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evaluation.metrics import contains_answer
from training.protocols.smartsearch import GENERATION_PREFIX
from training.rewards.smartsearch import smartsearch_redundancy, smartsearch_round_prefixes
from training.smartsearch.config import JudgeSpec
from training.smartsearch.endpoint import EndpointClient

log = logging.getLogger(__name__)

JUDGE_TEMPLATE = """You are a query-evaluation assistant. You see a user question, its golden answer and the \
search process of an agent so far (its reasoning in <think>, its queries in <search>, the retrieved documents in \
<result>). Judge only the LAST search round.

Give score 1 only if BOTH hold:
- the last round's query intent is necessary and actionable for answering the question, and
- the last round's <result> contains the answer to that query intent.
Otherwise give score 0.

Guidelines:
1. First identify the intent of the last round's query.
2. The result does not have to solve the user question, but it must fully address the query intent; documents \
that only mention related entities are not enough.
3. The entity the query asks about and the entity found in the result must be exactly the same.

User question: {question}
Golden answer: {golden_answers}
Search process so far:
{process}

Reply with the score alone in the answer tags, <answer>1</answer> (useful) or <answer>0</answer> (not useful), \
then <explanation> why </explanation>."""

_ANSWER = re.compile(r"<answer>\s*([^<]*?)\s*(?:</answer>|<explanation>|$)", re.DOTALL | re.IGNORECASE)
_EXPLANATION = re.compile(r"<explanation>(.*?)(?:</explanation>|$)", re.DOTALL | re.IGNORECASE)


class RoundVerdict(BaseModel):
    """The judgement of one search round (an artifact row)."""

    model_config = ConfigDict(frozen=True)

    question_id: str = Field(description="Question id.")
    sample: int = Field(default=0, description="Sample index of the trajectory.")
    round: int = Field(description="0-based search round.")
    verdict: int | None = Field(description="1 useful, 0 not, None = failed call (unparseable or error).")
    explanation: str = Field(default="", description="The judge's explanation.")
    raw: str = Field(default="", description="The judge's raw reply.")
    error: str | None = Field(default=None, description="Why there is no verdict.")
    redundancy: int = Field(default=0, description="Repeated documents of this round (exact strings).")
    low_quality: bool = Field(description="verdict == 0 or redundancy > max_redundancy.")


def parse_verdict(text: str) -> tuple[int | None, str]:
    """``(verdict, explanation)`` from a judge reply; verdict None when the ``<answer>`` is not exactly 0 or 1.

    The first ``<answer>`` wins; its content must be a single 0 or 1 (surrounding spaces and a trailing period
    allowed). ``"1 or 0"``, ``"yes"``, ``"10"``, an empty answer or no tag at all are failures.
    """
    explanation = (_EXPLANATION.search(text) or [None, ""])[1].strip()  # type: ignore[index]
    match = _ANSWER.search(text)
    if match is None:
        return None, explanation
    value = match.group(1).strip().rstrip(".").strip()
    return (int(value) if value in {"0", "1"} else None), explanation


def load_template(path: str | None, default: str, fields: Sequence[str]) -> str:
    """A prompt template: the user's file (checked for its ``{field}`` slots) or ``default``."""
    if path is None:
        return default
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"prompt template {path!r} not found; pass a text file with {{{'}, {'.join(fields)}}}")
    text = p.read_text(encoding="utf-8")
    missing = [f for f in fields if "{" + f + "}" not in text]
    if missing:
        raise ValueError(f"prompt template {path} lacks the field(s) {missing}; it must contain "
                         + ", ".join("{" + f + "}" for f in fields))
    return text


def judge_text(response: str) -> str:
    """The text the judge sees: the response as the seed slices it (starting at the generation ``<think>``)."""
    return response if response.startswith(GENERATION_PREFIX) else GENERATION_PREFIX + response


class UsefulnessJudge:
    """Judges search rounds through an :class:`EndpointClient`; a ``RoundScorer`` for the SmartSearch reward.

    Args:
        client: the endpoint client.
        spec: prompt template, sampling, redundancy threshold.
    """

    def __init__(self, client: EndpointClient, spec: JudgeSpec | None = None) -> None:
        self.client, self.spec = client, spec or JudgeSpec()
        self.template = load_template(self.spec.template_file, JUDGE_TEMPLATE,
                                      ("question", "golden_answers", "process"))
        self._cache: dict[tuple[str, str], tuple[int | None, str, str, str | None]] = {}
        self._lock = threading.Lock()
        self.stats = {"rounds": 0, "useful": 0, "not_useful": 0, "failed": 0, "cached": 0}

    def prompt(self, question: str, golds: Sequence[str], prefix: str) -> str:
        """The judge's user message for one cumulative prefix."""
        return self.template.format(question=question, golden_answers="; ".join(golds), process=prefix)

    def judge_prefixes(self, items: Sequence[tuple[str, Sequence[str], str]]) -> list[tuple[int | None, str, str,
                                                                                           str | None]]:
        """``(verdict, explanation, raw, error)`` per ``(question, golds, prefix)``; one batched round of calls."""
        keys = [(q, p) for q, _, p in items]
        with self._lock:
            todo = [i for i, k in enumerate(keys) if k not in self._cache]
            self.stats["cached"] += len(keys) - len(todo)
        unique = list(dict.fromkeys(keys[i] for i in todo))
        first = {k: next(i for i in todo if keys[i] == k) for k in unique}
        prompts = [self.prompt(items[first[k]][0], items[first[k]][1], items[first[k]][2]) for k in unique]
        replies = self.client.complete(prompts, self.spec.response_prefix, self.spec.temperature,
                                       self.spec.max_tokens)
        with self._lock:
            for k, reply in zip(unique, replies, strict=True):
                raw = self.spec.response_prefix + reply.text
                verdict, why = parse_verdict(raw) if reply.error is None else (None, "")
                error = reply.error or (None if verdict is not None else "unparseable verdict")
                self._cache[k] = (verdict, why, raw, error)
                self.stats["rounds"] += 1
                key = {1: "useful", 0: "not_useful", None: "failed"}[verdict]
                self.stats[key] += 1
            return [self._cache[k] for k in keys]

    def judge_trajectories(self, trajectories: Sequence[Any]) -> list[list[RoundVerdict]]:
        """Per trajectory, one :class:`RoundVerdict` per search round (all rounds of all trajectories batched)."""
        items, owners = [], []
        for t_idx, t in enumerate(trajectories):
            for r_idx, prefix in enumerate(smartsearch_round_prefixes(judge_text(t.response))):
                items.append((t.question, list(t.golden_answers), prefix))
                owners.append((t_idx, r_idx))
        results = self.judge_prefixes(items)
        out: list[list[RoundVerdict]] = [[] for _ in trajectories]
        redundancy = [smartsearch_redundancy(judge_text(t.response)) for t in trajectories]
        for (t_idx, r_idx), (verdict, why, raw, error) in zip(owners, results, strict=True):
            t = trajectories[t_idx]
            red = redundancy[t_idx][r_idx] if r_idx < len(redundancy[t_idx]) else 0
            out[t_idx].append(RoundVerdict(
                question_id=t.question_id, sample=t.sample, round=r_idx, verdict=verdict, explanation=why,
                raw=raw, error=error, redundancy=red,
                low_quality=verdict == 0 or red > self.spec.max_redundancy))
        return out

    def __call__(self, question: str, response: str, golds: Sequence[str]) -> list[bool | None]:
        """``RoundScorer``: per round True (useful), False (not useful), None (failed call, counted good)."""
        prefixes = smartsearch_round_prefixes(judge_text(response))
        results = self.judge_prefixes([(question, list(golds), p) for p in prefixes])
        return [None if v is None else v == 1 for v, *_ in results]


class GoldSupport:
    """Gold supporting paragraphs per question (ids and titles), keyed by question id and by question text.

    What the rule judge and the rule refiner read (``Question.supporting_doc_ids`` and the rows'
    ``supporting_titles``, kept in ``Question.metadata``).
    """

    def __init__(self, questions: Sequence[Any] = ()) -> None:
        self.by_id: dict[str, tuple[list[str], list[str]]] = {}
        self.by_text: dict[str, tuple[list[str], list[str]]] = {}
        self.add(questions)

    def add(self, questions: Sequence[Any]) -> None:
        """Register questions (``evaluation.benchmarks.Question``)."""
        for q in questions:
            titles = [str(t) for t in (q.metadata or {}).get("supporting_titles", [])]
            entry = (list(q.supporting_doc_ids), titles)
            self.by_id[q.id] = entry
            self.by_text[q.question] = entry

    def doc_ids(self, question_id: str | None = None, question: str | None = None) -> list[str]:
        """Gold supporting doc ids of a question (empty when unknown)."""
        entry = self.by_id.get(question_id or "") or self.by_text.get(question or "")
        return entry[0] if entry else []

    def titles(self, question_id: str | None = None, question: str | None = None) -> list[str]:
        """Gold supporting titles of a question (empty when unknown)."""
        entry = self.by_id.get(question_id or "") or self.by_text.get(question or "")
        return entry[1] if entry else []


_RESULT = re.compile(r"<result>(.*?)</result>", re.DOTALL)


class RuleJudge:
    """Deterministic gold-informed stand-in for the usefulness judge (module docstring); same interface as
    :class:`UsefulnessJudge` (``judge_trajectories``, ``RoundScorer``, ``stats``, ``spec``).

    Args:
        support: gold supporting paragraphs per question (may be empty: then only the answer rule applies).
        spec: the judge settings (``max_redundancy`` is read).
    """

    def __init__(self, support: GoldSupport | None = None, spec: JudgeSpec | None = None) -> None:
        self.support, self.spec = support or GoldSupport(), spec or JudgeSpec(kind="rule")
        self._cache: dict[tuple[str, str], tuple[int | None, str, str, str | None]] = {}
        self._lock = threading.Lock()
        self.stats = {"rounds": 0, "useful": 0, "not_useful": 0, "failed": 0, "cached": 0}

    def verdict(self, doc_ids: Sequence[str], doc_texts: Sequence[str], golds: Sequence[str],
                gold_ids: Sequence[str]) -> tuple[int, str]:
        """(1 or 0, explanation) of one round from its documents."""
        hit = [d for d in doc_ids if d in set(gold_ids)]
        if hit:
            return 1, f"rule judge: the round retrieved gold supporting paragraph(s) {', '.join(hit)}."
        answer = contains_answer(doc_texts, golds)
        if answer is not None:
            return 1, f"rule judge: the round's documents contain the gold answer {answer!r}."
        return 0, ("rule judge: the round's documents contain neither a gold answer nor a gold supporting "
                   "paragraph; the query did not find the information the question needs.")

    def _store(self, key: tuple[str, str], verdict: int, why: str) -> tuple[int | None, str, str, str | None]:
        with self._lock:
            if key in self._cache:
                self.stats["cached"] += 1
                return self._cache[key]
            self._cache[key] = (verdict, why, f"<answer>{verdict}</answer><explanation>{why}</explanation>", None)
            self.stats["rounds"] += 1
            self.stats["useful" if verdict == 1 else "not_useful"] += 1
            return self._cache[key]

    def judge_trajectories(self, trajectories: Sequence[Any]) -> list[list[RoundVerdict]]:
        """Per trajectory, one :class:`RoundVerdict` per search round (its documents against the gold)."""
        out: list[list[RoundVerdict]] = []
        for t in trajectories:
            prefixes = smartsearch_round_prefixes(judge_text(t.response))
            rounds = [turn for turn in t.turns if "</result>" in turn.inserted]
            red = smartsearch_redundancy(judge_text(t.response))
            gold_ids = self.support.doc_ids(t.question_id, t.question)
            verdicts = []
            for r_idx, prefix in enumerate(prefixes):
                if r_idx < len(rounds):
                    v, why = self.verdict(rounds[r_idx].doc_ids, rounds[r_idx].doc_texts, t.golden_answers, gold_ids)
                else:  # a result block without its turn record: the text alone
                    v, why = self._text_verdict(prefix, t.golden_answers)
                verdict, why, raw, _ = self._store((t.question, prefix), v, why)
                r = red[r_idx] if r_idx < len(red) else 0
                verdicts.append(RoundVerdict(question_id=t.question_id, sample=t.sample, round=r_idx,
                                             verdict=verdict, explanation=why, raw=raw, redundancy=r,
                                             low_quality=verdict == 0 or r > self.spec.max_redundancy))
            out.append(verdicts)
        return out

    def _text_verdict(self, prefix: str, golds: Sequence[str]) -> tuple[int, str]:
        blocks = _RESULT.findall(prefix)
        return self.verdict([], blocks[-1:] if blocks else [], golds, [])

    def __call__(self, question: str, response: str, golds: Sequence[str]) -> list[bool | None]:
        """``RoundScorer``: the verdicts judged from the trajectory records (cached by prefix), else from the result
        text alone (gold answer only: the text carries no document ids)."""
        out: list[bool | None] = []
        for prefix in smartsearch_round_prefixes(judge_text(response)):
            with self._lock:
                cached = self._cache.get((question, prefix))
            verdict = cached[0] if cached else self._store((question, prefix), *self._text_verdict(prefix, golds))[0]
            out.append(verdict == 1)
        return out


def make_judge(spec: JudgeSpec, client: EndpointClient | None, support: GoldSupport | None = None) -> Any:
    """The judge a preset asks for: :class:`RuleJudge` (``kind: rule``) or :class:`UsefulnessJudge`."""
    if spec.kind == "rule":
        return RuleJudge(support, spec)
    if client is None:
        raise ValueError("judge.kind=model needs the endpoint client (endpoint.base_url or endpoint.serve_model)")
    return UsefulnessJudge(client, spec)
