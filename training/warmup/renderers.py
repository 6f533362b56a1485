"""Warm-up trajectories for every tag protocol, rendered by the rollout engine itself (byte-identical to rollouts).

The sources of ``training.warmup.sources`` (decompositions + our retriever, FireAct, a teacher) give
protocol-independent
*episodes*: a question, steps of (sub-query, fact, documents) and the gold answer. An episode becomes a trajectory
of protocol P by replaying it through ``training.agent.rollout.run_rollouts`` with P's own protocol object:

- :class:`ReplayGenerator` returns, step by step, the text a perfect P-agent would generate (P's tags around the
  sub-query, the fact as reasoning, P's answer syntax: ``P.warmup_script``);
- :class:`ReplaySearcher` returns the episode's documents for each search, in order;
- the protocol builds the prompt, cuts at its stop strings, inserts the documents in its format (and appends EOS
  where the rollout does), and the engine records generated/inserted segments and the token loss mask.

So prompt, document blocks and masks are exactly what a rollout of P produces; only the generated text is scripted.
Each trajectory is kept when P's validator (``protocol.validate``, the seed's reward-side check) passes, the
extracted answer matches the gold one and every step searched (:func:`render_episodes` counts the rest by reason).

Episodes with more hops than P allows searches (``max_turns``) are truncated: the dropped hops' facts join the
last reasoning step (counted as ``truncated``). Facts can be shortened (``max_fact_words``) to fit small budgets.

Rows (``write_rows``): ``question_id``, ``source``, ``protocol``, ``prompt``, ``response``, ``segments``
(``[[text, generated], ...]``), ``input_ids`` (prompt + response) and ``labels`` (``-100`` on the prompt and on
every token that is not entirely generated, i.e. documents, feedback and template tokens). ``training.sft.launcher``'s
``train_sft_tokenized`` trains on them through LLaMA-Factory's workflow with our trainer.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from evaluation.benchmarks import Question
from retrieval.types import Hit
from training.generation.base import Completion, SamplingParams
from training.protocols.base import WARMUP_OPENING, Script, SearchProtocol, Segment, load_protocol

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
OPENING = WARMUP_OPENING


@dataclass
class Episode:
    """A protocol-independent warm-up episode: steps of (sub-query, fact, documents), then the gold answer."""

    question: Question
    steps: list[tuple[str, str, list[Hit]]]
    answer: str
    source: str
    meta: dict[str, Any] = field(default_factory=dict)


class ProtocolWarmupStats(BaseModel):
    """What rendering one source's episodes in one protocol produced."""

    protocol: str = Field(description="Protocol name.")
    source: str = Field(description="Source label (decomposition:<dataset>, fireact, teacher).")
    candidates: int = Field(description="Episodes rendered.")
    valid: int = Field(description="Trajectories that pass the protocol's validator with the gold answer (kept).")
    truncated: int = Field(default=0, description="Episodes cut to the protocol's search limit (kept if valid).")
    rejected: dict[str, int] = Field(default_factory=dict, description="Rejected trajectories, by reason.")
    first_reasons: dict[str, int] = Field(default_factory=dict, description="Validator reasons of rejections.")


# The generated text of each protocol is the protocol's own (``SearchProtocol.warmup_script``, a ``Script``: one
# (text, stop string or None, finish reason) per generation step), and so is its search limit
# (``SearchProtocol.search_limit``).


class ReplayGenerator:
    """A ``Generator`` that returns a fixed script, one item per call (one trajectory at a time)."""

    def __init__(self, script: Script, eos_token: str | None, tokenizer: Any | None = None) -> None:
        self.script = list(script)
        self.eos_token = eos_token
        self.tokenizer = tokenizer
        self.calls = 0

    def generate(self, prompts: list[str], sampling: SamplingParams,
                 max_tokens: list[int] | None = None) -> list[Completion]:
        """The next script item for the single prompt (an empty EOS completion once the script is exhausted)."""
        if len(prompts) != 1:
            raise ValueError(f"ReplayGenerator replays one trajectory at a time, got {len(prompts)} prompts")
        if self.calls >= len(self.script):
            self.calls += 1
            return [Completion(text="", token_ids=[], finish_reason="eos")]
        text, stop, reason = self.script[self.calls]
        self.calls += 1
        return [Completion(text=text, token_ids=[0], finish_reason=reason, stop=stop)]  # type: ignore[arg-type]


class ReplaySearcher:
    """A ``Searcher`` returning the episode's documents for each search call, in order."""

    def __init__(self, hits: Sequence[list[Hit]]) -> None:
        self.hits = list(hits)
        self.calls = 0

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Documents of the next step (``k`` is the protocol's top-k; the episode already holds that many)."""
        out = []
        for _ in queries:
            out.append(list(self.hits[self.calls][:k]) if self.calls < len(self.hits) else [])
            self.calls += 1
        return out


def shorten(text: str, max_words: int | None) -> str:
    """The first ``max_words`` words of ``text`` (whitespace collapsed); all of it when None."""
    words = text.split()
    return " ".join(words if max_words is None else words[:max_words])


def fit_steps(protocol: SearchProtocol, steps: list[tuple[str, str, list[Hit]]],
              max_fact_words: int | None = None) -> tuple[list[tuple[str, str, list[Hit]]], bool]:
    """Steps cleaned (one-line queries/facts) and cut to the protocol's search limit; (steps, truncated)."""
    clean = [(" ".join(q.replace('"', "").split()), shorten(f, max_fact_words), h) for q, f, h in steps]
    if protocol.max_turns is None:
        return clean, False
    limit = max(0, protocol.search_limit(protocol.max_turns))
    if len(clean) <= limit:
        return clean, False
    kept = clean[:limit]
    rest = " ".join(f for _, f, _ in clean[max(limit - 1, 0):])
    if kept:
        kept[-1] = (kept[-1][0], shorten(rest, max_fact_words), kept[-1][2])
    return kept, True


def render_episode(protocol: SearchProtocol, episode: Episode, tokenizer: Any,
                   max_fact_words: int | None = None) -> tuple[Any, bool]:
    """Replay ``episode`` through the rollout engine with ``protocol``: (Trajectory, truncated)."""
    from training.agent.rollout import RolloutConfig, run_rollouts

    steps, truncated = fit_steps(protocol, episode.steps, max_fact_words)
    queries, facts = [s[0] for s in steps], [s[1] for s in steps]
    if not steps and episode.steps:  # no search allowed: all facts go into the one reasoning step
        facts = [shorten(" ".join(f for _, f, _ in episode.steps), max_fact_words)]
    script = protocol.warmup_script(queries, facts, episode.answer.strip())
    gen = ReplayGenerator(script, getattr(tokenizer, "eos_token", None), tokenizer)
    cfg = RolloutConfig(n=1, temperature=0.0, best_of=1, max_tokens_per_turn=1 << 20, max_total_tokens=1 << 20,
                        max_passes=len(script) + 1)
    question = episode.question.model_copy(update={"golden_answers": [episode.answer]})
    [traj] = run_rollouts([question], protocol, gen, ReplaySearcher([s[2] for s in steps]), cfg, tokenizer)
    return traj, truncated


def rejection(traj: Any, n_steps: int) -> str | None:
    """Why a replayed trajectory is not kept (None = kept): validator, answer extraction, search count."""
    from evaluation.metrics import exact_match

    if not traj.format_ok:
        return "invalid_format"
    if traj.final_answer is None or exact_match(traj.final_answer, traj.golden_answers) < 1.0:
        return "answer_not_extracted"
    if traj.n_searches != n_steps:
        return "search_count_mismatch"
    return None


def full_tokens(tokenizer: Any, prompt: str, segments: list[Segment]) -> tuple[list[int], list[int]]:
    """(input_ids of prompt + response, labels): the prompt and every segment tokenized on its own (no token merges
    generated with inserted text); labels are -100 except on generated tokens."""
    from training.agent.rollout import prompt_token_ids, token_mask

    resp_ids, mask, _ = token_mask(tokenizer, prompt, segments)
    prompt_ids = prompt_token_ids(tokenizer, prompt)
    labels = [IGNORE_INDEX] * len(prompt_ids) + [t if m else IGNORE_INDEX for t, m in zip(resp_ids, mask, strict=True)]
    return prompt_ids + resp_ids, labels


def segments_of(traj: Any) -> list[Segment]:
    """Generated/inserted segments of a trajectory record (from its generated spans)."""
    out, pos = [], 0
    for start, end in traj.generated_spans:
        if start > pos:
            out.append(Segment(traj.response[pos:start], False))
        out.append(Segment(traj.response[start:end], True))
        pos = end
    if pos < len(traj.response):
        out.append(Segment(traj.response[pos:], False))
    return out


def render_episodes(protocol: SearchProtocol, episodes: Iterable[Episode], tokenizer: Any, source: str,
                    max_fact_words: int | None = None) -> tuple[list[dict[str, Any]], ProtocolWarmupStats]:
    """Render episodes in ``protocol``; keep the valid ones as training rows (see the module docstring)."""
    rows, rejected, reasons, n, truncated = [], Counter(), Counter(), 0, 0
    for ep in episodes:
        n += 1
        traj, cut = render_episode(protocol, ep, tokenizer, max_fact_words)
        truncated += cut
        n_steps = len(fit_steps(protocol, ep.steps)[0])
        why = rejection(traj, n_steps)
        if why is not None:
            rejected[why] += 1
            reasons.update(traj.format_reasons[:1])
            continue
        segments = segments_of(traj)
        ids, labels = full_tokens(tokenizer, traj.prompt, segments)
        rows.append({"question_id": ep.question.id, "source": ep.source, "protocol": protocol.name,
                     "prompt": traj.prompt, "response": traj.response,
                     "segments": [[s.text, s.generated] for s in segments], "input_ids": ids, "labels": labels})
    stats = ProtocolWarmupStats(protocol=protocol.name, source=source, candidates=n, valid=len(rows),
                                truncated=truncated, rejected=dict(rejected), first_reasons=dict(reasons))
    log.info("warm-up %s/%s: %d of %d valid (%d truncated, rejected %s)", protocol.name, source, len(rows), n,
             truncated, dict(rejected))
    return rows, stats


def decomposition_episodes(questions: Iterable[Question], searcher: Any, passages: dict[str, Any],
                           top_k: int) -> tuple[dict[str, list[Episode]], dict[str, int]]:
    """Source 1 episodes grouped by ``decomposition:<dataset>``, and the skip counts."""
    from training.warmup.sources import decomposition_episodes as build

    built, skipped, _, _ = build(questions, searcher, passages, top_k)
    out: dict[str, list[Episode]] = {}
    for q, steps in built:
        src = f"decomposition:{q.dataset}"
        out.setdefault(src, []).append(Episode(q, steps, q.golden_answers[0], src))
    return out, dict(skipped)


def without_search(sources: dict[str, list[Episode]], share: float) -> dict[str, list[Episode]]:
    """Move ``share`` of every source's episodes, chosen by a hash of the question id (the same ones for every
    seed), to ``<source>:no_search`` with no steps: rendered, the agent answers from the question alone. The
    protocol's validator decides whether such a trajectory is well formed (its rows count as any other's)."""
    import hashlib

    if share <= 0:
        return sources
    out: dict[str, list[Episode]] = {}
    for src, episodes in sources.items():
        for ep in episodes:
            digest = hashlib.sha256(f"no_search|{ep.question.id}".encode()).digest()
            if int.from_bytes(digest[:8], "big") / 2**64 < share:
                out.setdefault(f"{src}:no_search", []).append(
                    Episode(ep.question, [], ep.answer, f"{src}:no_search", dict(ep.meta)))
            else:
                out.setdefault(src, []).append(ep)
    return out


def fireact_episodes(chats: Iterable[dict[str, Any]]) -> tuple[list[Episode], dict[str, int]]:
    """Source 2 episodes (successful FireAct chats; the single observation is the step's document)."""
    from training.warmup.sources import fireact_episode

    out, skipped = [], Counter()
    for idx, chat in enumerate(chats):
        ep = fireact_episode(chat["messages"])
        if isinstance(ep, str):
            skipped[ep] += 1
            continue
        question, steps, answer = ep
        q = Question(id=f"fireact-{idx}", question=question, golden_answers=[answer], dataset="hotpotqa")
        out.append(Episode(q, steps, answer, "fireact"))
    return out, dict(skipped)


def teacher_episodes(trajectories: Iterable[Any], min_f1: float = 0.8) -> list[Episode]:
    """Source 3 episodes from a teacher's rollouts (any protocol): its searches, documents and facts between
    them (the generated text after each document block), kept when F1 with the gold answer >= ``min_f1``."""
    from evaluation.metrics import f1_score

    out = []
    for t in trajectories:
        if t.final_answer is None or f1_score(t.final_answer, t.golden_answers) < min_f1:
            continue
        search_turns = [i for i, turn in enumerate(t.turns) if turn.query is not None]
        steps = []
        for j, i in enumerate(search_turns):
            nxt = t.turns[search_turns[j + 1]].generated if j + 1 < len(search_turns) else t.turns[-1].generated
            hits = [Hit(id=d, title=x.partition("\n")[0], text=x.partition("\n")[2] or x, score=s)
                    for d, x, s in zip(t.turns[i].doc_ids, t.turns[i].doc_texts, t.turns[i].scores, strict=False)]
            steps.append((t.turns[i].query, _plain(nxt), hits))
        q = Question(id=t.question_id, question=t.question, golden_answers=list(t.golden_answers), dataset=t.dataset)
        out.append(Episode(q, steps, t.final_answer, "teacher"))
    return out


def _plain(text: str) -> str:
    """Generated text without tags (a teacher's reasoning between searches, reused as the step's fact)."""
    import re

    return " ".join(re.sub(r"<[^>]{1,40}>|\\boxed\{[^}]*\}", " ", text).split())[:400] or OPENING


def build_protocol_warmup(protocol_name: str, sources: dict[str, list[Episode]], tokenizer: Any,
                          max_fact_words: int | None = None, **protocol_kwargs: Any,
                          ) -> tuple[list[dict[str, Any]], list[ProtocolWarmupStats]]:
    """Render every source's episodes in one protocol (``protocol_kwargs``: top_k, max_turns, template)."""
    protocol = load_protocol(protocol_name, **protocol_kwargs)
    rows, stats = [], []
    for source, episodes in sources.items():
        r, s = render_episodes(protocol, episodes, tokenizer, source, max_fact_words)
        rows, stats = rows + r, [*stats, s]
    return rows, stats
