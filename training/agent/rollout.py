"""The batched multi-turn search rollout engine and the span-tracked loss masks.

``run_rollouts`` drives any protocol (``training.protocols``) with any generator and any ``Searcher``:
1. every active trajectory generates its next step in one batched ``generate`` call (one call per distinct stop
   set; per-row token budgets = min(per-turn limit, what is left of the total budget));
2. the protocol reads each step and returns the query to search (or finishes the trajectory);
3. all queries of the step go to the retriever in ONE ``searcher.search(queries, k)`` call;
4. the protocol inserts the documents (its own format) and the loop resumes; finished ones drop out.

Continuation after an insertion reuses what the model has already seen when the generator keeps a prefix KV
cache (the transformers backend does: ``training.generation.kv_prefix``; vLLM has its own prefix caching), so only the
inserted documents are prefilled; the cache is reset at the start and end of each call, so it never outlives
the weights it was computed with. ``RolloutConfig.chunk`` rolls a large set out a chunk of questions at a time, so
that the cache, which is bounded, still holds each row's keys at its next turn. ``benchmarks/rollout.py`` measures
the cost against plain generation.

Training ids and masks (``token_mask``): every response piece is recorded as generated or inserted at insertion time,
generated pieces with the ids the model sampled. The response ids are built piece by piece: a generated piece
contributes its sampled ids (mask 1), an inserted piece its own tokenization (mask 0). Re-tokenizing the joined text
instead would merge characters across the boundary (the generated ``>`` of ``</search>`` and the inserted
``<result>`` become one ``><`` token) and train the model on ids it never sampled. A generated piece without sampled
ids (a protocol that re-renders the text, e.g. ExSearch's chat turns, or scripted warm-up text) is tokenized on its
own, still never merged with its neighbours. The prompt is tokenized alone (``prompt_token_ids``).
Caveat: the generator continues from the joined *text*, so the context it sampled in may tokenize a boundary
differently from the training context; the trained ids themselves are the sampled ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from infra import progress
from training.agent.config import RolloutConfig
from training.agent.records import Trajectory, Turn
from training.generation.base import SamplingParams, derive_seed
from training.protocols.base import AgentState, SearchProtocol, Segment, load_protocol

if TYPE_CHECKING:
    from evaluation.benchmarks import Question
    from retrieval.types import Hit, Searcher
    from training.generation.base import Generator

log = logging.getLogger(__name__)


def prompt_token_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt's ids, tokenized on its own (what training puts before ``token_mask``'s response ids)."""
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def sampled_ids(tokenizer: Any, seg: Segment) -> list[int] | None:
    """The sampled ids of a generated segment when they decode exactly to its text, else None."""
    if not seg.generated or not seg.token_ids:
        return None
    for cleanup in (False, None):  # vLLM detokenizes without clean-up; HF decode uses the tokenizer's default
        kw = {} if cleanup is None else {"clean_up_tokenization_spaces": cleanup}
        if tokenizer.decode(seg.token_ids, skip_special_tokens=False, **kw) == seg.text:
            return list(seg.token_ids)
    return None


def token_mask(tokenizer: Any, prompt: str, segments: list[Segment]) -> tuple[list[int], list[int], int]:
    """Response training ids, loss mask and the number of generated segments tokenized from text.

    Built segment by segment (see the module docstring): a generated segment gives its sampled ids when they
    decode exactly to its text, otherwise its text tokenized alone (counted in the third value); an inserted segment
    gives its text tokenized alone. Mask 1 on generated ids, 0 on inserted ones. ``prompt`` is unused here (the
    prompt is tokenized on its own by ``prompt_token_ids``) and kept for a stable signature.
    """
    del prompt
    ids: list[int] = []
    mask: list[int] = []
    retokenized = 0
    for seg in segments:
        part = sampled_ids(tokenizer, seg)
        if part is None:
            part = list(tokenizer(seg.text, add_special_tokens=False)["input_ids"])
            retokenized += int(seg.generated)
        ids += part
        mask += [int(seg.generated)] * len(part)
    return ids, mask, retokenized


def generated_spans(segments: list[Segment]) -> list[tuple[int, int]]:
    """Character spans [start, end) of generated segments within the response."""
    out, pos = [], 0
    for seg in segments:
        if seg.generated:
            out.append((pos, pos + len(seg.text)))
        pos += len(seg.text)
    return out


def step_cap(cfg: RolloutConfig, protocol: SearchProtocol) -> int:
    """Token cap of one generation step: the config's, else the protocol's, else the whole response budget."""
    return cfg.max_tokens_per_turn or protocol.default_max_tokens_per_turn or cfg.max_total_tokens


def _generate_step(
    states: list[AgentState], protocol: SearchProtocol, generator: Generator, cfg: RolloutConfig, step: int
) -> list[Any]:
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, s in enumerate(states):
        groups.setdefault(protocol.stop_strings(s), []).append(i)
    # greedy candidates are identical, so best-of-n only applies when sampling
    best_of = (cfg.best_of or protocol.default_best_of) if cfg.temperature > 0 else 1
    per_turn = step_cap(cfg, protocol)
    out: list[Any] = [None] * len(states)
    for stops, idx in groups.items():
        sampling = SamplingParams(
            temperature=cfg.temperature, top_p=cfg.top_p, n=1, best_of=best_of if best_of > 1 else None,
            seed=None if cfg.seed is None else derive_seed(cfg.seed, step), max_tokens=per_turn, stop=list(stops),
        )
        budgets = [max(1, min(per_turn, cfg.max_total_tokens - states[i].generated_tokens)) for i in idx]
        comps = generator.generate([protocol.generation_prompt(states[i]) for i in idx], sampling, budgets)
        for i, c in zip(idx, comps, strict=True):
            out[i] = c
    return out


def _search(searcher: Searcher, queries: list[str], k: int) -> dict[str, list[Hit]]:
    unique = list(dict.fromkeys(queries))
    if not unique:
        return {}
    results = searcher.search(unique, k)
    return dict(zip(unique, results, strict=True))


def run_rollouts(
    questions: list[Question],
    protocol: SearchProtocol | str,
    generator: Generator,
    searcher: Searcher,
    cfg: RolloutConfig | None = None,
    tokenizer: Any | None = None,
    prepare: Callable[[list[AgentState]], None] | None = None,
) -> list[Trajectory]:
    """Roll out ``cfg.n`` trajectories per question, batched across questions (see the module docstring).

    Args:
        questions: the questions.
        protocol: a protocol instance or preset name (``research``...).
        generator: any ``Generator``.
        searcher: any ``retrieval.types.Searcher`` (in-process index or HTTP client).
        cfg: rollout settings.
        tokenizer: tokenizer for chat templates and masks (default: ``generator.tokenizer`` when it has one).
        prepare: called with the new states before their first generation step, once per ``cfg.chunk`` (e.g. to
            insert a scripted first search: ``training.rl.search_value``); it may record steps through the
            protocol's own methods.

    Returns:
        Trajectories in question order, ``cfg.n`` consecutive samples per question.
    """
    cfg = cfg or RolloutConfig()
    if isinstance(protocol, str):
        protocol = load_protocol(protocol, top_k=cfg.top_k, max_turns=cfg.max_turns)
    tok = tokenizer if tokenizer is not None else getattr(generator, "tokenizer", None)
    reset = getattr(generator, "reset_prefix_cache", None)  # a KV prefix cache never outlives these weights
    multi_turn = getattr(generator, "set_multi_turn", None)  # turns are continued: the prefix cache's case
    if multi_turn is not None:
        multi_turn(True)
    elif reset is not None:
        reset()
    try:
        n = len(questions) * cfg.n
        size = cfg.chunk or len(questions) or 1
        out: list[Trajectory] = []
        # progress in generated tokens against the budget (a finished trajectory counts its whole budget): steps are
        # synchronous across trajectories, so finished-trajectory counts would sit at 0 until the last step
        with progress.track(f"rollouts {protocol.name} ({n} trajectories)", total=n * cfg.max_total_tokens,
                            unit="token") as bar:
            for start in range(0, len(questions), size):  # the cache is not reset between chunks: the shared
                offset = len(out) * cfg.max_total_tokens  # template stays; the least recently used rows go
                out += _rollout_loop(questions[start:start + size], protocol, generator, searcher, cfg, tok, bar,
                                     prepare, offset)
            return out
    finally:
        if multi_turn is not None:
            multi_turn(False)
        elif reset is not None:
            reset()


def _rollout_loop(
    questions: list[Question], protocol: SearchProtocol, generator: Generator, searcher: Searcher,
    cfg: RolloutConfig, tok: Any | None, bar: progress.Tracker | None = None,
    prepare: Callable[[list[AgentState]], None] | None = None, done_before: int = 0,
) -> list[Trajectory]:
    t0 = time.perf_counter()
    states = [protocol.start(q, tok, sample=j) for q in questions for j in range(cfg.n)]
    if prepare is not None:
        prepare(states)
    timing = [{"generate": 0.0, "search": 0.0, "total": 0.0} for _ in states]
    step = 0
    while True:
        for s in states:
            if not s.finished and s.generated_tokens >= cfg.max_total_tokens:
                s.finish("length")
            elif not s.finished and s.n_passes >= cfg.max_passes:
                s.finish("max_turns")
        active = [i for i, s in enumerate(states) if not s.finished]
        if bar is not None:
            bar.update(done_before + sum(cfg.max_total_tokens if s.finished
                                         else min(s.generated_tokens, cfg.max_total_tokens) for s in states))
        if not active:
            break
        tg = time.perf_counter()
        comps = _generate_step([states[i] for i in active], protocol, generator, cfg, step)
        dt_gen = time.perf_counter() - tg
        pending: list[tuple[int, str]] = []
        for i, comp in zip(active, comps, strict=True):
            s = states[i]
            timing[i]["generate"] += dt_gen
            s.generated_tokens += len(comp.token_ids)
            if comp.finish_reason == "eos" and protocol.keep_eos and generator.eos_token:
                comp.text += generator.eos_token  # the sampled EOS id was dropped from the ids with its text
                if tok is not None and tok.eos_token == generator.eos_token and tok.eos_token_id is not None:
                    comp.token_ids = [*comp.token_ids, tok.eos_token_id]
            query = protocol.on_completion(s, comp)
            if query is not None:
                pending.append((i, query))
        ts = time.perf_counter()
        hits = _search(searcher, [q for _, q in pending if q or protocol.search_empty_queries], protocol.top_k)
        dt_search = time.perf_counter() - ts
        for i, query in pending:
            timing[i]["search"] += dt_search
            protocol.on_results(states[i], query, hits.get(query, []))
        for i in active:
            if states[i].finished:
                timing[i]["total"] = time.perf_counter() - t0
        step += 1
    end = time.perf_counter() - t0
    for t in timing:
        t["total"] = t["total"] or end
    return [to_record(s, protocol, tok, t) for s, t in zip(states, timing, strict=True)]


def to_record(state: AgentState, protocol: SearchProtocol, tokenizer: Any | None, timing: dict) -> Trajectory:
    """A finished rollout state as a ``Trajectory`` record (token ids and loss mask when ``tokenizer`` is given);
    also used by the SmartSearch verl agent loop."""
    ids: list[int] = []
    mask: list[int] = []
    if tokenizer is not None:
        ids, mask, retokenized = token_mask(tokenizer, state.prompt, state.segments)
        if retokenized:
            log.debug("%d generated segments of %s have no exact sampled ids (tokenized from text)", retokenized,
                      state.question.id)
    check = protocol.validate(state.response)
    q = state.question
    return Trajectory(
        question_id=q.id, question=q.question, golden_answers=list(q.golden_answers), dataset=q.dataset,
        sample=state.sample, protocol=protocol.name, prompt=state.prompt, response=state.response,
        turns=[Turn(**vars(t)) for t in state.turns], final_answer=protocol.final_answer(state),
        finish_reason=state.finish_reason or "length", n_searches=state.n_searches,
        generated_spans=generated_spans(state.segments), token_ids=ids, loss_mask=mask,
        format_ok=check.ok, format_reasons=check.reasons, timings=timing,
    )
