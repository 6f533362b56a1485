"""Recall@k table of every backend on a corpus and its eval sets (the issue's "Must show" recall numbers).

Builds (or reuses) one hybrid BM25+dense index, whose two parts are scored on their own as well, and optionally a
ColBERT index, then prints a markdown table of any-gold / all-gold / mean-fraction recall at k per dataset, with
build times. Examples:

    python benchmarks/recall_table.py --corpus data/corpus/mini.jsonl \\
        --eval data/eval/hotpotqa_mini.jsonl --backends bm25,dense,hybrid,colbert
    python benchmarks/recall_table.py --corpus /work/shared/data/corpus/multihop_wiki.jsonl \\
        --eval /work/shared/data/eval/hotpotqa_dev.jsonl --eval /work/shared/data/eval/2wikimultihopqa_dev.jsonl \\
        --eval /work/shared/data/eval/musique_dev.jsonl --backends bm25,dense,hybrid --out /tmp/mhw
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="data/corpus/mini.jsonl")
    ap.add_argument("--eval", action="append", dest="evals", help="eval jsonl (repeatable)")
    ap.add_argument("--backends", default="bm25,dense,hybrid,colbert")
    ap.add_argument("--k", type=int, action="append", dest="ks", help="cut-off (repeatable; default 5)")
    ap.add_argument("--out", default=None, help="index root (default <home>/runs/recall_table/<corpus stem>)")
    ap.add_argument("--shard-size", type=int, default=2048)
    return ap.parse_args()


def main() -> None:
    from infra.settings import get_settings
    from retrieval.index import IndexBuildConfig, build_index
    from retrieval.recall import RecallConfig, evaluate_index_recall

    args = _args()
    evals = args.evals or ["data/eval/hotpotqa_mini.jsonl"]
    ks = sorted(set(args.ks or [5]))
    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    root = Path(args.out or get_settings().runs_dir / "recall_table" / Path(args.corpus).stem)
    dirs: dict[str, Path] = {}
    build_s: dict[str, float] = {}
    if {"bm25", "dense", "hybrid"} & set(wanted):
        ref = build_index(IndexBuildConfig(corpus=args.corpus, backend="hybrid", shard_size=args.shard_size),
                          root / "hybrid")
        dirs.update(bm25=root / "hybrid" / "bm25", dense=root / "hybrid" / "dense", hybrid=root / "hybrid")
        for part in ("bm25", "dense"):
            build_s[part] = sum(v for k, v in ref.timings.items() if k.startswith(f"{part}.") and k.endswith("_s"))
        build_s["hybrid"] = build_s["bm25"] + build_s["dense"]
    if "colbert" in wanted:
        ref = build_index(IndexBuildConfig(corpus=args.corpus, backend="colbert"), root / "colbert")
        build_s["colbert"] = sum(v for k, v in ref.timings.items() if k.endswith("_s"))
        dirs["colbert"] = root / "colbert"
    rec_cfg = RecallConfig(files=evals, ks=ks)
    rows = []
    for backend in wanted:
        t0 = time.perf_counter()
        report = evaluate_index_recall(dirs[backend], rec_cfg)
        eval_s = time.perf_counter() - t0
        for d in report.datasets:
            if not d.n:
                rows.append(f"| {backend} | {d.dataset} | 0 | skipped: {d.note} |" + " |" * (3 * len(ks) - 1))
                continue
            cells = " | ".join(f"{d.any_gold[k]:.3f} | {d.all_gold[k]:.3f} | {d.mean_fraction[k]:.3f}" for k in ks)
            rows.append(f"| {backend} | {d.dataset} | {d.n} | {cells} | {build_s.get(backend, 0):.1f} | {eval_s:.1f} |")
    head = " | ".join(f"any@{k} | all@{k} | frac@{k}" for k in ks)
    print(f"\ncorpus: {args.corpus}  (indexes under {root})\n")
    print(f"| backend | dataset | n | {head} | build s | eval s |")
    print("|" + "---|" * (5 + 3 * len(ks)))
    print("\n".join(rows))
    print("\nbuild s = recorded build time of the index (store + embedding + index; hybrid = both parts); "
          "eval s = searching every question of all eval files.")


if __name__ == "__main__":
    main()
