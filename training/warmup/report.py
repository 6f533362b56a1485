"""Validator survival of warm-up trajectories per protocol and source: ``python -m training.warmup.report``.

Builds the protocol-independent episodes once (``training.warmup.renderers``: decompositions + BM25 over the given
corpora, FireAct chats), renders them in every requested protocol through the rollout engine, and prints a markdown
table (valid / candidates per protocol x source, truncations, rejection reasons); ``--out`` also writes the rows'
statistics as JSON. Example (the shared training sets)::

    python -m training.warmup.report --questions ../shared/data/train/2wikimultihopqa_train_migres.jsonl \\
        --questions ../shared/data/train/hotpotqa_train_hipporag.jsonl \\
        --questions ../shared/data/train/musique_train_hipporag.jsonl \\
        --fireact ../shared/data/train/raw/fireact/hotpotqa_react_trajectories.jsonl \\
        --corpus ../shared/data/corpus/train_wiki.jsonl
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from infra import artifacts
from training.protocols.registry import PROTOCOLS

DEFAULT_PROTOCOLS = list(PROTOCOLS)


def survival_table(stats: list[dict[str, Any]]) -> str:
    """Markdown table of ``ProtocolWarmupStats`` dicts: one row per protocol x source."""
    lines = ["| protocol | source | valid / candidates | truncated | rejected |", "|---|---|---|---|---|"]
    for s in stats:
        rejected = ", ".join(f"{k} {v}" for k, v in s["rejected"].items()) or "-"
        reasons = "; ".join(f"{k} ({v})" for k, v in s["first_reasons"].items())
        lines.append(f"| {s['protocol']} | {s['source']} | {s['valid']} / {s['candidates']} | {s['truncated']} | "
                     f"{rejected}{' — ' + reasons if reasons else ''} |")
    return "\n".join(lines)


def run_report(questions: list[str], fireact: str | None, corpora: list[str], protocols: list[str], top_k: int,
               max_turns: int | None, limit: int | None, model: str = "smollm2") -> list[dict[str, Any]]:
    """Build the episodes, render them in each protocol, return the statistics (dicts)."""
    from evaluation.benchmarks import load_benchmark
    from retrieval.open import RetrieverSpec, open_searcher, passages_of
    from training.generation.models import load_tokenizer
    from training.warmup import renderers as wp

    sources: dict[str, list[Any]] = {}
    if questions:
        spec = RetrieverSpec(corpus=corpora)
        qs = [q for path in questions for q in load_benchmark(path, limit=limit)]
        sources, _ = wp.decomposition_episodes(qs, open_searcher(spec), passages_of(spec), top_k)
    if fireact:
        sources["fireact"], _ = wp.fireact_episodes(artifacts.read_jsonl(fireact)[:limit])
    tok = load_tokenizer(model)
    out = []
    for name in protocols:
        _, stats = wp.build_protocol_warmup(name, sources, tok, top_k=top_k, max_turns=max_turns)
        out += [s.model_dump() for s in stats]
    return out


def main(argv: list[str] | None = None) -> None:
    """CLI entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", action="append", default=[], help="question jsonl with decompositions")
    parser.add_argument("--fireact", default=None, help="FireAct ReAct chats jsonl")
    parser.add_argument("--corpus", action="append", default=[], help="corpus jsonl for BM25 and gold paragraphs")
    parser.add_argument("--protocols", default=",".join(DEFAULT_PROTOCOLS), help="comma-separated protocol names")
    parser.add_argument("--top-k", type=int, default=3, help="documents per step")
    parser.add_argument("--max-turns", type=int, default=None, help="turn limit (default: each protocol's own)")
    parser.add_argument("--limit", type=int, default=None, help="first N rows of each input file")
    parser.add_argument("--out", default=None, help="write the statistics as JSON here")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    stats = run_report(ns.questions, ns.fireact, ns.corpus, ns.protocols.split(","), ns.top_k, ns.max_turns,
                       ns.limit)
    print(survival_table(stats))
    if ns.out:
        artifacts.write_json(ns.out, stats)


if __name__ == "__main__":
    main()
