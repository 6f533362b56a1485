"""Request coalescing for the retriever server: an LRU query cache, a micro-batcher and the per-request baseline.

:class:`MicroBatcher` takes every query waiting in an asyncio queue (after one event-loop turn; at most
``max_batch_queries``), runs ONE ``searcher.search(unique_queries, max_k)`` in a dedicated worker thread and hands
each request its slice, truncated to its own k. While a batch runs, new requests queue up and form the next batch,
so batches grow with load by themselves. With ``max_wait_s`` > 0 the wait is adaptive: a batch smaller than the
recent ones waits up to ``max_wait_s`` (and at most a quarter of a recent batch's search time) for the rest of the
clients whose answers just went out (closed-loop clients otherwise split into alternating big and small batches),
and a lone request never waits. With ``workers > 1``,
that many batches run at once (each in its own thread: on CPU, two single-threaded encoder calls in parallel
scale better on a busy machine than one call with two intra-op threads), and the recent demand (queries waiting or
being searched) is shared between them: a batch takes at most its worker's share, so C closed-loop clients form
batches of about C / workers whatever ``max_batch_queries`` is (with a cap above that share, one worker used to take
nearly every query while the other idled: 288 against 470 q/s at 64 clients, docs/results/engines/cpu_session21.md).
Truncating the top-``max_k`` list to k is exact for exhaustive backends (BM25, faiss Flat) and may differ marginally for
approximate ones (HNSW, IVF-PQ) whose candidate lists depend on k.

:class:`PerRequestRunner` is the seeds' pattern (one ``search`` per request in a thread pool); it exists as the
baseline the benchmark compares against. :class:`SearchService` puts the cache in front of either.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from infra.errors import ConfigError
from retrieval.types import Hit

log = logging.getLogger(__name__)

SearchFn = Callable[[list[str], int], list[list[Hit]]]


class SearchBackendError(RuntimeError):
    """The searcher raised or returned a malformed result; the server answers 503."""


class OverloadedError(RuntimeError):
    """Too many queries are waiting; the server answers 503 with Retry-After."""


class QueryCache:
    """LRU map ``(query, k) -> hits`` bounded in bytes; ``max_bytes=0`` disables it. Used from the event loop only.

    An entry's size is estimated from what it holds (query, ids, titles, texts, plus a fixed per-hit and per-entry
    overhead), so the bound holds whatever k and passage lengths clients ask for. An entry larger than the whole
    budget is not cached.
    """

    ENTRY_OVERHEAD = 200
    HIT_OVERHEAD = 250

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[tuple[str, int], tuple[list[Hit], int]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    @classmethod
    def entry_size(cls, query: str, hits: list[Hit]) -> int:
        """Estimated bytes held by one entry."""
        return cls.ENTRY_OVERHEAD + len(query) + sum(
            cls.HIT_OVERHEAD + len(h.id) + len(h.title) + len(h.text) for h in hits)

    def get(self, query: str, k: int) -> list[Hit] | None:
        """Return the cached hits (refreshing recency) or None."""
        if self.max_bytes <= 0:
            return None
        value = self._data.get((query, k))
        if value is None:
            self.misses += 1
            return None
        self._data.move_to_end((query, k))
        self.hits += 1
        return value[0]

    def put(self, query: str, k: int, hits: list[Hit]) -> None:
        """Store hits, evicting least recently used entries until the total fits ``max_bytes``."""
        size = self.entry_size(query, hits)
        if self.max_bytes <= 0 or size > self.max_bytes:
            return
        old = self._data.pop((query, k), None)
        if old is not None:
            self.bytes -= old[1]
        self._data[(query, k)] = (hits, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._data.popitem(last=False)
            self.bytes -= dropped

    def __len__(self) -> int:
        return len(self._data)


class SearchClock:
    """Wall and CPU seconds spent inside the searcher (thread CPU of the calling worker thread)."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self._lock = threading.Lock()

    def add(self, wall: float, cpu: float) -> None:
        """Add one call's times (called from worker threads)."""
        with self._lock:
            self.wall_s += wall
            self.cpu_s += cpu


def _checked_search(search: SearchFn, queries: list[str], k: int, clock: SearchClock | None = None
                    ) -> list[list[Hit]]:
    """Run the searcher and check its result shape, wrapping any failure in SearchBackendError."""
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        out = search(queries, k)
    except Exception as exc:  # the searcher is arbitrary backend code; every failure becomes a 503
        raise SearchBackendError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        if clock is not None:
            clock.add(time.perf_counter() - t0, time.thread_time() - c0)
    if not isinstance(out, list) or len(out) != len(queries):
        raise SearchBackendError(f"searcher returned {type(out).__name__} for {len(queries)} queries")
    return out


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future[list[list[Hit]]] = field(repr=False)


class MicroBatcher:
    """Coalesce concurrent ``submit`` calls into single searcher calls (see the module docstring)."""

    def __init__(
        self,
        search: SearchFn,
        max_batch_queries: int = 256,
        max_wait_s: float = 0.0,
        max_pending_queries: int = 8192,
        workers: int = 1,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        self._search = search
        self.workers = workers
        self.max_batch_queries = max_batch_queries
        self.max_wait_s = max_wait_s
        self.max_pending_queries = max_pending_queries
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._pending_queries = 0
        self._expected = 1.0  # recent demand (a decaying maximum of queries in flight): the workers' shares
        self._batch_s = 0.0  # recent wall time of one batch's search (moving average): caps the wait
        self.calls = 0
        self.searched_queries = 0
        self.clock = SearchClock()

    async def start(self) -> None:
        """Start the collector task on the running loop."""
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="searcher")
        self._task = asyncio.create_task(self._run(), name="micro-batcher")

    async def close(self) -> None:
        """Stop collecting, fail waiting requests and release the worker thread."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        if self._queue is not None:
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if not item.future.done():
                    item.future.set_exception(OverloadedError("server is shutting down"))
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Queue ``queries`` and wait for their top-``k`` hits.

        Raises:
            OverloadedError: more than ``max_pending_queries`` would be waiting.
            SearchBackendError: the batch this request joined failed.
        """
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not awaited")
        if self._pending_queries + len(queries) > self.max_pending_queries:
            raise OverloadedError(f"{self._pending_queries} queries are already waiting; retry shortly")
        future: asyncio.Future[list[list[Hit]]] = asyncio.get_running_loop().create_future()
        self._pending_queries += len(queries)
        self._queue.put_nowait(_Pending(queries, k, future))
        try:
            return await future
        finally:
            self._pending_queries -= len(queries)

    async def _collect(self, queue: asyncio.Queue[_Pending]) -> list[_Pending]:
        """The next batch: the first waiting request, everything queued behind it (after one loop turn), and, when
        ``max_wait_s`` > 0 and fewer queries came than the recent batches held, whatever else arrives within
        ``max_wait_s`` until that many are in. Under steady load from C closed-loop clients the recent size is
        about C / workers, so batches stop alternating between big and small; a lone client never waits."""
        loop = asyncio.get_running_loop()
        batch = [await queue.get()]
        size = len(batch[0].queries)
        # demand: every query waiting or being searched (recent maximum); each worker's share of it
        share = max(1, round(max(self._expected, self._pending_queries) / self.workers))
        limit = self.max_batch_queries if self.workers == 1 else min(self.max_batch_queries, share)
        target = min(limit, share)
        # never idle longer than a quarter of what a batch takes to search (cheap backends: BM25)
        deadline = loop.time() + min(self.max_wait_s, 0.25 * self._batch_s)
        yielded = False
        while size < limit:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if not yielded:
                    # one loop turn lets requests whose bodies already arrived join this batch
                    yielded = True
                    await asyncio.sleep(0)
                    continue
                if remaining <= 0 or size >= target:
                    break
                try:
                    item = await asyncio.wait_for(queue.get(), remaining)
                except TimeoutError:
                    break
            batch.append(item)
            size += len(item.queries)
        # decays when the load drops; with one worker nothing else is in flight, so this is the batch's size
        self._expected = max(float(self._pending_queries if self.workers > 1 else size), self._expected * 0.9)
        return batch

    async def _run(self) -> None:
        queue = self._queue
        if queue is None:
            return
        slots = asyncio.Semaphore(self.workers)
        while True:
            await slots.acquire()  # collect the next batch only when a worker is free to run it
            batch = [item for item in await self._collect(queue) if not item.future.done()]
            if not batch:
                slots.release()
                continue
            task = asyncio.create_task(self._execute(batch, slots))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _execute(self, batch: list[_Pending], slots: asyncio.Semaphore) -> None:
        loop = asyncio.get_running_loop()
        unique = list(dict.fromkeys(q for item in batch for q in item.queries))
        max_k = max(item.k for item in batch)
        started = loop.time()
        try:
            results = await loop.run_in_executor(self._executor, _checked_search, self._search, unique, max_k,
                                                 self.clock)
            took = loop.time() - started
            self._batch_s = took if self.calls == 0 else 0.8 * self._batch_s + 0.2 * took
        except SearchBackendError as exc:
            log.error("search batch of %d queries failed: %s", len(unique), exc)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        finally:
            slots.release()
        self.calls += 1
        self.searched_queries += len(unique)
        by_query = dict(zip(unique, results, strict=True))
        for item in batch:
            if not item.future.done():
                item.future.set_result([by_query[q][: item.k] for q in item.queries])


class PerRequestRunner:
    """Baseline: each request runs its own ``search`` call in a thread pool (the seeds' servers)."""

    def __init__(self, search: SearchFn, threads: int = 8) -> None:
        self._search = search
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self.calls = 0
        self.searched_queries = 0
        self.clock = SearchClock()

    async def start(self) -> None:
        """Create the thread pool."""
        self._executor = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="searcher")

    async def close(self) -> None:
        """Release the thread pool."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Run one search for this request."""
        self.calls += 1
        self.searched_queries += len(queries)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, _checked_search, self._search, queries, k, self.clock)


class SearchService:
    """Cache in front of a micro-batcher (default) or the per-request baseline."""

    def __init__(self, runner: MicroBatcher | PerRequestRunner, cache: QueryCache) -> None:
        self.runner = runner
        self.cache = cache
        self.requests = 0

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits per query, from the cache where possible, the rest through the runner."""
        self.requests += 1
        out: list[list[Hit] | None] = [self.cache.get(q, k) for q in queries]
        missing = list(dict.fromkeys(q for q, hits in zip(queries, out, strict=True) if hits is None))
        if missing:
            fetched = dict(zip(missing, await self.runner.submit(missing, k), strict=True))
            for q, hits in fetched.items():
                self.cache.put(q, k, hits)
            out = [fetched[q] if hits is None else hits for q, hits in zip(queries, out, strict=True)]
        return out  # type: ignore[return-value]
