"""Run the retriever server as a background process (for flows that need a live service) and stop it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from infra.proc import ServiceSpec, ensure_started, free_port, stop_service


class RetrieverService(BaseModel):
    """A started retriever server."""

    name: str = Field(description="Service name (pid/log file name in the run directory).")
    url: str = Field(description="Base URL, e.g. http://127.0.0.1:8123.")
    run_dir: str = Field(description="Directory holding the pid and log files.")
    log: str = Field(description="Server log file.")


def start_retriever(
    index_dir: str | os.PathLike[str], run_dir: str | os.PathLike[str], port: int | None = None,
    name: str = "retriever", timeout_s: float = 300.0,
) -> RetrieverService:
    """Start ``searchloop serve retriever --index <index_dir>`` on 127.0.0.1 and wait for ``/health``.

    Raises:
        infra.proc.ServiceError: if it does not become healthy in time (the message carries the log tail).
    """
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    spec = ServiceSpec(
        name=name, health_url=f"{url}/health",
        argv=[sys.executable, "-m", "flows.cli", "serve", "retriever", "--index", str(index_dir),
              "--host", "127.0.0.1", "--port", str(port)],
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    info = ensure_started(spec, run_dir, timeout=timeout_s)
    return RetrieverService(name=name, url=url, run_dir=str(run_dir), log=info.log)


def stop_retriever(service: RetrieverService) -> bool:
    """Stop the server started by :func:`start_retriever`; True if it was running."""
    return stop_service(service.run_dir, service.name)
