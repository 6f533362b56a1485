"""The retriever FastAPI app: one route per wire format, ``/health``, and an OpenAPI 3.1 schema that states the limits.

Layers, outermost first: ``infra.http.GuardMiddleware`` (in-flight bound, bearer token from the headers, body size
and deadline), :class:`retrieval.server.fast.FastJSONRoutes` (the JSON POSTs), then FastAPI (the same routes,
documented, plus ``GET /api/search``, ``/health`` and the docs). Every request goes through one
:class:`retrieval.batching.SearchService`: a byte-bounded LRU cache, then a micro-batcher (or, with
``batching.enabled=false``, the seeds' per-request thread pool, kept as the benchmark baseline).
"""

from __future__ import annotations

import gc
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import Response

from infra.http import GuardMiddleware, json_response
from retrieval import wire
from retrieval.batching import MicroBatcher, PerRequestRunner, QueryCache, SearchService
from retrieval.server.config import LimitsConfig, ServerConfig
from retrieval.server.errors import ERROR_RESPONSES, RequestError, check_request, guard_error, install_error_handlers
from retrieval.server.fast import FastJSONRoutes, RunFn, json_handlers
from retrieval.types import Hit, Searcher

OPEN_PATHS = frozenset({"/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
_PLAIN_INT = re.compile(r"[0-9]{1,9}")


def _make_service(searcher: Searcher, config: ServerConfig) -> SearchService:
    b = config.batching
    runner: MicroBatcher | PerRequestRunner
    if b.enabled:
        runner = MicroBatcher(
            searcher.search, b.max_batch_queries, b.max_wait_ms / 1000, b.max_pending_queries, b.workers
        )
    else:
        runner = PerRequestRunner(searcher.search, b.baseline_threads)
    return SearchService(runner, QueryCache(config.cache_bytes))


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
            "cache_bytes": service.cache.bytes,
            "cache_max_bytes": service.cache.max_bytes,
            "cache_hits": service.cache.hits,
            "cache_misses": service.cache.misses,
        },
    }


_DOCS = {"type": "array", "items": {"$ref": "#/components/schemas/DocOut"}}
_SCORES = {"type": "array", "items": {"type": "number"}}


def _pair(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """``[first, second]`` without ``prefixItems`` (which many OpenAPI tools cannot read)."""
    return {"type": "array", "minItems": 2, "maxItems": 2, "items": {"anyOf": [first, second]}}


def _schema_response(schema: dict[str, Any], text: str) -> dict[int | str, dict[str, Any]]:
    return {200: {"description": text, "content": {"application/json": {"schema": schema}}}, **ERROR_RESPONSES}


def _add_search_routes(api: APIRouter, run: RunFn, limits: LimitsConfig) -> None:
    """One route per wire format (the documented schema; ``FastJSONRoutes`` serves the JSON POSTs first)."""
    h = json_handlers(run)
    docs_lists = {"type": "array", "items": _DOCS}
    score_lists = {"type": "array", "items": _SCORES}

    @api.post("/search", responses=_schema_response({"anyOf": [_DOCS, _pair(_DOCS, _SCORES)]},
                                                    "``docs``, or ``[docs, scores]`` with return_score"))
    async def search(req: wire.SearchRequest) -> Response:
        """FlashRAG/ReSearch/SmartSearch single query: ``docs`` or ``[docs, scores]``."""
        return json_response(await h["/search"][1](req))

    @api.post("/batch_search", responses=_schema_response(
        {"anyOf": [docs_lists, _pair(docs_lists, score_lists)]}, "``doc_lists``, or ``[doc_lists, score_lists]``"))
    async def batch_search(req: wire.BatchSearchRequest) -> Response:
        """FlashRAG/ReSearch batch: ``doc_lists`` or ``[doc_lists, score_lists]``."""
        return json_response(await h["/batch_search"][1](req))

    @api.post("/retrieve", response_model=wire.RetrieveResponse, responses=ERROR_RESPONSES)
    async def retrieve(req: wire.RetrieveRequest) -> Response:
        """Search-R1 / verl search tool / ASearcher."""
        return json_response(await h["/retrieve"][1](req))

    @api.post("/queries", response_model=wire.QueriesResponse, responses=ERROR_RESPONSES)
    async def queries(req: wire.QueriesRequest) -> Response:
        """R1-Searcher: document contents per query."""
        return json_response(await h["/queries"][1](req))

    @api.get("/api/search", response_model=wire.ExSearchResponse, responses=ERROR_RESPONSES)
    async def exsearch(
        request: Request,
        query: str = Query(min_length=1, pattern=r"\S", json_schema_extra={"maxLength": limits.max_query_chars},
                           description="The query (not blank; longer than maxLength: 413)."),
        k: int = Query(default=10, ge=1, le=limits.max_k, description="Hits to return (a plain decimal integer)."),
    ) -> Response:
        """ExSearch (ColBERT server API): ``title | passage`` texts with softmax probabilities."""
        raw_k = request.query_params.get("k")
        if raw_k is not None and not _PLAIN_INT.fullmatch(raw_k):
            raise RequestError(422, f"k={raw_k!r} is not a plain decimal integer; send digits only, e.g. k=5")
        hits = (await run([query], k, "k"))[0]
        return json_response(wire.exsearch_response(query, hits))

    @api.post("/v1/search", response_model=wire.V1SearchResponse, responses=ERROR_RESPONSES)
    async def v1_search(req: wire.V1SearchRequest) -> Response:
        """searchloop's own format: id, title, text and score per hit."""
        return json_response(await h["/v1/search"][1](req))


_K_FIELDS = {"SearchRequest": "top_n", "BatchSearchRequest": "top_n", "RetrieveRequest": "topk",
             "QueriesRequest": "k", "V1SearchRequest": "k"}
_QUERY_FIELDS = {"SearchRequest": "query", "BatchSearchRequest": "query", "RetrieveRequest": "queries",
                 "QueriesRequest": "queries", "V1SearchRequest": "queries"}


def _state_limits(schema: dict[str, Any], limits: LimitsConfig) -> dict[str, Any]:
    """Write the server's limits into the request schemas: k range, query count, not-blank queries."""
    text = {"minLength": 1, "maxLength": limits.max_query_chars, "pattern": r"\S"}
    comps = schema.get("components", {}).get("schemas", {})
    for name, k_field in _K_FIELDS.items():
        props = comps.get(name, {}).get("properties", {})
        k_schema = props.get(k_field)
        if k_schema is not None:
            for option in k_schema.get("anyOf", [k_schema]):
                if option.get("type") == "integer":
                    option.update(minimum=1, maximum=limits.max_k)
        q_schema = props.get(_QUERY_FIELDS[name])
        if q_schema is None:
            continue
        if q_schema.get("type") == "array":
            q_schema.update(minItems=1, maxItems=limits.max_queries_per_request)
            q_schema["items"].update(text)
        else:
            q_schema.update(text)
    return schema


def create_app(searcher: Searcher, config: ServerConfig | None = None) -> FastAPI:
    """Build the FastAPI app serving ``searcher`` (start it with ``serve`` or ``infra.http.serve_in_thread``)."""
    config = config or ServerConfig()
    limits = config.limits
    service = _make_service(searcher, config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.runner.start()
        # the loaded model, index and imports are ~0.5M objects that live as long as the server, and a full
        # collection scans them all (230 ms on a 2-core CPU: a stall of every request in flight; session 49's
        # attempt 4 lost 16% of a 64-client run to it): collect once, then leave them out of later collections
        gc.collect()
        gc.freeze()
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
    install_error_handlers(app)
    api = APIRouter()

    async def run(queries: list[str], k: int | None, k_name: str) -> list[list[Hit]]:
        k = config.default_k if k is None else k
        check_request(queries, k, k_name, limits)
        return await service.search(queries, k)

    _add_search_routes(api, run, limits)
    if config.fast_path:
        app.add_middleware(FastJSONRoutes, routes=json_handlers(run), max_bytes=limits.max_body_bytes)
    app.add_middleware(
        GuardMiddleware, error=guard_error, max_bytes=limits.max_body_bytes, body_timeout_s=limits.body_timeout_s,
        token=config.token.get_secret_value().encode() if config.token else None,
        protected=lambda path: path not in OPEN_PATHS, max_in_flight=limits.max_in_flight,
        max_buffered_bytes=limits.max_buffered_bytes,
    )  # added last = outermost: nothing reads a body before the token and the limits are checked

    @app.get("/health")
    async def health() -> Response:
        """Liveness plus index, limits and batching/cache statistics (ReSearch-compatible keys)."""
        return json_response(_health(searcher, config, service))

    app.include_router(api)
    base_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _state_limits(base_openapi(), limits)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
