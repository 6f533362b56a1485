"""Micro-batching and the query cache: unit tests on fakes, then a live server with a counting searcher."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from infra.http import serve_in_thread
from retrieval.batching import (
    MicroBatcher,
    OverloadedError,
    PerRequestRunner,
    QueryCache,
    SearchBackendError,
    SearchService,
)
from retrieval.bm25 import BM25Searcher
from retrieval.corpus import read_corpus
from retrieval.server import ServerConfig, create_app
from retrieval.types import Hit


class CountingSearcher:
    """Wraps a searcher (or fakes one) and records every call; optionally slow, to let requests pile up."""

    name = "counting"

    def __init__(self, inner=None, delay_s: float = 0.0) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.calls: list[tuple[list[str], int]] = []
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        with self._lock:
            self.calls.append((list(queries), k))
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.inner is not None:
            return self.inner.search(queries, k)
        return [[Hit(id=f"{q}-{i}", text=q, score=float(k - i)) for i in range(k)] for q in queries]


def _run(coro):
    return asyncio.run(coro)


def test_concurrent_submits_share_searcher_calls() -> None:
    fake = CountingSearcher(delay_s=0.02)

    async def main():
        batcher = MicroBatcher(fake.search, max_batch_queries=64, max_wait_s=0.005)
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit([f"q{i}"], 1 + i % 5) for i in range(40))), batcher
        finally:
            await batcher.close()

    results, batcher = _run(main())
    assert len(fake.calls) < 10, f"{len(fake.calls)} searcher calls for 40 requests"
    assert batcher.calls == len(fake.calls)
    for i, res in enumerate(results):
        k = 1 + i % 5
        assert [h.id for h in res[0]] == [f"q{i}-{j}" for j in range(k)], "each request gets its own k"
    # a batch asks the searcher once, for the largest k among its requests
    assert max(k for _, k in fake.calls) == 5


def test_no_wait_still_coalesces_requests_queued_together() -> None:
    fake = CountingSearcher(delay_s=0.02)

    async def main():
        batcher = MicroBatcher(fake.search)  # max_wait_s=0: no added latency when idle
        await batcher.start()
        try:
            t0 = time.perf_counter()
            await batcher.submit(["alone"], 1)
            idle_latency = time.perf_counter() - t0
            await asyncio.gather(*(batcher.submit([f"q{i}"], 1) for i in range(30)))
            return idle_latency
        finally:
            await batcher.close()

    idle_latency = _run(main())
    assert idle_latency < 0.5
    assert [len(q) for q, _ in fake.calls][0] == 1
    assert len(fake.calls) <= 3, f"30 queued requests took {len(fake.calls) - 1} searcher calls"


class ParallelProbe:
    """A slow searcher (50 ms a call) recording each call's size and how many calls ran at once at most."""

    def __init__(self) -> None:
        self.active, self.peak = 0, 0
        self.sizes: list[int] = []
        self._lock = threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.sizes.append(len(queries))
        time.sleep(0.05)
        with self._lock:
            self.active -= 1
        return [[Hit(id=q, text=q, score=1.0)] for q in queries]

    def submit_all(self, n: int, **batcher_kwargs) -> list:
        """``n`` single-query requests submitted at once to a MicroBatcher over this searcher; their results."""

        async def main():
            batcher = MicroBatcher(self.search, **batcher_kwargs)
            await batcher.start()
            try:
                return await asyncio.gather(*(batcher.submit([f"q{i}"], 1) for i in range(n)))
            finally:
                await batcher.close()

        return _run(main())


def test_workers_run_batches_in_parallel() -> None:
    probe = ParallelProbe()
    results = probe.submit_all(8, max_batch_queries=2, workers=2)
    assert [r[0][0].id for r in results] == [f"q{i}" for i in range(8)]
    assert probe.peak == 2


def test_workers_share_the_demand_whatever_the_cap() -> None:
    """Two workers, a cap far above the load: 16 queued queries become two batches of 8 searched at once, not one
    batch of 16 with the second worker idle (what a cap above C / workers did before)."""
    probe = ParallelProbe()
    results = probe.submit_all(16, max_batch_queries=256, workers=2)
    assert [r[0][0].id for r in results] == [f"q{i}" for i in range(16)]
    assert probe.sizes == [8, 8] and probe.peak == 2


def test_duplicate_queries_searched_once_per_batch() -> None:
    fake = CountingSearcher(delay_s=0.01)

    async def main():
        batcher = MicroBatcher(fake.search, max_wait_s=0.01)
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit(["same", "same", "other"], 2) for _ in range(5)))
        finally:
            await batcher.close()

    results = _run(main())
    assert all(r == results[0] for r in results)
    searched = [q for queries, _ in fake.calls for q in queries]
    assert searched.count("same") == len(fake.calls)


def test_max_batch_closes_a_batch_early() -> None:
    fake = CountingSearcher()

    async def main():
        batcher = MicroBatcher(fake.search, max_batch_queries=4, max_wait_s=1.0)
        await batcher.start()
        try:
            t0 = time.perf_counter()
            await asyncio.gather(*(batcher.submit([f"q{i}"], 1) for i in range(8)))
            return time.perf_counter() - t0
        finally:
            await batcher.close()

    elapsed = _run(main())
    assert elapsed < 0.9, "a full batch must not wait for max_wait_s"
    assert [len(q) for q, _ in fake.calls] == [4, 4]


def test_searcher_exception_fails_the_whole_batch() -> None:
    def boom(queries, k):
        raise ValueError("bad index")

    async def main():
        batcher = MicroBatcher(boom, max_wait_s=0.005)
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit([f"q{i}"], 1) for i in range(3)), return_exceptions=True)
        finally:
            await batcher.close()

    errors = _run(main())
    assert all(isinstance(e, SearchBackendError) and "ValueError: bad index" in str(e) for e in errors)


def test_queue_bound_raises_overloaded() -> None:
    fake = CountingSearcher(delay_s=0.1)

    async def main():
        batcher = MicroBatcher(fake.search, max_wait_s=0.0, max_pending_queries=3)
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.submit([f"q{i}"], 1) for i in range(6)), return_exceptions=True)
        finally:
            await batcher.close()

    out = _run(main())
    assert sum(isinstance(o, OverloadedError) for o in out) == 3
    assert sum(isinstance(o, list) for o in out) == 3


def test_per_request_runner_calls_once_per_request() -> None:
    fake = CountingSearcher(delay_s=0.01)

    async def main():
        runner = PerRequestRunner(fake.search, threads=4)
        await runner.start()
        try:
            await asyncio.gather(*(runner.submit([f"q{i}"], 2) for i in range(10)))
        finally:
            await runner.close()

    _run(main())
    assert len(fake.calls) == 10


def test_query_cache_is_lru() -> None:
    h = [Hit(id="1", text="t", score=1.0)]
    cache = QueryCache(2 * QueryCache.entry_size("a", h))
    cache.put("a", 1, h)
    cache.put("b", 1, h)
    assert cache.get("a", 1) == h  # refresh "a"
    cache.put("c", 1, h)  # evicts "b"
    assert cache.get("b", 1) is None and cache.get("a", 1) == h and cache.get("c", 1) == h
    assert cache.get("a", 2) is None
    assert (cache.hits, cache.misses, len(cache)) == (3, 2, 2)
    disabled = QueryCache(0)
    disabled.put("a", 1, h)
    assert disabled.get("a", 1) is None and len(disabled) == 0


def test_query_cache_is_bounded_in_bytes_whatever_k() -> None:
    """Large hits (k=100 of long passages) evict by size: the total never passes the byte bound."""
    budget = 200_000
    cache = QueryCache(budget)
    big = [Hit(id=str(i), title="t" * 50, text="x" * 1000, score=1.0) for i in range(100)]
    for i in range(50):
        cache.put(f"q{i}", 100, big)
        assert cache.bytes <= budget
    assert 0 < len(cache) < 50 and cache.get("q49", 100) == big and cache.get("q0", 100) is None
    small = QueryCache(1000)
    small.put("a", 100, big)  # one entry over the whole budget is not cached
    assert len(small) == 0 and small.bytes == 0


def test_service_serves_repeats_from_cache() -> None:
    fake = CountingSearcher()

    async def main():
        service = SearchService(MicroBatcher(fake.search, max_wait_s=0.0), QueryCache(100_000))
        await service.runner.start()
        try:
            first = await service.search(["x", "y"], 3)
            second = await service.search(["y", "x", "z"], 3)
            return first, second
        finally:
            await service.runner.close()

    first, second = _run(main())
    assert second[0] == first[1] and second[1] == first[0]
    assert [q for q, _ in fake.calls] == [["x", "y"], ["z"]]


@pytest.mark.slow
@pytest.mark.parametrize("batching", [True, False])
def test_live_server_batches_concurrent_requests(mini_corpus_path, batching: bool) -> None:
    bm25 = BM25Searcher.build(read_corpus(mini_corpus_path))
    counting = CountingSearcher(bm25, delay_s=0.01)
    cfg = ServerConfig(cache_bytes=0, batching={"enabled": batching})
    queries = [f"film directed in {1950 + i}" for i in range(48)]
    with (
        serve_in_thread(create_app(counting, cfg)) as url,
        httpx.Client(base_url=url, timeout=30) as client,
        ThreadPoolExecutor(16) as pool,
    ):
        bodies = list(pool.map(lambda q: client.post("/search", json={"query": q, "top_n": 3}).json(), queries))
    expected = bm25.search(queries, 3)
    assert [[d["id"] for d in docs] for docs in bodies] == [[h.id for h in hits] for hits in expected]
    if batching:
        assert len(counting.calls) < len(queries) / 3, f"{len(counting.calls)} calls for {len(queries)} requests"
    else:
        assert len(counting.calls) == len(queries)


def test_adaptive_wait_merges_returning_clients_and_never_delays_a_lone_request() -> None:
    """Closed-loop clients: after a batch of 8, the next 4 + 4 (arriving 15 ms apart) form ONE batch (a batch's
    search takes 100 ms, so waiting 15 ms is worth it); a lone request on a fresh batcher is answered at once even
    with a long max_wait; a cheap backend never waits long."""
    fake = CountingSearcher(delay_s=0.1)

    async def main():
        batcher = MicroBatcher(fake.search, max_batch_queries=64, max_wait_s=2.0)
        await batcher.start()
        try:
            t0 = time.perf_counter()
            await batcher.submit(["alone"], 1)
            lone = time.perf_counter() - t0
            await asyncio.gather(*(batcher.submit([f"a{i}"], 1) for i in range(8)))

            async def late(i: int) -> None:
                await asyncio.sleep(0.015)
                await batcher.submit([f"c{i}"], 1)

            await asyncio.gather(*(batcher.submit([f"b{i}"], 1) for i in range(4)), *(late(i) for i in range(4)))
            return lone
        finally:
            await batcher.close()

    lone = _run(main())
    assert lone < 1.0  # the 100 ms search, none of the 2 s wait on top (loose: CI machines are busy)
    sizes = [len(q) for q, _ in fake.calls]
    assert sizes == [1, 8, 8], sizes

    cheap = CountingSearcher(delay_s=0.001)  # the wait is capped at a quarter of a batch's search time

    async def cheap_main():
        batcher = MicroBatcher(cheap.search, max_batch_queries=64, max_wait_s=5.0)
        await batcher.start()
        try:
            await asyncio.gather(*(batcher.submit([f"a{i}"], 1) for i in range(8)))
            t0 = time.perf_counter()
            await batcher.submit(["alone"], 1)  # fewer than the recent 8: may wait, but only ~0.25 ms
            return time.perf_counter() - t0
        finally:
            await batcher.close()

    assert _run(cheap_main()) < 1.0  # far below the 5 s max_wait
