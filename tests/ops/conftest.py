"""Session-scoped real servers for the ops tests: moto S3, a Prefect server, an MLflow server, a process worker.

The stack lives under the test session's data home (``<SEARCHLOOP_HOME>/stack``) on free 127.0.0.1 ports, so
``searchloop status`` run by a test sees it. Everything started here is stopped at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra import proc, stack
from infra.settings import get_settings

REPO = Path(__file__).resolve().parents[2]
MINI_CORPUS = REPO / "data" / "corpus" / "mini.jsonl"
HEARTBEAT = 30  # seconds between flow-run heartbeats on the test stack (PREFECT_FLOWS_HEARTBEAT_FREQUENCY, minimum 30)


@dataclass
class Stack:
    """The running test stack."""

    cfg: stack.StackConfig
    timings: dict[str, float]

    @contextmanager
    def client_env(self, mlflow_uri: str | None = None) -> Iterator[None]:
        """Point in-process Prefect and MLflow clients at the stack for the block."""
        from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

        old = os.environ.get("MLFLOW_TRACKING_URI")
        os.environ["MLFLOW_TRACKING_URI"] = mlflow_uri or self.cfg.mlflow_url
        try:
            with temporary_settings(updates={PREFECT_API_URL: self.cfg.prefect_api_url,
                                             PREFECT_FLOWS_HEARTBEAT_FREQUENCY: HEARTBEAT}):
                yield
        finally:
            if old is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = old


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1; AWS env vars point boto/s3fs (and the workers) at it."""
    from moto.server import ThreadedMotoServer

    port = proc.free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield endpoint
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture(scope="session")
def ops_stack(moto_s3: str) -> Iterator[Stack]:
    """Prefect server + MLflow server + a cpu process worker, with deployments of every flow registered."""
    cfg = stack.StackConfig(
        home=get_settings().home / "stack", prefect_port=proc.free_port(), mlflow_port=proc.free_port(),
        pools=["cpu"], scheduler_loop_seconds=2, worker_query_seconds=2,
        extra_env={"PREFECT_WORKER_PREFETCH_SECONDS": "5", "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.5",
                   "PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS": "3", "PREFECT_SERVER_SERVICES_SCHEDULER_MIN_RUNS": "1",
                   "PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED": "false",
                   # runs heartbeat at Prefect's minimum period; `up` sizes the zombie automation from it (3 periods)
                   stack.HEARTBEAT_ENV: str(HEARTBEAT)},
    )
    # every run against this stack (workers' runs, CLI subprocesses, in-process flows) heartbeats at HEARTBEAT, so
    # the short zombie window below crashes only runs that really stopped
    old_heartbeat = os.environ.get(stack.HEARTBEAT_ENV)
    os.environ[stack.HEARTBEAT_ENV] = str(HEARTBEAT)
    try:
        timings = stack.up(cfg)
        s = Stack(cfg=cfg, timings=timings)
        from flows import deployments

        with s.client_env():
            start = time.monotonic()
            deployments.register_all()
            timings["register"] = time.monotonic() - start
        yield s
    finally:
        stack.down(cfg, timeout=5)
        if old_heartbeat is None:
            os.environ.pop(stack.HEARTBEAT_ENV, None)
        else:
            os.environ[stack.HEARTBEAT_ENV] = old_heartbeat


@pytest.fixture()
def corpus_copy(tmp_path: Path) -> Path:
    """A private copy of the shipped mini corpus (tests edit it)."""
    dst = tmp_path / "corpus.jsonl"
    shutil.copy(MINI_CORPUS, dst)
    return dst


@pytest.fixture()
def retriever_service(tmp_path: Path):
    """Factory: serve an index directory with the real retriever (`searchloop serve retriever`); stopped after."""
    started: list[tuple[Path, str]] = []

    def spec_for(index_dir: str, port: int) -> proc.ServiceSpec:
        return proc.ServiceSpec(
            name="retriever",
            argv=[sys.executable, "-m", "flows.cli", "serve", "retriever", "--index", index_dir, "--port", str(port)],
            health_url=f"http://127.0.0.1:{port}/health", cwd=str(REPO), env={"PYTHONPATH": str(REPO)},
        )

    def start(index_dir: str, port: int | None = None) -> tuple[proc.ServiceSpec, Path]:
        run_dir = tmp_path / "run"
        spec = spec_for(index_dir, port or proc.free_port())
        proc.ensure_started(spec, run_dir, timeout=60)
        started.append((run_dir, spec.name))
        return spec, run_dir

    yield start
    for run_dir, name in started:
        proc.stop_service(run_dir, name)


@pytest.fixture(scope="module")
def gpu_worker(ops_stack: Stack) -> Iterator[proc.ServiceSpec]:
    """A process worker on the ``gpu`` pool (what `searchloop up` starts with CUDA), for dispatched steps; stopped
    after the module so its polling does not load the SQLite-backed server during the other tests."""
    spec = stack.worker_spec(ops_stack.cfg, "gpu")
    proc.start_service(spec, ops_stack.cfg.run_dir)
    stack.wait_worker_online(ops_stack.cfg, "gpu", timeout=90)
    yield spec
    proc.stop_service(ops_stack.cfg.run_dir, spec.name, timeout=5)
