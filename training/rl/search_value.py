"""What search is worth to a policy: one checkpoint evaluated greedily on the held-out questions under conditions
that differ only in the documents it is given.

Conditions (``parse_condition`` names):

- ``closed``: closed-book. The policy's first step is scripted as a search for the question itself, and the
  protocol's result block is inserted **empty** (Search-R1: ``<information></information>``); no further search is
  executed. The same scripted prefix as the document conditions, so a paired difference against it is exactly what
  the documents add.
- ``own``: the normal greedy held-out rollout (the policy's own searches, the preset's limits): what
  ``training.rl.heldout.evaluate_heldout`` records as ``heldout_start.jsonl``.
- ``<retriever>@k`` (``bm25@3``, ``dense@1``): the scripted first search is the question itself; the top-``k``
  documents of that retriever are inserted in the protocol's own result block.
- ``gold``: the question's supporting paragraphs (``supporting_doc_ids``, corpus order of the row) inserted in the
  same block.

The scripted first step is the text the warm-up SFT taught for a first search (the protocol's
``warmup_script``: e.g. ``<think> I need to search for this. </think>\\n<search> {question} </search>`` for Search-R1),
recorded through the protocol's own ``on_completion`` / ``on_results``, so prompt, tags and document format are
byte-identical to a rollout. It is not counted in the generation budget. After it the policy continues greedily
with exactly one more generation pass, in which a search is not executed (the protocol's ``max_turns`` is set so the
next pass is the last): it must answer from what it was given. ``extra_search`` marks rows where it tried to search
again instead of answering (its last step holds a search request: not executed, no answer, a format failure).

Rows: the held-out evidence fields (``training.rl.heldout.heldout_rows``: ``reward``, ``f1``, ``em``, ``cover_em``,
``format_ok``, ``n_searches``...) plus ``condition``, ``docs`` (ids inserted by the scripted search),
``extra_search`` and ``continuation`` (the policy's text after the scripted search). ``n_searches`` counts result
blocks that held documents (0 for ``closed``).
:func:`summarize` gives per-condition means with 95% bootstrap intervals and the paired difference against the
baseline condition (``evaluation.paired``). :func:`run_search_value` does it all for an RL preset's warm-up policy
(``searchloop run search-value``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from infra import artifacts
from infra.config import StrictModel
from infra.errors import ConfigError, DataError

log = logging.getLogger(__name__)

FIELDS = ("f1", "em", "cover_em", "format_ok", "n_searches", "reward")
DEFAULT_CONDITIONS = ("closed", "own", "bm25@1", "bm25@3", "bm25@5", "gold")
_RETRIEVER_AT_K = re.compile(r"^([a-z][a-z0-9_]*)@([1-9][0-9]*)$")


class Condition(StrictModel):
    """One evaluation condition (see the module docstring)."""

    name: str = Field(description="Label, e.g. closed, own, bm25@3, gold.")
    kind: Literal["closed", "own", "query", "gold"] = Field(description="What the scripted first search inserts.")
    retriever: str = Field(default="bm25", description="Searcher key for kind 'query' (and 'own').")
    k: int = Field(default=0, ge=0, description="Documents inserted for kind 'query'.")


def parse_condition(text: str) -> Condition:
    """``closed``, ``own``, ``gold`` or ``<retriever>@<k>`` (``bm25@3``).

    Raises:
        ConfigError: any other text, naming the accepted forms.
    """
    name = text.strip()
    if name in ("closed", "own", "gold"):
        return Condition(name=name, kind=name)  # type: ignore[arg-type]
    m = _RETRIEVER_AT_K.match(name)
    if m is None:
        raise ConfigError(f"unknown search-value condition {text!r}; use closed, own, gold or <retriever>@<k> "
                          "such as bm25@3 or dense@1")
    return Condition(name=name, kind="query", retriever=m.group(1), k=int(m.group(2)))


def forced_first_step(protocol_name: str, query: str) -> tuple[str, str | None]:
    """The scripted first search step of ``protocol_name`` (the warm-up's text) and the stop string ending it."""
    from training.protocols.base import load_protocol

    try:
        text, stop, _ = load_protocol(protocol_name).warmup_script([query], [], "")[0]
    except NotImplementedError as exc:
        raise ConfigError(f"no scripted first search for protocol {protocol_name!r}: {exc}") from exc
    return text, stop


def _hits_from_passages(ids: Sequence[str], passages: Mapping[str, Any]) -> list[Any]:
    from retrieval.types import Hit

    missing = [i for i in ids if i not in passages]
    if missing:
        raise DataError(f"supporting doc ids {missing[:5]} are not in the retriever's corpus; evaluate with the corpus "
                        "that holds the held-out paragraphs (eval.corpus, e.g. shared:corpus/multihop_wiki.jsonl)")
    return [Hit(id=p.id, title=p.title, text=p.text, score=1.0) for p in (passages[i] for i in ids)]


def last_pass_turns(protocol: Any, state: Any) -> int:
    """The ``max_turns`` that makes the next generation pass of ``state`` the protocol's last (no search after it)."""
    for m in range(1, state.n_passes + 3):
        protocol.max_turns = m
        if protocol.last_pass(state):
            return m
    raise ConfigError(f"protocol {protocol.name!r} has no turn limit that ends after the next pass")


def force_search(states: list[Any], protocol: Any, tokenizer: Any | None, condition: Condition,
                 searcher: Any | None, passages: Mapping[str, Any]) -> None:
    """Record the scripted first search (the question as the query) in every state and insert ``condition``'s
    documents in the protocol's result block; then limit the protocol to one more (search-free) pass.

    Raises:
        ConfigError: the protocol does not read the scripted step as a search of the question.
    """
    from training.generation.base import Completion

    protocol.max_turns = None  # the scripted step itself must be executed as a search
    queries = []
    for s in states:
        text, stop = forced_first_step(protocol.name, s.question.question)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) if tokenizer is not None else []
        query = protocol.on_completion(s, Completion(text=text, token_ids=ids, finish_reason="stop", stop=stop))
        if query is None or query.strip() != s.question.question.strip():
            raise ConfigError(f"protocol {protocol.name!r} read the scripted first step as {query!r}, not a search "
                              "of the question")
        queries.append(query)
    if condition.kind == "closed":
        hits: list[list[Any]] = [[] for _ in states]
    elif condition.kind == "gold":
        hits = [_hits_from_passages(s.question.supporting_doc_ids, passages) for s in states]
    elif condition.kind == "query":
        if searcher is None:
            raise ConfigError(f"condition {condition.name}: no searcher {condition.retriever!r}")
        unique = list(dict.fromkeys(queries))
        found = dict(zip(unique, searcher.search(unique, condition.k), strict=True))
        hits = [list(found[q])[: condition.k] for q in queries]
    else:
        raise ConfigError(f"condition kind {condition.kind!r} inserts no scripted search")
    for s, q, h in zip(states, queries, hits, strict=True):
        protocol.on_results(s, q, h)
        s.extra["search_value"] = {"condition": condition.name, "docs": [x.id for x in h]}
    if states:
        turns = last_pass_turns(protocol, states[0])
        protocol.max_turns = turns


def evaluate_condition(
    questions: Sequence[Any], protocol_name: str, protocol_kwargs: Mapping[str, Any], generator: Any,
    rollout: Any, condition: Condition, searchers: Mapping[str, Any], passages: Mapping[str, Any] | None = None,
    tokenizer: Any | None = None,
) -> list[Any]:
    """Greedy trajectories of ``generator`` on ``questions`` under ``condition``.

    Args:
        questions: held-out ``Question`` rows (``supporting_doc_ids`` for ``gold``).
        protocol_name: the policy's protocol.
        protocol_kwargs: ``top_k`` / ``max_turns`` / ``template`` of the normal rollout (``own``); the scripted
            conditions take the template only.
        generator: any ``Generator``.
        rollout: ``RolloutConfig`` (greedy; its budget applies to the policy's own tokens).
        condition: what to insert.
        searchers: retriever name -> ``Searcher`` (``bm25`` is the own searches' retriever).
        passages: corpus id -> passage, for ``gold``.
        tokenizer: chat template / token ids (default: the generator's).

    Raises:
        ConfigError: sampling settings, or a missing searcher.
    """
    from training.agent.rollout import run_rollouts
    from training.protocols.base import load_protocol

    if rollout.temperature != 0:
        raise ConfigError(f"search-value evaluation must be greedy (temperature 0), got {rollout.temperature}")
    tok = tokenizer if tokenizer is not None else getattr(generator, "tokenizer", None)
    cfg = rollout.model_copy(update={"n": 1})
    if condition.kind == "own":
        if condition.retriever not in searchers:
            raise ConfigError(f"condition own: no searcher {condition.retriever!r} (have {sorted(searchers)})")
        protocol = load_protocol(protocol_name, **protocol_kwargs)
        return run_rollouts(list(questions), protocol, generator, searchers[condition.retriever], cfg, tok)
    if condition.kind == "query" and condition.retriever not in searchers:
        raise ConfigError(f"condition {condition.name}: no searcher {condition.retriever!r} (have "
                          f"{sorted(searchers)}); pass a dense index for dense@k")
    protocol = load_protocol(protocol_name, top_k=max(condition.k, 1),
                             template=protocol_kwargs.get("template", "instruct"))
    searcher = searchers.get(condition.retriever)

    def prepare(states: list[Any]) -> None:
        force_search(states, protocol, tok, condition, searcher, passages or {})

    return run_rollouts(list(questions), protocol, generator, _NoSearch(), cfg, tok, prepare=prepare)


class _NoSearch:
    """The searcher of the scripted conditions' continuation: the last pass executes no search, so a call is a bug."""

    name = "none"

    def search(self, queries: list[str], k: int) -> list[list[Any]]:
        raise ConfigError(f"a search-value condition executed a search after the scripted one ({queries[:2]})")


def condition_rows(condition: Condition, trajectories: Sequence[Any], rows: Sequence[dict[str, Any]],
                   ) -> list[dict[str, Any]]:
    """Evidence rows of one condition: ``rows`` (one per trajectory) plus ``condition``, ``docs``,
    ``extra_search``; ``n_searches`` counts result blocks that held documents."""
    from training.protocols.base import load_protocol

    out = []
    for t, r in zip(trajectories, rows, strict=True):
        scripted = condition.kind != "own" and len(t.turns) > 1
        docs = list(t.turns[0].doc_ids) if condition.kind != "own" and t.turns else []
        n = t.n_searches - (1 if condition.kind == "closed" else 0)
        again = scripted and load_protocol(t.protocol).extract_query(t.turns[-1].generated) is not None
        out.append({**r, "condition": condition.name, "n_searches": n, "docs": docs, "extra_search": again,
                    "continuation": t.turns[-1].generated if scripted else None})
    return out


def _mean_interval(values: Sequence[float], confidence: float, n_resamples: int) -> tuple[float, float, float]:
    from evaluation.paired import paired_bootstrap

    d = paired_bootstrap([0.0] * len(values), values, confidence=confidence, n_resamples=n_resamples)
    return d.diff, d.low, d.high


def summarize(rows: Mapping[str, Sequence[dict[str, Any]]], baseline: str = "closed", fields: Sequence[str] = FIELDS,
              confidence: float = 0.95, n_resamples: int = 10000) -> dict[str, Any]:
    """Per condition: ``n``, mean and bootstrap interval of each field, and (when ``baseline`` is present) the paired
    difference condition - baseline of each field (``evaluation.paired.paired_rows``)."""
    from evaluation.paired import paired_rows

    out: dict[str, Any] = {"baseline": baseline, "confidence": confidence, "n_resamples": n_resamples,
                           "conditions": {}}
    for name, rs in rows.items():
        entry: dict[str, Any] = {"n": len(rs), "means": {}, "paired_vs_baseline": {}}
        for f in fields:
            vals = [float(r[f]) for r in rs if r.get(f) is not None]
            if vals:
                mean, lo, hi = _mean_interval(vals, confidence, n_resamples)
                entry["means"][f] = {"mean": mean, "low": lo, "high": hi}
        entry["extra_search"] = sum(bool(r.get("extra_search")) for r in rs)
        if baseline in rows and name != baseline:
            present = [f for f in fields if all(r.get(f) is not None for r in rs)]
            diffs = paired_rows(rows[baseline], rs, present, confidence=confidence, n_resamples=n_resamples)
            entry["paired_vs_baseline"] = {f: d.model_dump() for f, d in diffs.items()}
        out["conditions"][name] = entry
    return out


def summary_table(summary: dict[str, Any], fields: Sequence[str] = ("f1", "em", "cover_em", "format_ok",
                                                                     "n_searches")) -> str:
    """Markdown: one row per condition, mean [95%] per field, then the paired F1/EM difference to the baseline."""
    base = summary["baseline"]
    head = ["condition", "n", *fields, f"F1 − {base} [95%]", f"EM − {base} [95%]", "tried to search again"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, e in summary["conditions"].items():
        cells = [name, str(e["n"])]
        for f in fields:
            m = e["means"].get(f)
            cells.append("—" if m is None else f"{m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]")
        for f in ("f1", "em"):
            d = e["paired_vs_baseline"].get(f)
            cells.append("—" if d is None else f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]")
        cells.append(str(e.get("extra_search", 0)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def first_per_dataset(questions: Sequence[Any], per_dataset: int | None) -> list[Any]:
    """The first ``per_dataset`` questions of each dataset, in the original order (all when None)."""
    if per_dataset is None:
        return list(questions)
    seen: dict[str, int] = {}
    out = []
    for q in questions:
        if seen.get(q.dataset, 0) < per_dataset:
            out.append(q)
            seen[q.dataset] = seen.get(q.dataset, 0) + 1
    return out


class SearchValueResult(StrictModel):
    """A finished search-value evaluation."""

    out_dir: str = Field(description="Folder with <condition>.jsonl, summary.json and summary.md.")
    model: str = Field(description="The evaluated checkpoint.")
    n: int = Field(description="Questions per condition.")
    seconds: dict[str, float] = Field(default_factory=dict, description="Wall seconds per condition.")
    table: str = Field(description="The markdown table (summary_table).")


def run_search_value(
    cfg: Any, conditions: Sequence[str] = DEFAULT_CONDITIONS, out_dir: str | Path = "search_value",
    per_dataset: int | None = None, model: str | None = None, own_rows: str | Path | None = None,
    dense_index: str | None = None, on_condition: Callable[[str, float], None] | None = None,
) -> SearchValueResult:
    """Evaluate an RL preset's warm-up policy (or ``model``) on its held-out questions under ``conditions``.

    Args:
        cfg: the RL preset (``training.rl.config.RLConfig``); its ``eval`` section gives the questions, corpus,
            budget and normalization; its warm-up is built (``train_rl_warmup``, cached) when ``model`` is None.
        conditions: condition names (``parse_condition``); ``closed`` is the paired baseline.
        out_dir: where ``<condition>.jsonl``, ``summary.json`` and ``summary.md`` go (condition files already there
            with the same question ids are reused, so a stopped run resumes).
        per_dataset: first N questions of each held-out dataset (None: all).
        model: a checkpoint to evaluate instead of the warm-up.
        own_rows: recorded greedy held-out rows of this same checkpoint (``heldout_start.jsonl``) used for ``own``
            instead of recomputing it.
        dense_index: a dense index folder over the held-out corpus (``dense@k`` conditions).
        on_condition: called with (condition, seconds) after each condition.

    Raises:
        ConfigError: the preset has no held-out benchmarks, or an unknown condition.
    """
    from retrieval.open import RetrieverSpec, open_searcher, passages_of
    from training.agent.evaluate import open_generator
    from training.generation.models import load_tokenizer, resolve_model
    from training.rl.heldout import eval_config, heldout_questions, heldout_rows
    from training.rl.warmup import protocol_kwargs, train_rl_warmup, warmup_root

    conds = [parse_condition(c) for c in conditions]
    if not cfg.eval.benchmarks:
        raise ConfigError(f"preset {cfg.name!r} has no eval.benchmarks: search-value needs the held-out questions")
    if model is None:
        model = train_rl_warmup(cfg, warmup_root(cfg)).uri
    path = str(resolve_model(model))
    ecfg = eval_config(cfg, path)
    questions = first_per_dataset(heldout_questions(cfg), per_dataset)
    ids = [q.id for q in questions]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(path)
    searchers: dict[str, Any] = {"bm25": open_searcher(ecfg.retrieval)}
    if dense_index:
        searchers["dense"] = open_searcher(RetrieverSpec(index=dense_index))
    passages = passages_of(ecfg.retrieval) if any(c.kind == "gold" for c in conds) else {}
    generator = None
    kwargs = {**protocol_kwargs(cfg), "top_k": ecfg.rollout.top_k, "max_turns": ecfg.rollout.max_turns}
    all_rows: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    for c in conds:
        dest = out / f"{c.name}.jsonl"
        if dest.exists() and [r["id"] for r in artifacts.read_jsonl(str(dest))] == ids:
            all_rows[c.name] = artifacts.read_jsonl(str(dest))
            log.info("search-value %s: reusing %s", c.name, dest)
            continue
        t0 = time.perf_counter()
        if c.kind == "own" and own_rows is not None:
            by_id = {str(r["id"]): r for r in artifacts.read_jsonl(str(own_rows))}
            missing = [i for i in ids if i not in by_id]
            if missing:
                raise DataError(f"{own_rows} lacks {len(missing)} held-out ids (e.g. {missing[:3]}); recompute own")
            rows = [{**by_id[i], "condition": "own", "docs": [], "extra_search": False} for i in ids]
        else:
            if generator is None:
                rolled = sum(1 for d in conds if not (d.kind == "own" and own_rows is not None))
                generator = open_generator(ecfg.generator, items=len(questions) * rolled)
            trajs = evaluate_condition(questions, cfg.protocol, kwargs, generator, ecfg.rollout, c, searchers,
                                       passages, tok)
            rows = condition_rows(c, trajs, heldout_rows(cfg, trajs, tok))
        seconds[c.name] = time.perf_counter() - t0
        artifacts.write_jsonl(str(dest), rows)
        all_rows[c.name] = rows
        log.info("search-value %s: %d questions in %.0f s", c.name, len(rows), seconds[c.name])
        if on_condition is not None:
            on_condition(c.name, seconds[c.name])
    summary = summarize(all_rows, baseline="closed")
    summary.update({"preset": cfg.name, "model": model, "n": len(ids), "seconds": seconds,
                    "conditions_run": [c.name for c in conds]})
    artifacts.write_json(str(out / "summary.json"), summary)
    table = summary_table(summary)
    (out / "summary.md").write_text(table + "\n")
    return SearchValueResult(out_dir=str(out), model=model, n=len(ids), seconds=seconds, table=table)
