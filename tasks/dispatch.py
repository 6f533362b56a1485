"""Run one named step on a Prefect work pool (the ``gpu`` pool) instead of in the calling process.

A task whose work needs a GPU calls :func:`run_step` with a step name from :data:`STEPS` and its keyword
arguments. By default (``SEARCHLOOP_DISPATCH`` unset or ``local``) the library function runs right there. With
``SEARCHLOOP_DISPATCH=pool`` and a Prefect server configured, the call becomes a flow run of the ``gpu-step``
deployment (``flows/gpu_step.py``, deployed on the ``gpu`` pool): the arguments travel as JSON (pydantic models
tagged with their class), a worker of that pool executes the step and writes the JSON result to ``result_uri``
(local path or ``s3://``, via ``infra.artifacts``), and the calling task waits for the run with Prefect's own
``wait_for_flow_run``. A run that ends Failed, Crashed or Cancelled raises :class:`StepFailed`, so the calling
task's own retries re-dispatch it; one still unfinished after the timeout is cancelled.

Crash detection is Prefect's, not ours: a worker reports a step process that died under it as Crashed, and a run
whose worker or node died with it (no one left to report) stops sending flow-run heartbeats and is marked Crashed
by Prefect's zombie-run automation (``infra.stack.ensure_zombie_automation``; :func:`ensure_crash_detection`
makes sure the server has it). What stays here is what Prefect has no primitive for: running a *named library
step* (:data:`STEPS`) on another pool with typed arguments and getting its result back (encode/decode).

Only names in :data:`STEPS` can run, and only pydantic models from our own packages are rebuilt from JSON.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import uuid
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from prefect import task
from pydantic import BaseModel

from infra import artifacts
from infra.errors import ConfigError, SearchloopError
from infra.lazy import load_object, unknown_name
from infra.settings import get_settings

STEPS: dict[str, str] = {
    "embed-shard": "retrieval.dense:embed_shard",
    "evaluate-dataset": "training.agent.evaluate:evaluate_dataset",
}
MODEL_PACKAGES = ("infra.", "retrieval.", "evaluation.", "training.")
DISPATCH_ENV = "SEARCHLOOP_DISPATCH"
RESULTS_ENV = "SEARCHLOOP_DISPATCH_RESULTS"
STEP_DEPLOYMENT = "gpu-step/default"


class StepFailed(SearchloopError):
    """A step dispatched to a work pool did not complete (its flow run ended Failed, Crashed or Cancelled)."""


def dispatch_mode() -> str:
    """``local`` (run in this process, the default) or ``pool`` (from ``SEARCHLOOP_DISPATCH``).

    Raises:
        ConfigError: for another value, or ``pool`` without a Prefect server (``PREFECT_API_URL``).
    """
    mode = os.environ.get(DISPATCH_ENV, "local").strip().lower() or "local"
    if mode not in {"local", "pool"}:
        raise ConfigError(f"{DISPATCH_ENV}={mode!r} is not a dispatch mode; use 'local' (default) or 'pool'")
    if mode == "pool":
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            raise ConfigError(f"{DISPATCH_ENV}=pool needs a Prefect server: run `searchloop up` and export "
                              "PREFECT_API_URL, or unset it to run steps in-process")
    return mode


def resolve_step(name: str) -> Callable[..., Any]:
    """The library function registered under ``name``.

    Raises:
        ConfigError: for a name not in :data:`STEPS`.
    """
    if name not in STEPS:
        raise ConfigError(unknown_name("step", name, sorted(STEPS)) + " (add it to tasks.dispatch.STEPS)")
    return load_object(STEPS[name])


def encode(value: Any) -> Any:
    """JSON-ready form of a step argument or result; pydantic models keep their class for :func:`decode`."""
    if isinstance(value, BaseModel):
        cls = type(value)
        return {"__model__": f"{cls.__module__}:{cls.__qualname__}", "data": value.model_dump(mode="json")}
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    return value


def decode(value: Any) -> Any:
    """Inverse of :func:`encode`.

    Raises:
        ConfigError: for a tagged class outside our packages or not a pydantic model.
    """
    if isinstance(value, dict) and set(value) == {"__model__", "data"}:
        target = str(value["__model__"])
        if not target.startswith(MODEL_PACKAGES):
            raise ConfigError(f"refusing to rebuild {target!r}: only models from {MODEL_PACKAGES}")
        try:
            cls = load_object(target)
        except ConfigError:
            cls = None
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            raise ConfigError(f"{value['__model__']!r} is not a pydantic model")
        return cls.model_validate(value["data"])
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    return value


def execute_step(step: str, params: dict[str, Any]) -> Any:
    """Run ``step`` with JSON-encoded ``params``; returns the JSON-encoded result (what the pool side does)."""
    return encode(resolve_step(step)(**decode(params)))


@task(name="execute-step", task_run_name="step-{step}")
def execute_step_task(step: str, params: dict[str, Any], result_uri: str | None = None) -> Any:
    """Run one step where this flow runs (the ``gpu`` worker) and write its JSON result to ``result_uri``.

    No retries here: the dispatching task owns the retry policy and re-dispatches a failed run.
    """
    result = execute_step(step, params)
    if result_uri:
        artifacts.write_json(result_uri, {"step": step, "result": result})
    return result


def results_root() -> str:
    """Where dispatched steps write their results (``SEARCHLOOP_DISPATCH_RESULTS`` or ``<home>/dispatch``)."""
    return os.environ.get(RESULTS_ENV) or str(get_settings().home / "dispatch")


def _logger() -> logging.Logger | logging.LoggerAdapter:
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


_AUTOMATION_CHECKED: set[str] = set()


def ensure_crash_detection() -> None:
    """Make sure the Prefect server this process talks to has the zombie-run automation (``infra.stack``), once per
    process and server: pool mode then detects a killed worker or node even on a stack ``searchloop up`` did not
    start. An existing automation is kept as it is; a new one allows three heartbeat periods of this process's
    ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``.
    """
    from prefect.settings import PREFECT_API_URL, get_current_settings

    from infra.stack import HEARTBEAT_SECONDS, ensure_zombie_automation_at

    api = str(PREFECT_API_URL.value()).rstrip("/")
    if api in _AUTOMATION_CHECKED:
        return
    period = int(get_current_settings().flows.heartbeat_frequency or HEARTBEAT_SECONDS)
    ensure_zombie_automation_at(api, 3 * period, replace=False)
    _AUTOMATION_CHECKED.add(api)


POLL_SECONDS = 30.0


def wait_for_run(flow_run_id: uuid.UUID, timeout: float | None = None, poll_seconds: float = POLL_SECONDS) -> Any:
    """Wait until a flow run is final; returns the final flow run.

    Prefect's ``wait_for_flow_run`` waits for the run's state events only; a final-state event this process never
    receives (a busy server, a dropped events socket) would leave the caller waiting forever. So it waits at most
    ``poll_seconds`` at a time and reads the run's state before the next wait: a run that ended unseen is found
    within one period, and a warning says so.

    Raises:
        StepFailed: when ``timeout`` seconds pass first (the run is then cancelled).
    """
    from prefect.client.orchestration import get_client
    from prefect.exceptions import FlowRunWaitTimeout
    from prefect.flow_runs import wait_for_flow_run
    from prefect.states import Cancelled
    from prefect.utilities.asyncutils import run_coro_as_sync

    deadline = None if timeout is None else time.monotonic() + timeout
    waits = 0
    while deadline is None or time.monotonic() < deadline:
        if waits:
            with get_client(sync_client=True) as client:
                run = client.read_flow_run(flow_run_id)
            if run.state and run.state.is_final():
                _logger().warning("flow run %s ended %s, found by reading its state after %d waits of %.0f s "
                                  "without its final-state event", run.name, run.state.type.value, waits, poll_seconds)
                return run
        window = poll_seconds if deadline is None else min(poll_seconds, deadline - time.monotonic())
        try:
            return run_coro_as_sync(wait_for_flow_run(flow_run_id, timeout=max(1, math.ceil(window))))
        except FlowRunWaitTimeout:
            waits += 1
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        if run.state and run.state.is_final():
            return run
        with contextlib.suppress(Exception):
            client.set_flow_run_state(flow_run_id, Cancelled(message="dispatch timeout"), force=True)
    state = run.state.type.value if run.state else "PENDING"
    raise StepFailed(f"flow run {run.name} ({flow_run_id}) still {state} after {timeout:.0f} s; "
                     "is a worker polling its pool? (`searchloop status`)")


def run_step_on_pool(step: str, kwargs: dict[str, Any], deployment: str = STEP_DEPLOYMENT,
                     timeout: float | None = None) -> Any:
    """Submit ``step`` as a flow run of ``deployment``, wait for it and return its decoded result.

    Raises:
        StepFailed: when the run ends Failed, Crashed or Cancelled (or times out).
    """
    from prefect.deployments import run_deployment

    resolve_step(step)  # fail fast on an unknown name, before anything is submitted
    ensure_crash_detection()
    result_uri = artifacts.join(results_root(), f"{step}-{uuid.uuid4().hex}.json")
    params = {"step": step, "params": encode(kwargs), "result_uri": result_uri}
    run = run_deployment(deployment, parameters=params, timeout=0, as_subflow=True,
                         flow_run_name=f"{step}-{uuid.uuid4().hex[:8]}")
    log = _logger()
    log.info("step %s dispatched to %s as flow run %s (%s)", step, deployment, run.name, run.id)
    final = wait_for_run(run.id, timeout)
    state = final.state.type.value
    if state != "COMPLETED":
        message = (final.state.message or "").strip()
        log.warning("step %s flow run %s ended %s: %s", step, final.name, state, message)
        raise StepFailed(f"step {step!r} flow run {final.name} ({final.id}) ended {state}: {message}; the calling "
                         "task's retries re-dispatch it")
    log.info("step %s flow run %s completed", step, final.name)
    return decode(artifacts.read_json(result_uri)["result"])


def run_step(step: str, **kwargs: Any) -> Any:
    """Run ``step`` in this process, or on the ``gpu`` pool when ``SEARCHLOOP_DISPATCH=pool``."""
    if dispatch_mode() == "local":
        return resolve_step(step)(**kwargs)
    return run_step_on_pool(step, kwargs)
