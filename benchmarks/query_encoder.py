"""Query encoders for a dense index, from ONE run: torch (the baseline) vs its int8 pass vs ONNX Runtime fp32 / int8.

Issue 26 item 7: a served dense search is mostly the query encoder (MiniLM, ~5 CPU ms per query in bf16 on a
2-core AVX512 CPU), so the retriever server's throughput is bounded by it. ``EncoderConfig.query_backend`` lets the
model's int8 pass (``torch-int8``, retrieval.int8_bert) or a second copy under ONNX Runtime encode queries; int8
changes the query vectors (the passages in the index keep the torch model's), so speed is reported together with what
it costs in retrieval:

- CPU ms per query of ``encoder.encode(queries, "query")`` in calls of ``--call`` queries (the batch 64 concurrent
  clients can form), and of whole searches, at ``--threads`` intra-op threads; ratio torch / backend;
- agreement with the torch baseline over the same queries: top-1 passage, top-5 set, and the lowest / mean cosine
  of each query vector to torch fp32's;
- recall@k of the gold passages (``retrieval.recall``) on the eval files, per backend, beside torch's.

The index is built with the project's own builder over ``--corpus`` (default: the shipped mini corpus, all
passages). ``--query-model <dir>`` adds, for every backend, a row for a query encoder distilled into the index's space
(``searchloop index distill-queries``, ``retrieval.distill``). Examples (what sessions 31 and 33 ran)::

    PYTHONPATH=. python benchmarks/query_encoder.py --threads 1
    PYTHONPATH=. python benchmarks/query_encoder.py --threads 1 --backends torch,onnx-int8 --query-model <dir>
    PYTHONPATH=. python benchmarks/query_encoder.py --threads 1 --backends torch,torch-int8,onnx-int8  # session 50
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from retrieval.config import QUERY_BACKENDS  # noqa: E402


def cpu_ms(fn, queries: list[str], call: int, rounds: int) -> float:  # noqa: ANN001 - a callable on a batch
    """Median over ``rounds`` of CPU ms per query of ``fn`` over ``queries`` in calls of ``call``."""
    fn(queries[:call])  # warm-up: kernels for the shapes, ONNX session
    runs = []
    for _ in range(rounds):
        c0 = time.process_time()
        for i in range(0, len(queries), call):
            fn(queries[i: i + call])
        runs.append(1000 * (time.process_time() - c0) / len(queries))
    return float(np.median(runs))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default=str(REPO / "data" / "corpus" / "mini.jsonl"))
    p.add_argument("--eval", action="append", dest="evals", default=None,
                   help="Eval jsonl with supporting_doc_ids (repeatable; default: data/eval/*_mini.jsonl).")
    p.add_argument("--queries", type=int, default=1024, help="Unique dev questions timed and compared.")
    p.add_argument("--call", type=int, default=64, help="Queries per encode/search call.")
    p.add_argument("--rounds", type=int, default=3, help="Timed passes per backend (median).")
    p.add_argument("--threads", type=int, default=1, help="Intra-op threads (torch and ONNX Runtime).")
    p.add_argument("--backends", default=",".join(QUERY_BACKENDS))
    p.add_argument("--work-dir", type=Path, default=None, help="Keep (and reuse) the built index here.")
    p.add_argument("--query-model", default=None,
                   help="A distilled query encoder's folder: adds a '<backend> distilled' row per backend.")
    p.add_argument("--distill", action="store_true",
                   help="Distill a query encoder for the index first (defaults of `searchloop index distill-queries`, "
                        "kept in <work-dir>/student) and add its rows.")
    args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)

    from infra.machine import describe

    print(f"machine: {describe()}", flush=True)
    import torch

    torch.set_num_threads(args.threads)
    sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
    from server_throughput import load_queries

    from retrieval.encoders import EncoderConfig, SentenceTransformerEncoder, quantization_target
    from retrieval.index import IndexBuildConfig, build_index, load_searcher
    from retrieval.recall import RecallConfig, evaluate_index_recall

    backends = [b.strip() for b in args.backends.split(",")]
    if backends[0] != "torch":
        p.error("--backends must start with torch (the baseline)")
    evals = args.evals or [str(f) for f in sorted((REPO / "data" / "eval").glob("*_mini.jsonl"))]
    queries = load_queries(args.queries)
    print(f"{len(queries)} queries, calls of {args.call}, {args.threads} thread(s), int8 target "
          f"{quantization_target()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="searchloop-qenc-") as tmp:
        work = args.work_dir or Path(tmp)
        t0 = time.perf_counter()
        ref = build_index(IndexBuildConfig(corpus=args.corpus, backend="dense"), work / "dense")
        print(f"dense index: {ref.n_passages} passages in {time.perf_counter() - t0:.1f} s", flush=True)
        fp32 = SentenceTransformerEncoder(EncoderConfig(dtype="float32")).encode(queries, "query")
        student = args.query_model
        if args.distill and student is None:
            from retrieval.distill import distill_query_encoder

            student = str(work / "student")
            if not (work / "student" / "manifest.json").exists():
                t0 = time.perf_counter()
                torch.set_num_threads(os.cpu_count() or 1)  # training is not what is timed here
                m = distill_query_encoder(EncoderConfig(), student)
                torch.set_num_threads(args.threads)
                print(f"distilled a query encoder (layers {m['layers']} of {m['teacher_layers']}, {m['n_train']} "
                      f"training queries, held-out cosine mean {m['heldout_cosine_mean']:.4f} min "
                      f"{m['heldout_cosine_min']:.4f}) in {time.perf_counter() - t0:.0f} s", flush=True)
        variants = [(b, b, None) for b in backends] + [(f"{b} distilled", b, student) for b in backends if student]
        rows: dict[str, dict] = {}
        for name, backend, qmodel in variants:
            searcher = load_searcher(ref.uri, backend, qmodel)
            enc = searcher.encoder
            vec = enc.encode(queries, "query")
            hits = [[h.id for h in hs] for hs in searcher.search(queries, 5)]
            cos = (vec * fp32).sum(1)
            recall = evaluate_index_recall(ref.uri, RecallConfig(files=evals, ks=[1, 5, 10]), backend, qmodel)
            rows[name] = {
                "encode_ms": cpu_ms(lambda b, e=enc: e.encode(b, "query"), queries, args.call, args.rounds),
                "search_ms": cpu_ms(lambda b, s=searcher: s.search(b, 5), queries, args.call, args.rounds),
                "cos_min": float(cos.min()), "cos_mean": float(cos.mean()), "hits": hits,
                "recall": {d.dataset: d.any_gold for d in recall.datasets if d.n},
            }
            print(f"{name}: encode {rows[name]['encode_ms']:.2f} CPU ms/q, search {rows[name]['search_ms']:.2f}; "
                  f"cosine to torch fp32 min {cos.min():.4f} mean {cos.mean():.5f}", flush=True)
    base = rows["torch"]
    print("\n| query encoder | encode CPU ms/q | x torch | search CPU ms/q | x torch | top-1 = torch | top-5 set = "
          "torch | cosine to fp32 (min / mean) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        top1 = np.mean([a[:1] == b[:1] for a, b in zip(r["hits"], base["hits"], strict=True)])
        top5 = np.mean([set(a) == set(b) for a, b in zip(r["hits"], base["hits"], strict=True)])
        print(f"| {name} | {r['encode_ms']:.2f} | {base['encode_ms'] / r['encode_ms']:.2f}x | {r['search_ms']:.2f} | "
              f"{base['search_ms'] / r['search_ms']:.2f}x | {top1:.4f} | {top5:.4f} | {r['cos_min']:.4f} / "
              f"{r['cos_mean']:.5f} |")
    print("\nrecall@1 / @5 / @10 (any gold passage in the top k), per eval file:")
    print("| query encoder | " + " | ".join(base["recall"]) + " |")
    print("|---|" + "---|" * len(base["recall"]))
    for name, r in rows.items():
        cells = [" / ".join(f"{r['recall'][d][k]:.3f}" for k in (1, 5, 10)) for d in base["recall"]]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
