"""Query refinement and regeneration: refine a low-quality round's query, cut the trajectory there, replace the
query, and let the current policy continue from that prefix through our rollout engine.

- :func:`refine_rounds`: for each low-quality round, the refiner (same endpoint kind as the judge) sees the
  question, the process up to and including that round's result (the judged prefix, as the seed's
  ``query_refinement.py`` passes it; guideline 1 tells it not to rely on that result) and the issues (the judge's
  explanation plus the seed's redundancy sentence when it applies) and answers ``<search> new query </search>``
  (the query may span lines; the request stops at ``</search>`` as the seed's does).
  ``refiner.kind: rule`` (:func:`rule_refinements`) is a deterministic gold-informed stand-in, NOT the seed's
  refiner: the title of the first gold supporting paragraph not retrieved before the round, else the question.
  A reply that copies the template's format example or repeats the round's query is a failed refinement with its reason
  (:func:`refinement_error`; our addition: the seed regenerates from whatever the refiner wrote).
- :func:`refined_prefix` (the seed's ``transfer_regenerate.py``): the trajectory's turns before the round are kept
  as they were (generated text + inserted results), the round's own step is kept up to its last
  ``<search>...</search>`` whose content is replaced; its ``<result>`` and everything after it are cut.
- :func:`continue_from_prefixes`: the prefixes become rollout states (:class:`PrefixedProtocol`); the round's
  step is replayed as the first "generation" (:class:`ForcedFirstStep`), so the engine itself executes the new
  query against the retriever (never through model-built code), inserts the result and continues with the policy.
  Masks are rebuilt by the engine from the segments: the refined step counts as generated, results as inserted.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training.generation.base import Completion, SamplingParams
from training.protocols.base import AgentState, SearchProtocol, Segment, TurnState
from training.smartsearch.config import RefinerSpec
from training.smartsearch.endpoint import EndpointClient
from training.smartsearch.judge import GoldSupport, RoundVerdict, judge_text, load_template

log = logging.getLogger(__name__)

REFINE_TEMPLATE = """You are a query-refine assistant. A search agent is answering a user question step by step. \
One of its search queries was judged low quality. Write a better query for that round.

User question: {question}
Search process up to and including the low-quality query's round (the last <search> and its <result>):
{process}

Issues found with the last query:
{issues}

Guidelines:
1. The new query replaces the last round's query, so do not rely on the last round's <result> when writing it.
2. If the query intent is unreasonable, serve a more necessary and actionable intent instead.
3. The new query may be a full question or key phrases; add or remove information as needed.

Reply in exactly this format, your query between the search tags:
<search> ... </search><explanation> ... </explanation>"""

REDUNDANCY_ISSUE = ("The retrieved result of this query largely repeats documents already retrieved in earlier "
                    "rounds, so the query brings little new information.")

_SEARCH = re.compile(r"<search>(.*?)(?:</search>|<|\Z)", re.DOTALL)


class Refinement(BaseModel):
    """One refined round (an artifact row)."""

    model_config = ConfigDict(frozen=True)

    question_id: str = Field(description="Question id.")
    sample: int = Field(description="Sample index of the original trajectory.")
    round: int = Field(description="0-based search round refined.")
    original_query: str = Field(description="The round's query.")
    refined_query: str | None = Field(description="The refiner's query (None = no usable answer).")
    issues: str = Field(description="Issues given to the refiner.")
    raw: str = Field(default="", description="The refiner's raw reply.")
    error: str | None = Field(default=None, description="Why there is no refined query.")


def parse_refined_query(text: str) -> str | None:
    """The first ``<search>`` query: its text up to ``</search>``, the next tag or the end of the reply (a reply cut
    by the token limit or by the ``</search>`` stop still counts; newlines inside the query become spaces, as the
    seed's ``<search>(.*?)</search>`` with DOTALL reads them); None when there is no ``<search>`` or it is empty."""
    match = _SEARCH.search(text)
    if match is None:
        return None
    query = " ".join(match.group(1).split())
    return query or None


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def template_placeholders(template: str) -> set[str]:
    """Normalised texts between ``<search>`` and ``</search>`` in a refiner template (its format example)."""
    return {_norm(m) for m in re.findall(r"<search>(.*?)</search>", template, flags=re.S)}


def refinement_error(query: str, original: str, placeholders: set[str]) -> str | None:
    """Why a parsed refined query is not a refinement, or None when it is one.

    A small refiner copies the template's format example (session 9: 3 of 7 SmolLM2-135M replies were "the new
    query" under the old ``<search> the new query </search>`` line) or returns the round's own query (2 of 7); both
    would regenerate from an unrefined or meaningless prefix, so they count as failed refinements, with the reason.
    """
    q = _norm(query)
    if not any(c.isalnum() for c in q):
        return "refined query has no words"
    if q in placeholders or q in {"the new query", "new query", "your query", "query"}:
        return f"refined query {query!r} copies the template's format example"
    if q == _norm(original):
        return "refined query is the round's original query, unchanged"
    return None


def search_turns(traj: Any) -> list[int]:
    """Indices of the turns that ran a search (one per search round, in order)."""
    return [i for i, t in enumerate(traj.turns) if t.query is not None]


def replace_last_query(step: str, query: str) -> str:
    """``step`` cut after its last ``</search>``, with that search's content replaced by `` query ``."""
    start = step.rfind("<search>")
    end = step.find("</search>", start)
    if start < 0 or end < 0:
        raise ValueError("the round's step has no <search>...</search> to replace")
    return step[: start + len("<search>")] + f" {query} " + "</search>"


def process_with_result(traj: Any, round_idx: int) -> str:
    """The judged text up to and including round ``round_idx``'s result, what the refiner sees (the seed's
    ``context``: the judge's cumulative prefix)."""
    t = search_turns(traj)[round_idx]
    return judge_text("".join(turn.generated + turn.inserted for turn in traj.turns[: t + 1]))


def issues_text(verdict: RoundVerdict, max_redundancy: int) -> str:
    """The issues of a round: the judge's explanation (when it said 0) and the redundancy sentence."""
    parts = []
    if verdict.verdict == 0:
        parts.append(verdict.explanation or "The query intent is not useful or its result does not answer it.")
    if verdict.redundancy > max_redundancy:
        parts.append(REDUNDANCY_ISSUE)
    return "\n".join(parts) or "The query was judged low quality."


def rule_query(traj: Any, round_idx: int, support: GoldSupport) -> str:
    """The rule refiner's query: the first gold supporting title whose paragraph was not retrieved before the
    round, else the question itself."""
    t = search_turns(traj)[round_idx]
    seen = {d for turn in traj.turns[:t] for d in turn.doc_ids}
    ids, titles = support.doc_ids(traj.question_id, traj.question), support.titles(traj.question_id, traj.question)
    for i, title in enumerate(titles):
        if i >= len(ids) or ids[i] not in seen:
            return title
    return traj.question


def rule_refinements(trajectories: Sequence[Any], verdicts: Sequence[Sequence[RoundVerdict]], support: GoldSupport,
                     max_redundancy: int = 1) -> list[Refinement]:
    """``refiner.kind: rule``: a deterministic, gold-informed stand-in for the seed's LLM refiner (module
    docstring); the same checks as model refinements (an unchanged query is a failed refinement)."""
    out = []
    for traj, rounds in zip(trajectories, verdicts, strict=True):
        for v in rounds:
            if not (v.low_quality and v.round < len(search_turns(traj))):
                continue
            original = traj.turns[search_turns(traj)[v.round]].query or ""
            query: str | None = rule_query(traj, v.round, support)
            error = refinement_error(query or "", original, set())
            out.append(Refinement(question_id=traj.question_id, sample=traj.sample, round=v.round,
                                  original_query=original, refined_query=None if error else query,
                                  issues=issues_text(v, max_redundancy), raw=f"<search> {query} </search>",
                                  error=error))
    return out


def refine_rounds(client: EndpointClient | None, spec: RefinerSpec, trajectories: Sequence[Any],
                  verdicts: Sequence[Sequence[RoundVerdict]], max_redundancy: int = 1,
                  support: GoldSupport | None = None) -> list[Refinement]:
    """Refine every low-quality round of every trajectory (one batched round of calls; ``kind: rule``: no call)."""
    if spec.kind == "rule":
        return rule_refinements(trajectories, verdicts, support or GoldSupport(), max_redundancy)
    if client is None:
        raise ValueError("refiner.kind=model needs the endpoint client (endpoint.base_url or endpoint.serve_model)")
    template = load_template(spec.template_file, REFINE_TEMPLATE, ("question", "process", "issues"))
    jobs: list[tuple[Any, RoundVerdict, str]] = []
    for traj, rounds in zip(trajectories, verdicts, strict=True):
        for v in rounds:
            if v.low_quality and v.round < len(search_turns(traj)):
                jobs.append((traj, v, issues_text(v, max_redundancy)))
    prompts = [template.format(question=t.question, process=process_with_result(t, v.round), issues=iss)
               for t, v, iss in jobs]
    replies = client.complete(prompts, spec.response_prefix, spec.temperature, spec.max_tokens, stop=["</search>"])
    placeholders = template_placeholders(template)
    out = []
    for (traj, v, iss), reply in zip(jobs, replies, strict=True):
        raw = spec.response_prefix + reply.text
        original = traj.turns[search_turns(traj)[v.round]].query or ""
        query = parse_refined_query(raw) if reply.error is None else None
        error = reply.error or (None if query else "no <search> query in the reply")
        if query is not None and error is None:
            error = refinement_error(query, original, placeholders)
            query = None if error else query
        out.append(Refinement(question_id=traj.question_id, sample=traj.sample, round=v.round,
                              original_query=original, refined_query=query, issues=iss, raw=raw, error=error))
    return out


def unpack_refiner(refiner: Sequence[Any]) -> tuple[Any, RefinerSpec, GoldSupport | None]:
    """``(client, spec)`` or ``(client, spec, support)`` as the stages pass the refiner."""
    client, spec, *rest = refiner
    return client, spec, (rest[0] if rest else None)


@dataclass
class Prefix:
    """A refined prefix: the turns kept before the round, and the round's step with the new query."""

    question: Any
    turns: list[TurnState]
    step: str
    round: int
    original_sample: int
    generated_tokens: int


def refined_prefix(traj: Any, round_idx: int, query: str) -> Prefix:
    """Cut ``traj`` at search round ``round_idx``: earlier turns kept, that round's query replaced, result cut."""
    from evaluation.benchmarks import Question

    t = search_turns(traj)[round_idx]
    kept = [TurnState(generated=x.generated, query=x.query, doc_ids=list(x.doc_ids), doc_texts=list(x.doc_texts),
                      scores=list(x.scores), inserted=x.inserted, finish_reason=x.finish_reason, stop=x.stop,
                      tokens=x.tokens) for x in traj.turns[:t]]
    q = Question(id=traj.question_id, question=traj.question, golden_answers=list(traj.golden_answers),
                 dataset=traj.dataset)
    return Prefix(question=q, turns=kept, step=replace_last_query(traj.turns[t].generated, query), round=round_idx,
                  original_sample=traj.sample, generated_tokens=sum(x.tokens for x in kept))


def prefix_text(prefix: Prefix) -> str:
    """The response text of a refined prefix (kept turns + the refined step)."""
    return "".join(t.generated + t.inserted for t in prefix.turns) + prefix.step


def original_prefix_text(traj: Any, round_idx: int) -> str:
    """The original response up to and including round ``round_idx``'s ``</search>``."""
    t = search_turns(traj)[round_idx]
    step = traj.turns[t].generated
    return "".join(x.generated + x.inserted for x in traj.turns[:t]) + step[: step.rfind("</search>") + 9]


def length_ok(tokenizer: Any, traj: Any, prefix: Prefix, max_diff: int) -> bool:
    """The seed's branch check: keep a refined prefix unless its token length differs by ``max_diff`` or more."""
    a = len(tokenizer(traj.prompt + original_prefix_text(traj, prefix.round), add_special_tokens=False)["input_ids"])
    b = len(tokenizer(traj.prompt + prefix_text(prefix), add_special_tokens=False)["input_ids"])
    return abs(a - b) < max_diff


def keep_refined(client: EndpointClient | None, spec: RefinerSpec, traj: Any, verdicts: Sequence[RoundVerdict],
                 tokenizer: Any, max_length_diff: int = 50, max_redundancy: int = 1,
                 support: GoldSupport | None = None) -> tuple[list[Prefix], dict[str, int], list[Refinement]]:
    """One on-policy trajectory's refined prefixes that pass the seed's length check, in round order.

    Returns (kept prefixes, counts ``refined`` / ``refine_failed`` / ``skipped_length`` / ``kept``, refinements).
    """
    refinements = refine_rounds(client, spec, [traj], [verdicts], max_redundancy, support)
    kept: list[Prefix] = []
    counts = {"refined": 0, "refine_failed": 0, "skipped_length": 0, "kept": 0}
    for r in refinements:
        if r.refined_query is None:
            counts["refine_failed"] += 1
            continue
        counts["refined"] += 1
        prefix = refined_prefix(traj, r.round, r.refined_query)
        if length_ok(tokenizer, traj, prefix, max_length_diff):
            kept.append(prefix)
        else:
            counts["skipped_length"] += 1
    counts["kept"] = len(kept)
    return kept, counts, refinements


class PrefixedProtocol:
    """A protocol whose new states start from given prefixes (keyed by question id and sample index).

    Everything else is the wrapped protocol's behaviour (stop strings, insertion, validation, masks).
    """

    def __init__(self, inner: SearchProtocol, prefixes: dict[tuple[str, int], Prefix]) -> None:
        self.inner, self.prefixes = inner, prefixes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def start(self, question: Any, tokenizer: Any | None = None, sample: int = 0) -> AgentState:
        """The wrapped protocol's start state, pre-filled with the prefix's turns and segments."""
        state = self.inner.start(question, tokenizer, sample)
        prefix = self.prefixes.get((question.id, sample))
        if prefix is None:
            return state
        for turn in prefix.turns:
            state.add(turn.generated, generated=True)
            state.add(turn.inserted, generated=False)
            state.turns.append(TurnState(**{**vars(turn)}))
        state.n_passes = len(prefix.turns)
        state.n_searches = sum(1 for t in prefix.turns if t.query is not None)
        state.generated_tokens = prefix.generated_tokens
        return state


class ForcedFirstStep:
    """A generator wrapper that answers the first step of each prefixed state with its refined step text.

    Prompts are matched by text (prompt + prefix response); each forced text is used as many times as it was
    registered, then the wrapped policy generates as usual.
    """

    def __init__(self, inner: Any, forced: dict[str, list[str]]) -> None:
        self.inner, self.forced = inner, {k: list(v) for k, v in forced.items()}
        self.eos_token = getattr(inner, "eos_token", None)
        self.tokenizer = getattr(inner, "tokenizer", None)

    def reset_prefix_cache(self) -> None:
        """Forward to the wrapped generator's KV prefix cache reset, when it has one."""
        reset = getattr(self.inner, "reset_prefix_cache", None)
        if reset is not None:
            reset()

    def set_multi_turn(self, on: bool) -> None:
        """Forward ``run_rollouts``' multi-turn bracket to the wrapped generator, when it takes one."""
        multi_turn = getattr(self.inner, "set_multi_turn", None)
        if multi_turn is not None:
            multi_turn(on)
        else:
            self.reset_prefix_cache()

    def generate(self, prompts: list[str], sampling: SamplingParams,
                 max_tokens: list[int] | None = None) -> list[Completion]:
        """Forced completions for registered prompts; the rest from the wrapped generator (one batched call)."""
        out: list[Completion | None] = [None] * len(prompts)
        rest = []
        for i, p in enumerate(prompts):
            queue = self.forced.get(p)
            if queue:
                text = queue.pop(0)
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] if self.tokenizer else []
                out[i] = Completion(text=text, token_ids=ids, finish_reason="stop", stop="</search>")
            else:
                rest.append(i)
        if rest:
            budgets = [max_tokens[i] for i in rest] if max_tokens else None
            for i, c in zip(rest, self.inner.generate([prompts[i] for i in rest], sampling, budgets), strict=True):
                out[i] = c
        return [c for c in out if c is not None]


def continue_from_prefixes(prefixes: Sequence[Prefix], protocol: SearchProtocol, generator: Any, searcher: Any,
                           rollout_cfg: Any, tokenizer: Any, first_sample: int = 1000) -> list[Any]:
    """Continue every prefix with the policy (one batched rollout); trajectories in prefix order.

    Each continuation gets sample index ``first_sample + i`` so it can be told from the on-policy samples.
    """
    from training.agent.rollout import run_rollouts

    if not prefixes:
        return []
    # the engine numbers samples 0..n-1 per question, so each prefix is rolled out as its own one-row "question"
    # (id + NUL + sample index); the id and sample index are restored afterwards.
    keys = [f"{p.question.id}\x00{first_sample + i}" for i, p in enumerate(prefixes)]
    proxy = PrefixedProtocol(protocol, {(k, 0): p for k, p in zip(keys, prefixes, strict=True)})
    questions = [p.question.model_copy(update={"id": k}) for k, p in zip(keys, prefixes, strict=True)]
    forced: dict[str, list[str]] = {}
    for q, p in zip(questions, prefixes, strict=True):
        forced.setdefault(protocol.generation_prompt(proxy.start(q, tokenizer, 0)), []).append(p.step)
    trajs = run_rollouts(questions, proxy, ForcedFirstStep(generator, forced), searcher,
                         rollout_cfg.model_copy(update={"n": 1}), tokenizer)
    out = []
    for t in trajs:
        qid, _, sample = t.question_id.partition("\x00")
        out.append(t.model_copy(update={"question_id": qid, "sample": int(sample)}))
    return out


def segments_of_prefix(prefix: Prefix) -> list[Segment]:
    """Generated/inserted segments of a refined prefix (the step counts as generated)."""
    segs = []
    for t in prefix.turns:
        segs += [Segment(t.generated, True)] + ([Segment(t.inserted, False)] if t.inserted else [])
    return [*segs, Segment(prefix.step, True)]
