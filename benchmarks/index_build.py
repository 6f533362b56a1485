"""Encoder raw throughput vs sharded dense index-build throughput, and the build's peak memory, from one run.

Baselines: raw sentence-transformers ``encode`` on the same model object, dtype and batch size (issue 26 item 5),
and the project's encoder wrapper, each embedding N passages held in memory in one call (passages/s).
Measured: ``build_index`` end to end over the same N passages (stream corpus -> passage store -> embedding
shards written atomically -> faiss index -> manifest). The encoder is loaded once before all (its load time is
printed separately); each baseline runs before and after the build and its mean is used, so machine noise hits
both sides. Peak RSS is sampled every 10 ms during each phase (psutil). Targets: build >= 0.9x either baseline.

Shard size matters: sentence-transformers sorts texts by length inside one encode call, so tiny shards pad more.
Measured on the shared 2-core machine: 128-passage shards gave 0.80x, 512-passage shards 1.01x (default 4096).

    nice -n 10 python benchmarks/index_build.py --corpus data/corpus/mini.jsonl --limit 1024 --shard-size 512
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def peak_rss(fn: Callable[[], Any]) -> tuple[Any, float, float, float]:
    """Run ``fn``; return (result, seconds, RSS before in MiB, peak RSS during in MiB)."""
    import psutil

    proc = psutil.Process()
    before = proc.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], proc.memory_info().rss)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    try:
        result = fn()
    finally:
        seconds = time.perf_counter() - t0
        done.set()
        th.join()
    peak[0] = max(peak[0], proc.memory_info().rss)
    return result, seconds, before / 2**20, peak[0] / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="data/corpus/mini.jsonl")
    ap.add_argument("--limit", type=int, default=1024, help="passages in the slice")
    ap.add_argument("--shard-size", type=int, default=512)
    ap.add_argument("--faiss", default="flat", choices=["flat", "hnsw", "ivfpq"])
    args = ap.parse_args()
    from infra.machine import describe

    print(f"machine: {describe()}")  # dtype, CPU flags, threads, load (the numbers below depend on them)

    from infra.paths import resolve_path
    from retrieval.encoders import EncoderConfig, get_encoder
    from retrieval.index import IndexBuildConfig, build_index
    from retrieval.store import write_store

    corpus = resolve_path(args.corpus)
    enc_cfg = EncoderConfig()
    t0 = time.perf_counter()
    encoder = get_encoder(enc_cfg)
    encoder.encode(["warm up the encoder"] * 8, "passage")
    load_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as tmp:
        info = write_store(corpus, Path(tmp) / "slice", shard_size=args.limit, limit=args.limit)
        from retrieval.store import PassageStore

        texts = [p.contents for p in PassageStore(Path(tmp) / "slice")]
        n = info.n_passages

        def raw() -> Any:  # raw sentence-transformers encode: the same model object, dtype and batch size
            return encoder._model.encode(texts, batch_size=enc_cfg.batch_size, normalize_embeddings=enc_cfg.normalize,
                                         convert_to_numpy=True, show_progress_bar=False)

        _, raw1_s, _, _ = peak_rss(raw)
        _, enc1_s, _, enc1_peak = peak_rss(lambda: encoder.encode(texts, "passage"))
        cfg = IndexBuildConfig(corpus=corpus, backend="dense", limit=args.limit, shard_size=args.shard_size,
                               encoder=enc_cfg, faiss={"type": args.faiss})
        ref, build_s, build_before, build_peak = peak_rss(lambda: build_index(cfg, Path(tmp) / "index", force=True))
        _, enc2_s, _, enc2_peak = peak_rss(lambda: encoder.encode(texts, "passage"))
        _, raw2_s, _, _ = peak_rss(raw)

    enc_rate = n / ((enc1_s + enc2_s) / 2)
    raw_rate = n / ((raw1_s + raw2_s) / 2)
    dtype = str(next(encoder._model.parameters()).dtype)
    build_rate = n / build_s
    emb_mib = n * encoder.dim * 4 / 2**20
    print(f"corpus slice: {n} passages of {corpus}; shards of {args.shard_size}; faiss {args.faiss}; "
          f"encoder {enc_cfg.model} (dim {encoder.dim}, batch {enc_cfg.batch_size}, {dtype}), load+warm-up "
          f"{load_s:.1f} s")
    print(f"sentence-transformers encode (same model object, batch {enc_cfg.batch_size}): {n / raw1_s:.1f} and "
          f"{n / raw2_s:.1f} passages/s -> mean {raw_rate:.1f}")
    print(f"encoder raw (in memory, one call): {n / enc1_s:.1f} and {n / enc2_s:.1f} passages/s -> mean {enc_rate:.1f}")
    print(f"index build end to end (sharded, streamed): {build_s:.1f} s = {build_rate:.1f} passages/s "
          f"(store {ref.timings['store_s']:.2f} s, embed {ref.timings['embed_s']:.1f} s, "
          f"faiss {ref.timings['index_s']:.2f} s)")
    grew = build_peak - build_before
    print(f"peak RSS: build {build_peak:.0f} MiB (process {build_before:.0f} MiB before it, +{grew:.0f} MiB); "
          f"encoder baseline {max(enc1_peak, enc2_peak):.0f} MiB; embeddings would be {emb_mib:.1f} MiB in RAM")
    ratio = build_rate / enc_rate
    print(f"RATIO build/encoder = {ratio:.3f} (target >= 0.9: {'PASS' if ratio >= 0.9 else 'FAIL'})")
    raw_ratio = build_rate / raw_rate
    print(f"RATIO build/sentence-transformers encode = {raw_ratio:.3f} (issue 26 item 5, target >= 0.9: "
          f"{'PASS' if raw_ratio >= 0.9 else 'FAIL'}); encoder wrapper/raw = {enc_rate / raw_rate:.3f}")


if __name__ == "__main__":
    main()
