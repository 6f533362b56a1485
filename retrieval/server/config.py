"""Retriever server settings (a leaf module: pydantic models only)."""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator

from infra.config import StrictModel


class BatchingConfig(StrictModel):
    """How concurrent requests are coalesced."""

    enabled: bool = Field(default=True, description="Micro-batch concurrent requests; false = one search per request.")
    max_batch_queries: int = Field(default=256, ge=1, description="Close a batch once this many queries wait.")
    max_wait_ms: float = Field(
        default=10.0, ge=0, description="Adaptive extra wait: a batch smaller than the recent ones waits up to this "
        "long (and at most a quarter of a batch's search time) for more requests (steady load forms full batches; an "
        "idle server adds no delay); 0 = never wait. 10 ms measured +7% q/s over 2 ms at 64 clients in two runs "
        "(docs/results/engines/cpu_session21.md)."
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
    body_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds allowed to receive a whole request body (408 after): a stalled "
        "client cannot hold a buffer open."
    )
    max_in_flight: int = Field(
        default=256, ge=1, description="Requests handled at once per process; beyond it 503 + Retry-After (bounds "
        "the memory held by slow clients)."
    )
    max_buffered_bytes: int = Field(
        default=128 * 2**20, ge=1024, description="Body bytes all requests in flight may hold together per process "
        "(503 + Retry-After beyond): stalled or slow uploads cannot grow memory past it."
    )
    max_connections: int = Field(
        default=2048, ge=1, description="Open connections per process (uvicorn limit_concurrency; plain 503 above)."
    )


class ServerConfig(StrictModel):
    """Retriever server settings."""

    host: str = Field(default="127.0.0.1", description="Bind address; keep loopback unless a token is set.")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port (0 = any free port).")
    token: SecretStr | None = Field(
        default=None, description="Bearer token required on search endpoints if set (recorded as '**********')."
    )
    default_k: int = Field(default=10, ge=1, description="k when a request leaves it null (/retrieve, /queries).")
    cache_bytes: int = Field(
        default=256 * 2**20, ge=0, description="Query cache bound in bytes (estimated size of the cached hits: "
        "query, ids, titles, texts); least recently used entries go first; 0 disables the cache."
    )
    batching: BatchingConfig = Field(default_factory=BatchingConfig, description="Micro-batching settings.")
    limits: LimitsConfig = Field(default_factory=LimitsConfig, description="Request size, k and connection limits.")
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
