"""Starting the retriever server: one process (:func:`serve`) or several on one port (:func:`serve_processes`).

Both run uvicorn with a bound on open connections (``limits.max_connections``) and bind 127.0.0.1 unless told
otherwise (with a warning when a wider bind has no token).
"""

from __future__ import annotations

import logging
import os

import orjson
from fastapi import FastAPI

from infra.errors import ConfigError
from infra.http import warn_if_exposed
from retrieval.server.app import create_app
from retrieval.server.config import ServerConfig
from retrieval.types import Searcher

log = logging.getLogger(__name__)
SPEC_ENV = "SEARCHLOOP_RETRIEVER_SPEC"


def _uvicorn_options(config: ServerConfig) -> dict[str, object]:
    return {"host": config.host, "port": config.port, "log_level": config.log_level, "access_log": False,
            "timeout_keep_alive": 30, "limit_concurrency": config.limits.max_connections}


def serve(searcher: Searcher, config: ServerConfig | None = None) -> None:
    """Run the server in the foreground until interrupted."""
    import uvicorn

    config = config or ServerConfig()
    if config.processes > 1:
        raise ConfigError(f"processes={config.processes} needs every worker to load the index itself: call "
                          "serve_processes(index, corpus, config) (the CLI's --processes does)")
    warn_if_exposed(config.host, config.token, "query it", log)
    uvicorn.run(create_app(searcher, config), **_uvicorn_options(config))  # type: ignore[arg-type]


def open_source(index: str | None, corpus: str | None, query_backend: str | None = None,
                query_model: str | None = None) -> Searcher:
    """Load a built index directory (any backend), or build BM25 over a corpus jsonl in memory.

    Raises:
        ConfigError: when not exactly one of ``index`` / ``corpus`` is given.
        ArtifactError: when ``index`` is not a finished index directory.
    """
    from retrieval.open import RetrieverSpec, open_searcher

    if (index is None) == (corpus is None):
        raise ConfigError("pass exactly one of --index <index dir> or --corpus <corpus.jsonl>")
    return open_searcher(RetrieverSpec(index=index, corpus=None if corpus is None else [corpus],
                                       query_backend=query_backend, query_model=query_model))


def app_from_env() -> FastAPI:
    """uvicorn factory for :func:`serve_processes`: each worker process opens the index named in ``SPEC_ENV``."""
    raw = os.environ.get(SPEC_ENV)
    if not raw:
        raise ConfigError(f"{SPEC_ENV} is not set: start multi-process serving with retrieval.server.serve_processes")
    spec = orjson.loads(raw)
    return create_app(open_source(spec["index"], spec["corpus"], spec.get("query_backend"), spec.get("query_model")),
                      ServerConfig.model_validate(spec["config"]))


def serve_processes(index: str | None, corpus: str | None, config: ServerConfig,
                    query_backend: str | None = None, query_model: str | None = None) -> None:
    """Run ``config.processes`` server processes on one port (uvicorn workers; the kernel spreads connections).

    The parent only supervises (uvicorn restarts a worker that dies); every worker loads the index itself. The
    token reaches the workers through this process's environment (never a file or a record).
    """
    import uvicorn

    warn_if_exposed(config.host, config.token, "query it", log)
    dumped = config.model_dump(mode="json")
    dumped["token"] = config.token.get_secret_value() if config.token is not None else None
    os.environ[SPEC_ENV] = orjson.dumps({"index": None if index is None else str(index),
                                         "corpus": None if corpus is None else str(corpus),
                                         "query_backend": query_backend, "query_model": query_model,
                                         "config": dumped}).decode()
    uvicorn.run("retrieval.server.run:app_from_env", factory=True, workers=config.processes,
                **_uvicorn_options(config))  # type: ignore[arg-type]
