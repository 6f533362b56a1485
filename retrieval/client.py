"""Python client of the retriever server, implementing the ``Searcher`` protocol over HTTP.

Everything downstream (rollouts, evaluation) searches through :class:`RetrieverClient` (or its asyncio twin
:class:`AsyncRetrieverClient`). It posts to the server's own ``/v1/search`` (ids, titles, texts and scores), splits
large batches into requests of ``batch_size`` queries, answers blank queries locally with no hits (the server
rejects them), and retries with exponential backoff (tenacity) on connection errors, timeouts, 429 and 5xx.
A 4xx other than 429 is the caller's mistake and raises :class:`RetrieverError` at once, with the server's message.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from tenacity import AsyncRetrying, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from infra.config import secret_value
from infra.errors import ConfigError, SearchloopError
from retrieval.config import TOKEN_ENV
from retrieval.types import Hit

DEFAULT_URL = "http://127.0.0.1:8000"


class RetrieverError(SearchloopError):
    """The retriever rejected a request (4xx) or stayed unreachable/failing after every retry."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Retryable(Exception):
    """A response worth retrying (5xx, 429)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}: {_message(response)}")
        self.status = response.status_code


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    return str(body.get("error", body))[:300] if isinstance(body, dict) else str(body)[:300]


def _check(response: httpx.Response) -> Any:
    """Return the JSON body of a 2xx; raise _Retryable for 5xx/429 and RetrieverError for other 4xx."""
    if response.status_code >= 500 or response.status_code == 429:
        raise _Retryable(response)
    if response.status_code >= 400:
        raise RetrieverError(
            f"retriever rejected {response.request.method} {response.request.url.path} with HTTP "
            f"{response.status_code}: {_message(response)}",
            response.status_code,
        )
    return response.json()


def _parse_hits(body: Any, n: int) -> list[list[Hit]]:
    results = body.get("results") if isinstance(body, dict) else None
    if not isinstance(results, list) or len(results) != n:
        raise RetrieverError(f"malformed /v1/search response for {n} queries: {str(body)[:200]}")
    return [[Hit(**h) for h in hits] for hits in results]


def _chunks(queries: list[str], size: int) -> list[tuple[list[int], list[str]]]:
    """Indices and texts of the non-blank queries, in request-sized chunks."""
    idx = [i for i, q in enumerate(queries) if q.strip()]
    return [(idx[s : s + size], [queries[i] for i in idx[s : s + size]]) for s in range(0, len(idx), size)]


def _give_up(url: str, attempts: int, exc: BaseException) -> RetrieverError:
    status = getattr(exc, "status", None)
    return RetrieverError(
        f"retriever at {url} still failing after {attempts} attempt(s): {type(exc).__name__}: {exc}. "
        "Is it running? Start it with `searchloop serve retriever --corpus data/corpus/mini.jsonl`.",
        status,
    )


class _Base:
    _http_cls: Any = httpx.Client  # the async twin uses httpx.AsyncClient

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        timeout: float = 30.0,
        retries: int = 5,
        token: str | None = None,
        backoff_s: float = 0.25,
        batch_size: int = 256,
    ) -> None:
        if retries < 0 or batch_size < 1:
            raise ConfigError(f"retries must be >= 0 and batch_size >= 1, got {retries} and {batch_size}")
        self.base_url = base_url.rstrip("/")
        self.name = f"remote:{self.base_url}"
        self.timeout = timeout
        self.retries = retries
        self.backoff_s = backoff_s
        self.batch_size = batch_size
        token = secret_value(token, TOKEN_ENV)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = self._http_cls(base_url=self.base_url, timeout=timeout, headers=self._headers)

    def _policy(self) -> dict[str, Any]:
        b = self.backoff_s
        return {
            "stop": stop_after_attempt(self.retries + 1),
            "wait": wait_exponential_jitter(initial=b, max=max(b, 8.0), jitter=b),
            "retry": retry_if_exception_type((httpx.TransportError, _Retryable)),
            "reraise": True,
        }


class RetrieverClient(_Base):
    """Synchronous client; a ``Searcher``.

    Args:
        base_url: server URL, e.g. ``http://127.0.0.1:8000``.
        timeout: seconds per HTTP attempt (connect, read, write, pool).
        retries: retries after the first attempt on connection errors, timeouts, 429 and 5xx.
        token: bearer token if the server requires one.
        backoff_s: first backoff (exponential with jitter, capped at 8 s).
        batch_size: most queries per request (keep <= the server's ``limits.max_queries_per_request``).
    """

    _http_cls = httpx.Client

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            for attempt in Retrying(**self._policy()):
                with attempt:
                    return _check(self._http.request(method, path, **kwargs))
        except (httpx.TransportError, _Retryable) as exc:
            raise _give_up(self.base_url, self.retries + 1, exc) from exc
        raise RetrieverError(f"no attempt was made against {self.base_url}")  # unreachable: stop allows >= 1

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits per query (blank queries get none).

        Raises:
            RetrieverError: on a 4xx (e.g. k above the server cap) or when retries are exhausted.
        """
        out: list[list[Hit]] = [[] for _ in queries]
        for idx, chunk in _chunks(queries, self.batch_size):
            hits = _parse_hits(self._call("POST", "/v1/search", json={"queries": chunk, "k": k}), len(chunk))
            for i, h in zip(idx, hits, strict=True):
                out[i] = h
        return out

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` body (status, index, limits, batching and cache statistics)."""
        return self._call("GET", "/health")

    def wait_until_ready(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Poll ``/health`` until it answers; raise RetrieverError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return _check(self._http.get("/health"))
            except (httpx.TransportError, _Retryable) as exc:
                if time.monotonic() > deadline:
                    raise _give_up(self.base_url, 0, exc) from exc
                time.sleep(0.2)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> RetrieverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRetrieverClient(_Base):
    """asyncio twin of :class:`RetrieverClient` (same arguments); use inside async rollout loops."""

    _http_cls = httpx.AsyncClient

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            async for attempt in AsyncRetrying(**self._policy()):
                with attempt:
                    return _check(await self._http.request(method, path, **kwargs))
        except (httpx.TransportError, _Retryable) as exc:
            raise _give_up(self.base_url, self.retries + 1, exc) from exc
        raise RetrieverError(f"no attempt was made against {self.base_url}")

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` hits per query (blank queries get none); see :meth:`RetrieverClient.search`."""
        out: list[list[Hit]] = [[] for _ in queries]
        for idx, chunk in _chunks(queries, self.batch_size):
            hits = _parse_hits(await self._call("POST", "/v1/search", json={"queries": chunk, "k": k}), len(chunk))
            for i, h in zip(idx, hits, strict=True):
                out[i] = h
        return out

    async def health(self) -> dict[str, Any]:
        """The server's ``/health`` body."""
        return await self._call("GET", "/health")

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRetrieverClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
