"""Soak test: many concurrent clients against both live servers for a while; failed requests and RSS growth.

Starts the retriever server (BM25 over the mini corpus) and the generation server (SmolLM2 by default, the
transformers backend) as separate processes on free loopback ports, each through the library's own ``serve`` with
its default limits and a bearer token, then runs
``--retriever-clients`` (64) and ``--generator-clients`` (8) concurrent keep-alive clients for ``--duration`` (60)
seconds. Retriever clients cycle through every wire format (``/search``, ``/batch_search``, ``/retrieve``,
``/queries``, ``/v1/search``, ``GET /api/search``) with fresh and repeated queries and k up to 50; generator clients
send completions (and every fourth a chat completion) of 4-32 tokens. A request fails when it raises or answers
anything but 200. Prints one JSON object: per server the requests, failures (by status or exception), p50/p99
latency and the server's RSS before (after a warm-up) and after the soak.

Targets (issue 11): zero failed requests, RSS flat. Headline command (not a test; time it on an idle machine)::

    PYTHONPATH=. python benchmarks/soak.py --duration 60

Quick check that it runs: ``PYTHONPATH=. python benchmarks/soak.py --duration 5 --generator-clients 2``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

REPO = Path(__file__).resolve().parent.parent
TOKEN = "soak-token"
WORDS = ("film", "director", "born", "river", "city", "album", "war", "king", "novel", "band", "team", "island",
         "school", "painter", "election", "bridge", "university", "player", "actor", "company")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)]
    return round(sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20, 1)


def _serve(kind: str, port: int, source: str, cache_mb: float | None = None) -> None:
    """Child process: run one server in the foreground (library entry points, default limits)."""
    if kind == "retriever":
        from retrieval.server import ServerConfig, open_source, serve

        extra = {} if cache_mb is None else {"cache_bytes": int(cache_mb * 2**20)}
        serve(open_source(None, source), ServerConfig(port=port, token=TOKEN, **extra))
    else:
        from training.generation.hf import TransformersGenerator
        from training.generation.server import GenerationServerConfig, serve_generator

        generator = TransformersGenerator.from_model(source, device="cpu")
        serve_generator(generator, GenerationServerConfig(port=port, token=TOKEN, served_name="soak"))


@contextmanager
def _server(kind: str, source: str, health_timeout_s: float = 300, cache_mb: float | None = None):
    """Start one server (``_serve`` in a child process) on a free loopback port; yield (url, pid)."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, __file__, "--serve", kind, "--port", str(port), "--source", source]
    if cache_mb is not None:
        cmd += ["--cache-mb", str(cache_mb)]
    proc = subprocess.Popen(cmd,
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + health_timeout_s
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} server did not start (exit code {proc.poll()})")
            time.sleep(0.5)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _retriever_request(rng: random.Random, i: int) -> tuple[str, str, Any]:
    query = " ".join(rng.sample(WORDS, 3)) + ("" if rng.random() < 0.5 else f" {i}")  # half repeat, half fresh
    k = rng.choice([1, 3, 10, 50])
    kind = i % 6
    if kind == 0:
        return "POST", "/search", {"query": query, "top_n": k, "return_score": bool(i % 2)}
    if kind == 1:
        return "POST", "/batch_search", {"query": [query, query + " x"], "top_n": k, "return_score": True}
    if kind == 2:
        return "POST", "/retrieve", {"queries": [query], "topk": k, "return_scores": True}
    if kind == 3:
        return "POST", "/queries", {"queries": [query, "Ed Wood"], "k": k}
    if kind == 4:
        return "POST", "/v1/search", {"queries": [query], "k": k}
    return "GET", f"/api/search?query={query.replace(' ', '+')}&k={k}", None


def _generator_request(rng: random.Random, i: int, model: str) -> tuple[str, str, Any]:
    n_tokens = rng.choice([4, 8, 16, 32])
    if i % 4 == 3:
        return "POST", "/v1/chat/completions", {"model": model, "max_tokens": n_tokens, "temperature": 0.7,
                                                "messages": [{"role": "user", "content": f"Name a city ({i})."}]}
    return "POST", "/v1/completions", {"model": model, "max_tokens": n_tokens, "temperature": rng.choice([0, 0.8]),
                                       "prompt": f"Question {i}: who wrote {rng.choice(WORDS)}? Answer:"}


async def _client(url: str, make: Any, seed: int, until: float, stats: dict[str, Any]) -> None:
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as http:
        i = seed * 1_000_000
        while time.monotonic() < until:
            method, path, body = make(rng, i)
            i += 1
            t0 = time.perf_counter()
            try:
                r = await http.request(method, path, content=None if body is None else orjson.dumps(body),
                                       headers={"Content-Type": "application/json"})
                ok, why = r.status_code == 200, str(r.status_code)
            except httpx.HTTPError as exc:
                ok, why = False, type(exc).__name__
            stats["latency"].append(time.perf_counter() - t0)
            stats["requests"] += 1
            if not ok:
                stats["failures"][why] += 1


def _summary(stats: dict[str, Any]) -> dict[str, Any]:
    lat = sorted(stats["latency"]) or [0.0]
    return {"requests": stats["requests"], "failed": sum(stats["failures"].values()),
            "failures": dict(stats["failures"]), "p50_ms": round(statistics.median(lat) * 1000, 1),
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 1)}


async def _sample_rss(pids: list[int], every: float, until: float, timeline: list[list[float]]) -> None:
    """Record each server's RSS (MiB) every ``every`` seconds until the soak ends."""
    start = time.monotonic()
    while time.monotonic() < until:
        await asyncio.sleep(min(every, max(0.0, until - time.monotonic())))
        timeline.append([round(time.monotonic() - start, 1), *(_rss_mb(pid) for pid in pids)])


async def _soak(targets: list[tuple[str, Any, int]], duration: float, pids: list[int] | None = None,
                rss_every: float = 10.0, timeline: list[list[float]] | None = None) -> list[dict[str, Any]]:
    until = time.monotonic() + duration
    all_stats = [{"requests": 0, "failures": Counter(), "latency": []} for _ in targets]
    tasks = [_client(url, make, seed, until, all_stats[t])
             for t, (url, make, clients) in enumerate(targets) for seed in range(1, clients + 1)]
    if pids and timeline is not None:
        tasks.append(_sample_rss(pids, rss_every, until, timeline))
    await asyncio.gather(*tasks)
    return [_summary(s) for s in all_stats]


def main() -> None:
    """Parse arguments, start the servers, soak them, print the JSON result."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=60.0, help="Seconds of load.")
    ap.add_argument("--retriever-clients", type=int, default=64)
    ap.add_argument("--generator-clients", type=int, default=8, help="0 skips the generator.")
    ap.add_argument("--corpus", default=str(REPO / "data" / "corpus" / "mini.jsonl"))
    ap.add_argument("--model", default="smollm2", help="Generator model ('smollm2', an HF folder or a .gguf).")
    ap.add_argument("--warmup", type=float, default=3.0, help="Seconds of load before the first RSS reading.")
    ap.add_argument("--cache-mb", type=float, default=None,
                    help="Retriever query-cache bound in MiB (server default 256). Half the queries are fresh, so the "
                         "cache fills during the soak; a small bound shows the RSS growth is the cache, not a leak.")
    ap.add_argument("--rss-every", type=float, default=10.0, help="Seconds between RSS samples (the timeline).")
    ap.add_argument("--serve", choices=["retriever", "generator"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--source", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        _serve(args.serve, args.port, args.source, args.cache_mb)
        return

    with _server("retriever", args.corpus, cache_mb=args.cache_mb) as (r_url, r_pid):
        servers: list[tuple[str, Any, int, int, str]] = [
            (r_url, _retriever_request, args.retriever_clients, r_pid, "retriever")]
        gen_ctx = _server("generator", args.model) if args.generator_clients > 0 else None
        if gen_ctx is not None:
            g_url, g_pid = gen_ctx.__enter__()

            def make_gen(rng: random.Random, i: int) -> tuple[str, str, Any]:
                return _generator_request(rng, i, "soak")

            servers.append((g_url, make_gen, args.generator_clients, g_pid, "generator"))
        try:
            targets = [(url, make, n) for url, make, n, _, _ in servers]
            asyncio.run(_soak(targets, args.warmup))
            before = [_rss_mb(pid) for *_, pid, _ in servers]
            t0 = time.monotonic()
            timeline: list[list[float]] = []
            results = asyncio.run(_soak(targets, args.duration, [pid for *_, pid, _ in servers], args.rss_every,
                                        timeline))
            wall = time.monotonic() - t0
            after = [_rss_mb(pid) for *_, pid, _ in servers]
        finally:
            if gen_ctx is not None:
                gen_ctx.__exit__(None, None, None)
    out = {"duration_s": round(wall, 1), "clients": {name: n for _, _, n, _, name in servers},
           "retriever_cache_mb": args.cache_mb if args.cache_mb is not None else 256.0,
           "rss_timeline_mb": {"columns": ["t_s", *(name for *_, name in servers)], "rows": timeline}}
    for (*_, name), res, b, a in zip(servers, results, before, after, strict=True):
        out[name] = {**res, "rss_mb_before": b, "rss_mb_after": a, "rss_growth_mb": round(a - b, 1),
                     "requests_per_s": round(res["requests"] / wall, 1)}
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
