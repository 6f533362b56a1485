"""The retriever HTTP service: one FastAPI app serving any ``Searcher`` in every seed's wire format.

Endpoints (shapes in :mod:`retrieval.wire`): ``POST /search``, ``POST /batch_search`` (FlashRAG/ReSearch/
SmartSearch), ``POST /retrieve`` (Search-R1/verl/ASearcher), ``POST /queries`` (R1-Searcher), ``GET /api/search``
(ExSearch), ``POST /v1/search`` (our client), ``GET /health`` and the OpenAPI docs at ``/docs``.

Every request goes through one :class:`retrieval.batching.SearchService`: an LRU cache, then a micro-batcher that
turns concurrent requests into one searcher call (or, with ``batching.enabled=false``, the seeds' per-request
thread pool, kept as the benchmark baseline).

Error policy (all errors are JSON ``{"error": message, "detail": ...}``; a malformed request never gets a 500):
- 401: a token is configured and the ``Authorization: Bearer`` header is missing or wrong (``/health`` and the
  docs stay open so liveness probes work);
- 413: body over ``limits.max_body_bytes``, more than ``limits.max_queries_per_request`` queries, or a query longer
  than ``limits.max_query_chars``;
- 422: bad JSON, missing fields, wrong types (no coercion), an empty query list, an empty/blank query, ``k < 1``,
  or ``k > limits.max_k`` (rejected rather than clamped, so a client never silently gets fewer documents);
- 503 + ``Retry-After``: the searcher raised, or the waiting queue is full; both are worth retrying;
- 500 only for a bug in the server itself (still JSON).
The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, Field, SecretStr, ValidationError, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from infra.config import StrictModel
from infra.errors import ConfigError
from retrieval import wire
from retrieval.batching import (
    MicroBatcher,
    OverloadedError,
    PerRequestRunner,
    QueryCache,
    SearchBackendError,
    SearchService,
)
from retrieval.types import Hit, Searcher

log = logging.getLogger(__name__)


class BatchingConfig(StrictModel):
    """How concurrent requests are coalesced."""

    enabled: bool = Field(default=True, description="Micro-batch concurrent requests; false = one search per request.")
    max_batch_queries: int = Field(default=256, ge=1, description="Close a batch once this many queries wait.")
    max_wait_ms: float = Field(
        default=2.0, ge=0, description="Adaptive extra wait: a batch smaller than the recent ones waits up to this "
        "long for more requests (steady load forms full batches; an idle server adds no delay); 0 = never wait."
    )
    max_pending_queries: int = Field(default=8192, ge=1, description="Queue bound; beyond it requests get 503.")
    workers: int = Field(default=1, ge=1, description="Batches that may run at once, each in its own thread.")
    baseline_threads: int = Field(default=8, ge=1, description="Thread pool size when batching is disabled.")


class LimitsConfig(StrictModel):
    """Request limits; requests beyond them get a 4xx JSON error."""

    max_k: int = Field(default=100, ge=1, description="Largest k a request may ask for (422 above).")
    max_queries_per_request: int = Field(default=512, ge=1, description="Most queries in one request (413 above).")
    max_query_chars: int = Field(default=4096, ge=1, description="Longest query in characters (413 above).")
    max_body_bytes: int = Field(default=2_000_000, ge=1024, description="Largest request body (413 above).")


class ServerConfig(StrictModel):
    """Retriever server settings."""

    host: str = Field(default="127.0.0.1", description="Bind address; keep loopback unless a token is set.")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port (0 = any free port).")
    token: SecretStr | None = Field(default=None, description="Bearer token required on search endpoints if set.")
    default_k: int = Field(default=10, ge=1, description="k when a request leaves it null (/retrieve, /queries).")
    cache_size: int = Field(default=50_000, ge=0, description="LRU entries (query, k) -> hits; 0 disables the cache.")
    batching: BatchingConfig = Field(default_factory=BatchingConfig, description="Micro-batching settings.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Request size and k limits.")
    log_level: str = Field(default="warning", description="uvicorn log level.")
    fast_path: bool = Field(
        default=True, description="Serve the JSON POST search endpoints through FastJSONRoutes (same contract, "
        "less CPU per request); false routes them through FastAPI."
    )
    processes: int = Field(
        default=1, ge=1, description="Server processes sharing the port (uvicorn workers), each with its own copy of "
        "the index, micro-batcher and cache: HTTP parsing in one never holds the other's GIL. Needs an index or "
        "corpus path (see serve_processes)."
    )

    @model_validator(mode="after")
    def _default_k_within_cap(self) -> ServerConfig:
        if self.default_k > self.limits.max_k:
            raise ValueError(f"default_k={self.default_k} exceeds limits.max_k={self.limits.max_k}; lower default_k")
        return self


class RequestError(Exception):
    """A client error with its HTTP status and a message naming the bad value and the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Serialise with orjson (fast, and safe for any float the searcher returns)."""
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status, headers, "application/json")


def _error(status: int, message: str, detail: Any = None, headers: dict[str, str] | None = None) -> Response:
    return json_response({"error": message, "detail": detail if detail is not None else message}, status, headers)


def check_request(queries: list[str], k: int, k_name: str, limits: LimitsConfig) -> None:
    """Validate a request against the limits.

    Raises:
        RequestError: 422 for empty lists, blank queries and k out of [1, max_k]; 413 for oversize requests.
    """
    if not queries:
        raise RequestError(422, "the query list is empty; send at least one query")
    if len(queries) > limits.max_queries_per_request:
        raise RequestError(
            413, f"{len(queries)} queries in one request; split it into requests of at most "
            f"{limits.max_queries_per_request}"
        )
    for i, q in enumerate(queries):
        if not q.strip():
            raise RequestError(422, f"query #{i} is empty or blank; drop it or send text to search for")
        if len(q) > limits.max_query_chars:
            raise RequestError(413, f"query #{i} has {len(q)} characters; the limit is {limits.max_query_chars}")
    if k < 1:
        raise RequestError(422, f"{k_name}={k} is invalid; ask for at least 1 document")
    if k > limits.max_k:
        raise RequestError(422, f"{k_name}={k} exceeds this server's cap of {limits.max_k}; ask for at most that")


class BodyTooLarge(Exception):
    """A request body over the configured limit."""


async def read_limited_body(scope: dict[str, Any], receive: Any, max_bytes: int) -> bytes | None:
    """The whole request body (None if the client disconnected).

    Raises:
        BodyTooLarge: the Content-Length header or the bytes received so far exceed ``max_bytes``.
    """
    length = dict(scope["headers"]).get(b"content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise BodyTooLarge
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        total += len(chunks[-1])
        if total > max_bytes:
            raise BodyTooLarge
        if not message.get("more_body", False):
            return b"".join(chunks)


def bearer_ok(authorization: bytes | str, expected: bytes) -> bool:
    """True when an ``Authorization`` header value is ``Bearer <expected>`` (constant-time comparison)."""
    raw = authorization.encode() if isinstance(authorization, str) else authorization
    scheme, _, given = raw.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), expected)


class BodyLimitMiddleware:
    """Pure ASGI middleware: answer 413 to bodies over ``max_bytes`` (by header, or counted while buffering).

    ``reject(max_bytes)`` builds the 413 response (default: this server's JSON error shape).
    """

    def __init__(self, app: Any, max_bytes: int, reject: Callable[[int], Response] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.reject = reject or _too_large

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await read_limited_body(scope, receive, self.max_bytes)
        except BodyTooLarge:
            await self.reject(self.max_bytes)(scope, receive, send)
            return
        if body is None:
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _validation_error(raw: Any) -> Response:
    """422 naming every invalid field (locations start with ``body`` or ``query``, as FastAPI reports them)."""
    errors = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in raw
    ]
    summary = "; ".join(f"{'.'.join(e['loc'][1:]) or 'body'}: {e['msg']}" for e in errors[:5])
    return _error(422, f"invalid request ({summary}); see /docs for the schema", errors)


def _mapped_error(exc: Exception) -> Response:
    """The JSON error response of an exception raised while serving a request (see the module docstring)."""
    if isinstance(exc, RequestError):
        return _error(exc.status, exc.message)
    if isinstance(exc, StarletteHTTPException):
        return _error(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))
    if isinstance(exc, SearchBackendError):
        return _error(503, f"search backend failed ({exc}); retry, and check the server log if it persists",
                      headers={"Retry-After": "1"})
    if isinstance(exc, OverloadedError):
        return _error(503, f"server overloaded: {exc}", headers={"Retry-After": "1"})
    log.error("unhandled server error", exc_info=exc)
    return _error(500, f"internal server error ({type(exc).__name__}); this is a bug, please report it")


JsonHandler = Callable[[Any], Awaitable[Any]]


class FastJSONRoutes:
    """Pure ASGI fast path for the JSON ``POST`` search endpoints, the hot path under load.

    Same contract as the FastAPI routes behind it (which stay for the OpenAPI docs and every other request): body
    limit (413), bearer token (401), the same strict wire models parsed straight from the bytes by pydantic-core
    (422 with the same message), the same handlers and error mapping. It skips FastAPI's per-request routing,
    dependency solving and ``json.loads`` + Python-mode validation, which cost as much CPU per request as a small
    index search (measured with ``benchmarks/server_throughput.py``).
    """

    def __init__(self, app: Any, routes: dict[str, tuple[type[BaseModel], JsonHandler]], max_bytes: int,
                 token: str | None) -> None:
        self.app, self.routes, self.max_bytes = app, routes, max_bytes
        self.expected = token.encode() if token else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        route = (self.routes.get(scope["path"])
                 if scope["type"] == "http" and scope["method"] == "POST" else None)
        if route is None:
            await self.app(scope, receive, send)
            return
        response = await self._respond(route, scope, receive)
        if response is not None:
            await response(scope, receive, send)

    async def _respond(self, route: tuple[type[BaseModel], JsonHandler], scope: dict[str, Any], receive: Any
                       ) -> Response | None:
        try:
            body = await read_limited_body(scope, receive, self.max_bytes)
        except BodyTooLarge:
            return _too_large(self.max_bytes)
        if body is None:
            return None
        if self.expected is not None and not bearer_ok(dict(scope["headers"]).get(b"authorization", b""),
                                                       self.expected):
            return _error(401, "missing or wrong bearer token; send 'Authorization: Bearer <token>'",
                          headers={"WWW-Authenticate": "Bearer"})
        model, handle = route
        try:
            request = model.model_validate_json(body or b"null")
        except ValidationError as exc:
            return _validation_error({**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors())
        try:
            return json_response(await handle(request))
        except Exception as exc:  # every failure becomes the same JSON error the FastAPI handlers produce
            return _mapped_error(exc)


def _too_large(max_bytes: int) -> Response:
    return _error(413, f"request body exceeds {max_bytes} bytes; send fewer or shorter queries per request")


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        return _validation_error(exc.errors())

    async def _mapped(_: Request, exc: Exception) -> Response:
        return _mapped_error(exc)

    for kind in (RequestError, StarletteHTTPException, SearchBackendError, OverloadedError, Exception):
        app.add_exception_handler(kind, _mapped)


def _make_service(searcher: Searcher, config: ServerConfig) -> SearchService:
    b = config.batching
    runner: MicroBatcher | PerRequestRunner
    if b.enabled:
        runner = MicroBatcher(
            searcher.search, b.max_batch_queries, b.max_wait_ms / 1000, b.max_pending_queries, b.workers
        )
    else:
        runner = PerRequestRunner(searcher.search, b.baseline_threads)
    return SearchService(runner, QueryCache(config.cache_size))


def _auth_dependency(config: ServerConfig) -> Any:
    expected = config.token.get_secret_value().encode() if config.token else None

    async def check_token(request: Request) -> None:
        if expected is None:
            return
        if not bearer_ok(request.headers.get("authorization", ""), expected):
            raise StarletteHTTPException(
                401, "missing or wrong bearer token; send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check_token


def _index_size(searcher: Searcher) -> int | None:
    for attr in ("passages", "store"):
        try:
            return len(getattr(searcher, attr))
        except (AttributeError, TypeError):
            continue
    return None


def _health(searcher: Searcher, config: ServerConfig, service: SearchService) -> dict[str, Any]:
    return {
        "status": "healthy",
        "retrievers": {"total": 1, "available": 1},
        "index": {"name": searcher.name, "passages": _index_size(searcher)},
        "batching": config.batching.model_dump(),
        "limits": config.limits.model_dump(),
        "default_k": config.default_k,
        "auth": config.token is not None,
        "stats": {
            "requests": service.requests,
            "searcher_calls": service.runner.calls,
            "searched_queries": service.runner.searched_queries,
            "search_wall_s": round(service.runner.clock.wall_s, 6),
            "search_cpu_s": round(service.runner.clock.cpu_s, 6),
            "cache_entries": len(service.cache),
            "cache_hits": service.cache.hits,
            "cache_misses": service.cache.misses,
        },
    }


RunFn = Callable[[list[str], int | None, str], Awaitable[list[list[Hit]]]]


def json_handlers(run: RunFn) -> dict[str, tuple[type[BaseModel], JsonHandler]]:
    """Path -> (request model, handler returning the response body) of every JSON ``POST`` wire format."""

    async def search(req: wire.SearchRequest) -> Any:
        hits = (await run([req.query], req.top_n, "top_n"))[0]
        return wire.search_response(hits, req.return_score)

    async def batch_search(req: wire.BatchSearchRequest) -> Any:
        return wire.batch_search_response(await run(req.query, req.top_n, "top_n"), req.return_score)

    async def retrieve(req: wire.RetrieveRequest) -> Any:
        return wire.retrieve_response(await run(req.queries, req.topk, "topk"), req.return_scores)

    async def queries(req: wire.QueriesRequest) -> Any:
        return wire.queries_response(req.queries, await run(req.queries, req.k, "k"))

    async def v1_search(req: wire.V1SearchRequest) -> Any:
        return wire.v1_response(await run(req.queries, req.k, "k"))

    return {"/search": (wire.SearchRequest, search), "/batch_search": (wire.BatchSearchRequest, batch_search),
            "/retrieve": (wire.RetrieveRequest, retrieve), "/queries": (wire.QueriesRequest, queries),
            "/v1/search": (wire.V1SearchRequest, v1_search)}


def _add_search_routes(api: APIRouter, run: RunFn) -> None:
    """One route per wire format (the documented schema; ``FastJSONRoutes`` serves the JSON POSTs first)."""
    h = json_handlers(run)

    @api.post("/search", response_model=list[wire.DocOut] | tuple[list[wire.DocOut], list[float]])
    async def search(req: wire.SearchRequest) -> Response:
        """FlashRAG/ReSearch/SmartSearch single query: ``docs`` or ``[docs, scores]``."""
        return json_response(await h["/search"][1](req))

    @api.post(
        "/batch_search",
        response_model=list[list[wire.DocOut]] | tuple[list[list[wire.DocOut]], list[list[float]]],
    )
    async def batch_search(req: wire.BatchSearchRequest) -> Response:
        """FlashRAG/ReSearch batch: ``doc_lists`` or ``[doc_lists, score_lists]``."""
        return json_response(await h["/batch_search"][1](req))

    @api.post("/retrieve", response_model=wire.RetrieveResponse)
    async def retrieve(req: wire.RetrieveRequest) -> Response:
        """Search-R1 / verl search tool / ASearcher."""
        return json_response(await h["/retrieve"][1](req))

    @api.post("/queries", response_model=wire.QueriesResponse)
    async def queries(req: wire.QueriesRequest) -> Response:
        """R1-Searcher: document contents per query."""
        return json_response(await h["/queries"][1](req))

    @api.get("/api/search", response_model=wire.ExSearchResponse)
    async def exsearch(
        query: str = Query(description="The query."), k: int = Query(default=10, description="Hits to return.")
    ) -> Response:
        """ExSearch (ColBERT server API): ``title | passage`` texts with softmax probabilities."""
        hits = (await run([query], k, "k"))[0]
        return json_response(wire.exsearch_response(query, hits))

    @api.post("/v1/search", response_model=wire.V1SearchResponse)
    async def v1_search(req: wire.V1SearchRequest) -> Response:
        """searchloop's own format: id, title, text and score per hit."""
        return json_response(await h["/v1/search"][1](req))


def create_app(searcher: Searcher, config: ServerConfig | None = None) -> FastAPI:
    """Build the FastAPI app serving ``searcher`` (start it with :func:`serve` or :func:`serve_in_thread`)."""
    config = config or ServerConfig()
    limits = config.limits
    service = _make_service(searcher, config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.runner.start()
        try:
            yield
        finally:
            await service.runner.close()

    app = FastAPI(
        title="searchloop retriever",
        version="1.0",
        description="One index, every seed's retriever API. Errors are JSON {error, detail}.",
        lifespan=lifespan,
    )
    app.state.service = service
    _install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=limits.max_body_bytes)
    api = APIRouter(dependencies=[Depends(_auth_dependency(config))])

    async def run(queries: list[str], k: int | None, k_name: str) -> list[list[Hit]]:
        k = config.default_k if k is None else k
        check_request(queries, k, k_name, limits)
        return await service.search(queries, k)

    _add_search_routes(api, run)
    if config.fast_path:
        app.add_middleware(FastJSONRoutes, routes=json_handlers(run), max_bytes=limits.max_body_bytes,
                           token=config.token.get_secret_value() if config.token else None)

    @app.get("/health")
    async def health() -> Response:
        """Liveness plus index, limits and batching/cache statistics (ReSearch-compatible keys)."""
        return json_response(_health(searcher, config, service))

    app.include_router(api)
    return app


def serve(searcher: Searcher, config: ServerConfig | None = None) -> None:
    """Run the server in the foreground until interrupted."""
    import uvicorn

    config = config or ServerConfig()
    if config.processes > 1:
        raise ConfigError(f"processes={config.processes} needs every worker to load the index itself: call "
                          "serve_processes(index, corpus, config) (the CLI's --processes does)")
    if config.host not in {"127.0.0.1", "localhost", "::1"} and config.token is None:
        log.warning("serving on %s without a token: anyone who can reach this port can query it", config.host)
    uvicorn.run(
        create_app(searcher, config), host=config.host, port=config.port, log_level=config.log_level,
        access_log=False, timeout_keep_alive=30,
    )


SPEC_ENV = "SEARCHLOOP_RETRIEVER_SPEC"


def open_source(index: str | None, corpus: str | None) -> Searcher:
    """Load a built index directory (any backend), or build BM25 over a corpus jsonl in memory.

    Raises:
        ConfigError: when not exactly one of ``index`` / ``corpus`` is given.
        ArtifactError: when ``index`` is not a finished index directory.
    """
    if (index is None) == (corpus is None):
        raise ConfigError("pass exactly one of --index <index dir> or --corpus <corpus.jsonl>")
    if corpus is not None:
        from retrieval.bm25 import BM25Searcher
        from retrieval.corpus import read_corpus

        return BM25Searcher.build(read_corpus(corpus))
    from retrieval.index import load_searcher

    return load_searcher(str(index))


def app_from_env() -> FastAPI:
    """uvicorn factory for :func:`serve_processes`: each worker process opens the index named in ``SPEC_ENV``."""
    raw = os.environ.get(SPEC_ENV)
    if not raw:
        raise ConfigError(f"{SPEC_ENV} is not set: start multi-process serving with retrieval.server.serve_processes")
    spec = orjson.loads(raw)
    return create_app(open_source(spec["index"], spec["corpus"]), ServerConfig.model_validate(spec["config"]))


def serve_processes(index: str | None, corpus: str | None, config: ServerConfig) -> None:
    """Run ``config.processes`` server processes on one port (uvicorn workers; the kernel spreads connections).

    The parent only supervises (uvicorn restarts a worker that dies); every worker loads the index itself.
    """
    import uvicorn

    if config.host not in {"127.0.0.1", "localhost", "::1"} and config.token is None:
        log.warning("serving on %s without a token: anyone who can reach this port can query it", config.host)
    dumped = config.model_dump(mode="json")
    dumped["token"] = config.token.get_secret_value() if config.token is not None else None
    os.environ[SPEC_ENV] = orjson.dumps({"index": None if index is None else str(index),
                                         "corpus": None if corpus is None else str(corpus),
                                         "config": dumped}).decode()
    uvicorn.run(
        "retrieval.server:app_from_env", factory=True, workers=config.processes, host=config.host,
        port=config.port, log_level=config.log_level, access_log=False, timeout_keep_alive=30,
    )


@contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0) -> Iterator[str]:
    """Run ``app`` under uvicorn in a daemon thread; yield its base URL; stop it on exit.

    Raises:
        RuntimeError: the server did not start within ``timeout_s``.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="retriever-server")
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"retriever server did not start on {host}:{port} within {timeout_s} s")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
        sock.close()
