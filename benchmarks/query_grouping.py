"""Length groups (packed bf16 weights, unpadded passes) against sorted groups of 16 for a dense index's queries on
CPU, from ONE run (issue 26 item 7).

A served dense search is mostly the query encoder's forward passes. sentence-transformers sorts a call's queries by
length and cuts them into fixed groups (16 on CPU before session 48), so a call of 30 queries pads to the longest of
each half; ``retrieval.encoders.length_groups`` cuts the sorted queries where one more forward pass costs less than
the padding it saves (``SentenceTransformerEncoder._encode_grouped``, the CPU default since session 48), and with a
bf16 torch query model the passes run on a copy whose linear weights are packed once for oneDNN
(``retrieval.packed_linear``); since session 49 a bf16 BERT query model runs each call's real tokens unpadded
(``retrieval.unpadded_bert``: one matrix through the linear layers, attention once per token length). For each
query backend and call size (30: a server batch at 64 clients and 2 workers; 64: the in-process reference), this
prints, over the same queries and interleaved rounds:

- CPU ms per query of ``searcher.search`` (one thread) with sorted groups of 16 (the baseline), length groups,
  length groups with packed weights and unpadded passes, and each ratio baseline / path (> 1: the path is cheaper);
- agreement of each path's top-1 passage and top-5 set with the baseline's, beside the agreement of the baseline
  with itself when the same queries come in calls of the other size (a query's padding, hence its bf16/int8
  vector, already depends on the call it lands in), and with the same encoder's fp32 queries (the reference all
  paths round away from; since session 49).

Example (session 48): ``PYTHONPATH=. python benchmarks/query_grouping.py --backends torch,onnx-int8 --work-dir <w>``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


PATHS = {"groups16": (False, False, False), "length": (True, False, False), "length+packed": (True, True, False),
         "unpadded": (True, True, True)}


def use_path(searcher: Any, path: str) -> None:
    """Switch the encoder to a path of :data:`PATHS`: (length groups, packed linear weights, unpadded BERT passes)."""
    enc = searcher.encoder
    enc.group_queries, enc.pack_queries, enc.unpad_queries = PATHS[path]


def search_ms(searcher: Any, queries: list[str], call: int, path: str) -> float:
    """CPU ms per query of searching ``queries`` in calls of ``call`` (this thread's CPU time)."""
    use_path(searcher, path)
    c0 = time.thread_time()
    for i in range(0, len(queries), call):
        searcher.search(queries[i:i + call], 5)
    return 1000 * (time.thread_time() - c0) / len(queries)


def top5(searcher: Any, queries: list[str], call: int, path: str | None, encoder: Any = None) -> np.ndarray:
    """Row ids of the top 5 passages per query, the queries searched in calls of ``call`` (by ``encoder`` instead of
    the searcher's own when given)."""
    if path is not None:
        use_path(searcher, path)
    encoder = encoder or searcher.encoder
    vectors = np.concatenate([encoder.encode(queries[i:i + call], "query") for i in range(0, len(queries), call)])
    return searcher.index.search(np.ascontiguousarray(vectors, dtype=np.float32), 5)[1]


def agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(share of equal top-1, share of equal top-5 sets)."""
    return float(np.mean(a[:, 0] == b[:, 0])), float(np.mean([set(x) == set(y) for x, y in zip(a, b, strict=True)]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="torch",
                   help="Comma list of query backends (torch, torch-int8, onnx, onnx-int8).")
    p.add_argument("--calls", default="30,64", help="Queries per search call.")
    p.add_argument("--queries", type=int, default=960, help="Unique dev questions timed and compared.")
    p.add_argument("--rounds", type=int, default=3, help="Interleaved timed rounds per path (median).")
    p.add_argument("--passages", type=int, default=1000, help="Passages of the mini corpus in the dense index.")
    p.add_argument("--work-dir", type=Path, default=None, help="Keep (and reuse) the built index here.")
    args = p.parse_args(argv)
    import tempfile

    import torch

    from benchmarks.server_throughput import build, load_queries
    from infra.machine import describe
    from retrieval.encoders import get_encoder
    from retrieval.index import load_searcher

    torch.set_num_threads(1)
    print(f"machine: {describe()}", flush=True)
    queries = load_queries(args.queries)
    calls = [int(c) for c in args.calls.split(",")]
    print(f"{len(queries)} unique queries, calls of {calls}, 1 thread, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="searchloop-grouping-") as tmp:
        work = args.work_dir or Path(tmp)
        index_dir = build("dense", args.passages, work)  # reused when the same index is already there
        rows = []
        for backend in args.backends.split(","):
            searcher = load_searcher(index_dir, backend.strip(), None)
            searcher.search(queries[:64], 5)
            if not hasattr(searcher.encoder, "pack_queries"):
                raise SystemExit(f"{backend}: the encoder has no length groups (group_queries); nothing to compare")
            dtype = (str(next(iter(searcher.encoder._model.parameters())).dtype).replace("torch.", "")
                     if backend.strip() == "torch" else "onnxrt")
            # the reference every path is rounding away from: the same encoder in fp32, padded, groups of 16
            fp32 = get_encoder(searcher.encoder.cfg.model_copy(update={"dtype": "float32", "query_backend": "torch"}))
            enc = searcher.encoder
            unpadded = getattr(enc, "_unpadded_query_model", None) is not None
            paths = [p for p in PATHS if (p != "length+packed" or enc.packed_query_model() is not None)
                     and (p != "unpadded" or unpadded)]
            for call in calls:
                times: dict[str, list[float]] = {p: [] for p in paths}
                for _ in range(args.rounds):
                    for path in paths:
                        times[path].append(search_ms(searcher, queries, call, path))
                base = statistics.median(times["groups16"])
                other = next((c for c in calls if c != call), call)
                ref = top5(searcher, queries, call, "groups16")
                itself = agreement(ref, top5(searcher, queries, other, "groups16"))
                exact = top5(searcher, queries, call, None, fp32)
                for path in paths:
                    new = statistics.median(times[path])
                    got = top5(searcher, queries, call, path)
                    rows.append((backend, dtype, call, path, base, new, agreement(ref, got), agreement(exact, got),
                                 other, itself))
                print(f"[{backend}] calls of {call}: " + "; ".join(
                    f"{p} {statistics.median(t):.2f} ms/q ({', '.join(f'{x:.2f}' for x in t)})"
                    for p, t in times.items()), flush=True)
    print("\nbackend    dtype     call  path           groups of 16 ms/q  path ms/q  ratio  top-1 same  top-5 same  "
          "as fp32: top-1  top-5  (groups of 16 vs itself in calls of the other size: top-1, top-5)")
    for backend, dtype, call, path, base, new, same, exact, other, itself in rows:
        print(f"{backend:<10} {dtype:<9} {call:>4}  {path:<13}  {base:17.2f}  {new:9.2f}  {base / new:5.2f}  "
              f"{same[0]:10.3f}  {same[1]:10.3f}  {exact[0]:13.3f}  {exact[1]:5.3f}  "
              f"(calls of {other}: {itself[0]:.3f}, {itself[1]:.3f})")


if __name__ == "__main__":
    main()
