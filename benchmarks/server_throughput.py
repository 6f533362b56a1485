"""Retriever server throughput vs in-process batched search vs the seeds' per-request server, from ONE run.

For each backend (dense = all-MiniLM-L6-v2 + faiss Flat over a slice of the mini corpus; bm25 over the whole mini
corpus), over the same index directory:
  (a) in-process batched search: ``threads`` threads (default: what the server runs at once, processes x workers)
      each searching its share in one call, and in calls of 64 queries (the largest batch 64 single-query clients
      can form: the like-for-like reference for the 0.9x target);
  (b) our server (micro-batching on, cache off), a separate uvicorn process on 127.0.0.1: throughput and p50/p99
      latency at 1, 16 and 64 concurrent clients (a lean asyncio HTTP/1.1 keep-alive client, one query per
      ``POST /search``; the clients are spread over ``--client-procs`` load-generator processes);
  (c) the baseline server: the same app with batching off (one ``search`` per request in a thread pool, the
      ReSearch/SmartSearch/Search-R1 pattern), same clients.
Prints a table and the ratios server/in-process and server/baseline at 64 clients (targets >= 0.9 and >= 5);
``--repeats N`` adds N-1 interleaved (in-process, server) pairs at 64 clients and prints their median ratio, since a
shared VM's speed drifts by +-10% between phases. Queries are unique within each level, and the cache is off, so
no request is served from memory. CPU time per query is reported for the server (all its processes), for the
time inside the searcher (from ``/health``) and for the load generator. Threads: torch intra-op threads
(``--torch-threads``, default 1) and ``--workers`` parallel batches per server process (``--processes``).

With ``--searchr1 <checkout of PeterGriffinJin/Search-R1>`` the dense backend also runs (d) Search-R1's own
``retrieval_server.py`` on CPU (``benchmarks/searchr1_server_cpu.py``; one ``POST /retrieve`` per query) and prints
server/Search-R1 at the top level (target >= 10).

``--server-variants "workers=1/max_batch=64/wait=10/torch_threads=2,wait=20"`` also runs the batching server with
those settings changed (each an extra mode, same clients and queries, in the same run) and prints each variant's
ratios beside the default server's: how batches form is a property of the settings, measured, not assumed.

Headline command (2-core CPU): ``PYTHONPATH=. python benchmarks/server_throughput.py --workers 2 --max-batch 32
--min-requests 2000 --inprocess-queries 4096 --repeats 5``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(REPO))
from retrieval.config import QUERY_BACKENDS  # noqa: E402


def load_queries(limit: int) -> list[str]:
    """Unique dev questions: the shared full sets when present (SEARCHLOOP_SHARED_DATA_DIR), else the minis."""
    from infra.settings import get_settings

    shared = get_settings().shared_data_dir / "eval"
    files = sorted(shared.glob("*_dev.jsonl")) + sorted(shared.glob("*_test.jsonl"))
    if not files:
        files = sorted((REPO / "data" / "eval").glob("*_mini.jsonl"))
    seen: dict[str, None] = {}
    for f in files:
        for line in f.read_bytes().splitlines():
            if line.strip():
                seen.setdefault(orjson.loads(line)["question"], None)
    return list(seen)[:limit]


def build(backend: str, passages: int, out: Path) -> Path:
    """Build the benchmark index with the project's own index builder."""
    from retrieval.index import IndexBuildConfig, build_index

    cfg = IndexBuildConfig(
        corpus=str(REPO / "data" / "corpus" / "mini.jsonl"), backend=backend,
        limit=passages if backend == "dense" else None,
    )
    t0 = time.perf_counter()
    ref = build_index(cfg, out / backend)
    print(f"built {backend} index: {ref.n_passages} passages in {time.perf_counter() - t0:.1f} s", flush=True)
    return Path(ref.uri)


QUERY_BACKEND: str | None = None  # --query-backend: what encodes the dense index's queries, in process and served
QUERY_MODEL: str | None = None  # --query-model: a distilled query encoder for the dense index, in process and served


def in_process(index_dir: Path, queries: list[str], k: int, workers: int, chunk: int | None = None
               ) -> tuple[float, float]:
    """Queries/s and CPU ms per query of batched search: ``workers`` threads, each searching its share in calls of
    ``chunk`` queries (None = its whole share in one call)."""
    from concurrent.futures import ThreadPoolExecutor

    from retrieval.index import load_searcher

    searcher = load_searcher(index_dir, QUERY_BACKEND, QUERY_MODEL)
    searcher.search(queries[:64], k)
    parts = [queries[i::workers] for i in range(workers)]

    def run(part: list[str]) -> None:
        step = chunk or len(part)
        for i in range(0, len(part), step):
            searcher.search(part[i: i + step], k)

    with ThreadPoolExecutor(workers) as pool:
        t0, c0 = time.perf_counter(), time.process_time()
        list(pool.map(run, parts))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return len(queries) / wall, 1000 * cpu / len(queries)


def in_process_single(index_dir: Path, queries: list[str], k: int) -> float:
    """CPU ms per query of one-query calls (what the per-request baseline pays at best)."""
    from retrieval.index import load_searcher

    searcher = load_searcher(index_dir, QUERY_BACKEND, QUERY_MODEL)
    searcher.search(queries[:4], k)
    c1 = time.process_time()
    for q in queries:
        searcher.search([q], k)
    return 1000 * (time.process_time() - c1) / len(queries)


def _cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process and its live children (the server's worker processes)."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server_process(index_dir: Path, batching: bool, workers: int, torch_threads: int, max_wait_ms: float,
                   max_batch: int = 256, processes: int = 1, extra_env: dict[str, str] | None = None):
    """Start ``searchloop serve retriever`` on a free loopback port; yield its URL."""
    from retrieval.client import RetrieverClient

    port = _free_port()
    cmd = [sys.executable, "-m", "flows.cli", "serve", "retriever", "--index", str(index_dir), "--port", str(port),
           "--cache-mb", "0", "--max-batch-queries", str(max_batch), "--workers", str(workers),
           "--max-wait-ms", str(max_wait_ms), "--processes", str(processes)]
    if not batching:
        cmd.append("--no-batching")
    if QUERY_BACKEND is not None:
        cmd += ["--query-backend", QUERY_BACKEND]
    if QUERY_MODEL is not None:
        cmd += ["--query-model", QUERY_MODEL]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(torch_threads),
           "MKL_NUM_THREADS": str(torch_threads), **(extra_env or {})}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        with RetrieverClient(url, retries=0) as client:
            client.wait_until_ready(timeout_s=180)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


@contextmanager
def searchr1_process(checkout: Path, index_dir: Path, torch_threads: int, k: int):
    """Start Search-R1's own ``retrieval_server.py`` on CPU (``benchmarks/searchr1_server_cpu.py``) over the same
    dense index; yield its URL and pid once a ``POST /retrieve`` answers."""
    import urllib.error
    import urllib.request

    port = _free_port()
    cmd = [sys.executable, str(REPO / "benchmarks" / "searchr1_server_cpu.py"), "--upstream", str(checkout),
           "--index-dir", str(index_dir), "--port", str(port), "--topk", str(k)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(torch_threads),
           "MKL_NUM_THREADS": str(torch_threads)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        path, body = request_of("searchr1", "warm up", k)
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"Search-R1's server exited with status {proc.returncode}")
            try:
                req = urllib.request.Request(url + path, data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as resp:
                    resp.read()
                break
            except urllib.error.HTTPError:
                raise  # it answered: an error status is a bug to report, not a server still starting
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


class _RawHTTP:
    """A minimal keep-alive HTTP/1.1 client over asyncio streams: the load generator shares the machine's cores
    with the server, so it must cost far less CPU per request than httpx (~0.1 ms against ~1.5 ms measured)."""

    def __init__(self, url: str) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> bytes:
        """POST ``body`` (JSON) and return the response body; raises on a non-200 status."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        if self.reader is None:
            raise RuntimeError("connection has no reader")
        status_and_headers = await self.reader.readuntil(b"\r\n\r\n")
        status = int(status_and_headers.split(b" ", 2)[1])
        length = 0
        for line in status_and_headers.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        payload = await self.reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {payload[:200]!r}")
        return payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def request_of(style: str, query: str, k: int) -> tuple[str, bytes]:
    """(path, JSON body) of one single-query request: ours ``POST /search``, Search-R1's ``POST /retrieve``."""
    if style == "searchr1":
        # return_scores true, as Search-R1's own rollout client sends it: their endpoint unpacks (results, scores)
        # and answers 500 without scores
        return "/retrieve", orjson.dumps({"queries": [query], "topk": k, "return_scores": True})
    return "/search", orjson.dumps({"query": query, "top_n": k})


async def _client_run(url: str, queries: list[str], clients: int, k: int, barrier: Any, style: str = "ours"
                      ) -> tuple:
    """One load-generator process: ``clients`` keep-alive connections, warmed up, then send ``queries``."""
    latencies: list[float] = []
    path = request_of(style, "", k)[0]
    bodies = [request_of(style, q, k)[1] for q in queries]
    todo = iter(bodies)

    async def worker(conn: _RawHTTP) -> None:
        for body in todo:
            t0 = time.perf_counter()
            await conn.post(path, body)
            latencies.append(time.perf_counter() - t0)

    conns = [_RawHTTP(url) for _ in range(clients)]
    try:
        todo = iter(bodies[: 2 * clients])  # warm-up: open the connections
        await asyncio.gather(*(worker(c) for c in conns))
        latencies.clear()
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        todo = iter(bodies)
        c0 = time.process_time()
        await asyncio.gather(*(worker(c) for c in conns))
        return latencies, time.process_time() - c0, time.monotonic()
    finally:
        for c in conns:
            c.close()


def _client_proc(url: str, queries: list[str], clients: int, k: int, barrier: Any, out: Any,
                 style: str = "ours") -> None:
    out.put(asyncio.run(_client_run(url, queries, clients, k, barrier, style)))


def _load(url: str, queries: list[str], clients: int, k: int, pid: int, procs: int, style: str = "ours"
          ) -> dict[str, float]:
    """Drive ``clients`` concurrent keep-alive connections spread over ``procs`` processes; time the whole run."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = max(1, min(procs, clients))
    barrier, out = ctx.Barrier(procs + 1), ctx.Queue()
    shares = [clients // procs + (i < clients % procs) for i in range(procs)]
    children = [ctx.Process(target=_client_proc, args=(url, queries[i::procs], shares[i], k, barrier, out, style))
                for i in range(procs)]
    for child in children:
        child.start()
    barrier.wait()
    t0, s0 = time.monotonic(), _cpu_seconds(pid)
    results = [out.get() for _ in children]
    server_cpu = _cpu_seconds(pid) - s0
    for child in children:
        child.join()
    latencies = sorted(lat for res in results for lat in res[0])
    n, wall = len(latencies), max(res[2] for res in results) - t0
    return {
        "qps": n / wall,
        "server_cpu_ms": 1000 * server_cpu / n,
        "client_cpu_ms": 1000 * sum(res[1] for res in results) / n,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(n - 1, int(0.99 * n))],
        "requests": n,
    }


def _stats(url: str) -> dict[str, Any]:
    from retrieval.client import RetrieverClient

    with RetrieverClient(url, retries=2) as client:
        return client.health()["stats"]


def http_rows(
    url: str, pid: int, queries: list[str], levels: list[int], k: int, min_requests: int, procs: int,
    server_processes: int = 1, style: str = "ours",
) -> dict[int, dict]:
    """Throughput/latency per concurrency level, each level over fresh unique queries (``style``: ours or
    searchr1, whose server has no ``/health`` statistics)."""
    rows = {}
    offset = 0
    for c in levels:
        n = max(min_requests, 10 * c)
        chunk = [queries[(offset + i) % len(queries)] for i in range(n)]
        offset += n
        empty = {"searcher_calls": 0, "searched_queries": 0}
        before = _stats(url) if style == "ours" else empty
        rows[c] = r = _load(url, chunk, c, k, pid, procs, style)
        after = _stats(url) if style == "ours" else empty
        calls = after["searcher_calls"] - before["searcher_calls"]
        # /health reports the process that answered it: the mean batch is only known for one process
        known = server_processes == 1 and style == "ours"
        r["mean_batch"] = ((after["searched_queries"] - before["searched_queries"]) / max(calls, 1)
                           if known else float("nan"))
        searched = max(after["searched_queries"] - before["searched_queries"], 1)
        r["search_cpu_ms"] = (1000 * (after.get("search_cpu_s", 0) - before.get("search_cpu_s", 0)) / searched
                              if known else float("nan"))
        r["load_avg"] = os.getloadavg()[0]
        print(f"  {c:>3} clients: {r['qps']:8.1f} q/s  p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  "
              f"server cpu {r['server_cpu_ms']:.2f} ms/q  client cpu {r['client_cpu_ms']:.2f} ms/q  "
              f"(in the searcher {r['search_cpu_ms']:.2f})  mean batch {r['mean_batch']:.1f}  "
              f"load avg {r['load_avg']:.1f}", flush=True)
    return rows


def run_backend(backend: str, args: argparse.Namespace, queries: list[str], tmp: Path) -> dict[str, Any]:
    index_dir = build(backend, args.passages, tmp)
    top = max(args.clients)
    batch_queries = queries[: args.inprocess_queries]
    threads = args.inprocess_threads or args.processes * args.workers  # as many searches at once as the server
    inproc, inproc_cpu = in_process(index_dir, batch_queries, args.k, threads)
    inproc_top, inproc_top_cpu = in_process(index_dir, batch_queries, args.k, threads, chunk=top)
    single_cpu = in_process_single(index_dir, queries[:32], args.k)
    print(f"[{backend}] in-process batched ({threads} thread(s)), {len(batch_queries)} queries split over the "
          f"threads, one call each: {inproc:.1f} q/s, cpu {inproc_cpu:.2f}"
          f" ms/q; calls of {top} (the largest batch {top} clients can form): {inproc_top:.1f} q/s, cpu "
          f"{inproc_top_cpu:.2f} ms/q; one query per call: cpu {single_cpu:.2f} ms/q", flush=True)
    out: dict[str, Any] = {"backend": backend, "in_process_qps": inproc, "in_process_cpu_ms": inproc_cpu,
                           f"in_process_{top}_qps": inproc_top, f"in_process_{top}_cpu_ms": inproc_top_cpu,
                           "in_process_single_cpu_ms": single_cpu}
    for name, batching in (("server", True), ("baseline", False)):
        print(f"[{backend}] {name} (batching={batching})", flush=True)
        procs = args.processes if batching else 1  # the baseline is the seeds' single process
        with server_process(index_dir, batching, args.workers, args.torch_threads, args.max_wait_ms,
                            args.max_batch, procs) as (url, pid):
            out[name] = http_rows(url, pid, queries, args.clients, args.k, args.min_requests, args.client_procs,
                                  procs)
            if batching and args.repeats > 1:  # interleaved pairs: the machine's speed drifts between phases
                pairs = [(inproc_top, out[name][top]["qps"])]
                for _ in range(args.repeats - 1):
                    ref = in_process(index_dir, batch_queries, args.k, threads, chunk=top)[0]
                    got = http_rows(url, pid, queries, [top], args.k, args.min_requests, args.client_procs,
                                    procs)[top]["qps"]
                    pairs.append((ref, got))
                ratios = sorted(got / ref for ref, got in pairs)
                out["repeat_pairs"] = pairs
                out[f"server_vs_in_process_{top}_median"] = statistics.median(ratios)
                print(f"[{backend}] server/in-process calls of {top}, {len(pairs)} interleaved pairs: "
                      + ", ".join(f"{r:.2f}" for r in ratios) + f" (median {statistics.median(ratios):.2f})",
                      flush=True)
    for name, v in parse_variants(args.server_variants, args).items():
        print(f"[{backend}] {name} (batching=True, workers {v['workers']}, max batch {v['max_batch']}, max wait "
              f"{v['wait']} ms, torch threads {v['torch_threads']})", flush=True)
        with server_process(index_dir, True, v["workers"], v["torch_threads"], v["wait"], v["max_batch"],
                            args.processes) as (url, pid):
            out[name] = http_rows(url, pid, queries, args.clients, args.k, args.min_requests, args.client_procs,
                                  args.processes)
        out.setdefault("variants", []).append(name)
    if args.fixed_mmap:
        # the regression of 2026-11-26: flows/cli.py fixed glibc's mmap threshold at 128 KiB for every command
        # (2026-11-25 .. 2026-11-27), so the server mmapped and faulted in every buffer above 128 KiB
        print(f"[{backend}] server_fixed_mmap (batching=True, MALLOC_MMAP_THRESHOLD_=131072)", flush=True)
        with server_process(index_dir, True, args.workers, args.torch_threads, args.max_wait_ms, args.max_batch,
                            args.processes, {"MALLOC_MMAP_THRESHOLD_": "131072"}) as (url, pid):
            out["server_fixed_mmap"] = http_rows(url, pid, queries, args.clients, args.k, args.min_requests,
                                                 args.client_procs, args.processes)
        out["server_vs_fixed_mmap"] = out["server"][top]["qps"] / out["server_fixed_mmap"][top]["qps"]
    if args.searchr1 is not None and backend == "dense":
        print(f"[{backend}] searchr1 (their retrieval_server.py on CPU, one batch_search per request)", flush=True)
        with searchr1_process(args.searchr1, index_dir, args.torch_threads, args.k) as (url, pid):
            out["searchr1"] = http_rows(url, pid, queries, args.clients, args.k, args.min_requests,
                                        args.client_procs, 1, style="searchr1")
        out["server_vs_searchr1"] = out["server"][top]["qps"] / out["searchr1"][top]["qps"]
    out["server_vs_in_process"] = out["server"][top]["qps"] / inproc
    out[f"server_vs_in_process_{top}"] = out["server"][top]["qps"] / inproc_top
    out["server_vs_baseline"] = out["server"][top]["qps"] / out["baseline"][top]["qps"]
    out["cpu_efficiency"] = inproc_cpu / out["server"][top]["server_cpu_ms"]
    return out


def parse_variants(spec: str | None, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``"workers=1/max_batch=64,wait=10"`` -> {mode name: settings}; unnamed settings are the command line's."""
    keys = {"workers": int, "max_batch": int, "wait": float, "torch_threads": int}
    out: dict[str, dict[str, Any]] = {}
    for part in filter(None, (spec or "").split(",")):
        v = {"workers": args.workers, "max_batch": args.max_batch, "wait": args.max_wait_ms,
             "torch_threads": args.torch_threads}
        for item in part.strip().split("/"):
            key, _, value = item.partition("=")
            try:
                v[key] = keys[key](value)
            except (KeyError, ValueError):
                raise SystemExit(f"--server-variants: {item!r} is not one of {sorted(keys)}=<number>, e.g. "
                                 "'wait=10,workers=1/max_batch=64'") from None
        out["server_" + part.strip().replace("/", "_").replace("=", "")] = v
    return out


def print_table(results: list[dict[str, Any]], levels: list[int]) -> None:
    top = max(levels)
    print("\nbackend   mode        clients      q/s   p50 ms   p99 ms  server cpu ms/q  client cpu ms/q  batch")
    for res in results:
        print(f"{res['backend']:<9} in-process      all  {res['in_process_qps']:7.1f}        -        -  "
              f"{res['in_process_cpu_ms']:15.2f}                -")
        print(f"{res['backend']:<9} in-process {top:>8}  {res[f'in_process_{top}_qps']:7.1f}        -        -  "
              f"{res[f'in_process_{top}_cpu_ms']:15.2f}                -")
        for mode in ("server", *res.get("variants", []), "server_fixed_mmap", "baseline", "searchr1"):
            for c in levels if mode in res else ():
                r = res[mode][c]
                print(f"{res['backend']:<9} {mode:<17} {c:>8}  {r['qps']:7.1f}  {r['p50_ms']:7.1f}  "
                      f"{r['p99_ms']:7.1f}  {r['server_cpu_ms']:15.2f}  {r['client_cpu_ms']:15.2f}  "
                      f"{r['mean_batch']:5.1f}")
    print()
    for res in results:
        print(f"{res['backend']}: server/in-process at {top} clients = {res['server_vs_in_process']:.2f} against one "
              f"call of all queries, {res[f'server_vs_in_process_{top}']:.2f} against calls of {top} "
              + (f" (median of {len(res['repeat_pairs'])} interleaved pairs: "
                 f"{res[f'server_vs_in_process_{top}_median']:.2f})" if "repeat_pairs" in res else "")
              + f" (target >= 0.9); server/baseline at {top} clients = {res['server_vs_baseline']:.2f} (target >= 5); "
              f"search share of server CPU (in-process cpu/q / server cpu/q) = {res['cpu_efficiency']:.2f}"
              + (f"; server/the same server with the 2026-11-26 fixed mmap threshold at {top} clients = "
                 f"{res['server_vs_fixed_mmap']:.2f}" if "server_vs_fixed_mmap" in res else "")
              + (f"; server/Search-R1's server at {top} clients = {res['server_vs_searchr1']:.2f} (target >= 10)"
                 if "server_vs_searchr1" in res else ""))
        for name in res.get("variants", []):
            qps = res[name][top]["qps"]
            print(f"  {name}: {qps:.1f} q/s at {top} clients = {qps / res[f'in_process_{top}_qps']:.2f}x in-process "
                  f"calls of {top}" + (f", {qps / res['searchr1'][top]['qps']:.2f}x Search-R1's server"
                                        if "searchr1" in res else "")
                  + f" (mean batch {res[name][top]['mean_batch']:.1f})")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="dense,bm25", help="Comma list of dense, bm25.")
    p.add_argument("--passages", type=int, default=1000, help="Passages of the mini corpus in the dense index.")
    p.add_argument("--clients", default="1,16,64", help="Concurrency levels.")
    p.add_argument("--k", type=int, default=5, help="Documents per query.")
    p.add_argument("--min-requests", type=int, default=160, help="Requests per level (at least 10 x clients).")
    p.add_argument("--inprocess-queries", type=int, default=1024, help="Queries in the in-process batch.")
    p.add_argument("--json", type=Path, default=None, help="Also write the results here.")
    p.add_argument("--work-dir", type=Path, default=None, help="Keep (and reuse) the built indexes here.")
    p.add_argument("--client-procs", type=int, default=1, help="Processes the concurrent clients are spread over "
                   "(each an asyncio loop driving its share of raw keep-alive connections).")
    p.add_argument("--max-wait-ms", type=float, default=10.0, help="Server adaptive micro-batch wait "
                   "(the server's default since session 21; 2.0 before).")
    p.add_argument("--max-batch", type=int, default=256, help="Server micro-batch cap (with N workers and C "
                   "closed-loop clients, C/N keeps every worker busy: one batch of all C leaves the others idle).")
    p.add_argument("--processes", type=int, default=1, help="Batching server processes on the port (each with "
                   "--workers batch threads); the in-process reference stays one process with --workers threads.")
    p.add_argument("--inprocess-threads", type=int, default=None, help="Threads of the in-process reference "
                   "(default: processes x workers, the searches the server can run at once).")
    p.add_argument("--repeats", type=int, default=1, help="Interleaved (in-process calls of N, server at N clients) "
                   "pairs at the top level; their median ratio is reported (the machine's speed drifts).")
    p.add_argument("--torch-threads", type=int, default=1, help="Intra-op threads, in-process and in the servers.")
    p.add_argument("--workers", type=int, default=1, help="Parallel batches: server micro-batch workers and "
                   "in-process threads (the baseline server always uses its 8-thread pool).")
    p.add_argument("--searchr1", type=Path, default=None, help="A checkout of PeterGriffinJin/Search-R1: also "
                   "measure its own search_r1/search/retrieval_server.py on CPU over the dense index (the issue-26 "
                   "anchor; benchmarks/searchr1_server_cpu.py).")
    p.add_argument("--server-variants", default=None, help="Comma-separated extra batching-server settings, each "
                   "'/'-joined key=value among workers, max_batch, wait (ms), torch_threads; e.g. "
                   "'wait=10,workers=1/max_batch=64/torch_threads=2'.")
    p.add_argument("--fixed-mmap", action="store_true", help="Also run our server with glibc's mmap threshold "
                   "fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_), the CLI's setting of 2026-11-25..27: the regression.")
    p.add_argument("--query-backend", choices=QUERY_BACKENDS, default=None,
                   help="What encodes the dense index's queries, in process and in our servers "
                   "(EncoderConfig.query_backend; default: the index's, torch). Search-R1's server keeps its own.")
    p.add_argument("--query-model", default=None,
                   help="A query encoder distilled for the dense index (`searchloop index distill-queries --index "
                   "<work-dir>/dense`), in process and in our servers (EncoderConfig.query_model). Search-R1's server "
                   "keeps its own.")
    args = p.parse_args(argv)
    global QUERY_BACKEND, QUERY_MODEL
    QUERY_BACKEND, QUERY_MODEL = args.query_backend, args.query_model
    parse_variants(args.server_variants, args)  # a typo fails here, not after the index and the reference ran
    server_file = Path("search_r1") / "search" / "retrieval_server.py"
    if args.searchr1 is not None and not (args.searchr1 / server_file).is_file():
        p.error(f"--searchr1 {args.searchr1}: no {server_file} there; pass a checkout of PeterGriffinJin/Search-R1")
    from infra.machine import describe

    print(f"machine: {describe()}")  # dtype, CPU flags, threads, load (the numbers below depend on them)
    args.clients = [int(c) for c in args.clients.split(",")]
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.torch_threads)
    import torch  # already imported by describe() above, so the variables alone no longer set its threads

    torch.set_num_threads(args.torch_threads)  # the in-process reference runs what the servers run
    queries = load_queries(4096)
    print(f"{len(queries)} unique queries; cpu cores: {os.cpu_count()}; torch threads {args.torch_threads}; "
          f"query encoder {args.query_backend or 'torch'}; workers {args.workers}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="searchloop-bench-") as tmp:
        work = args.work_dir or Path(tmp)
        for backend in args.backends.split(","):
            results.append(run_backend(backend.strip(), args, queries, work))
    print_table(results, args.clients)
    if args.json:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


if __name__ == "__main__":
    main()
