"""``gpu-step`` flow: run one named step (``tasks.dispatch.STEPS``) with JSON parameters where a worker runs it.

Deployed on the ``gpu`` work pool (``WORK_POOL``), so a ``gpu`` worker executes what a task dispatched with
``tasks.dispatch.run_step`` (``SEARCHLOOP_DISPATCH=pool``). The result goes to ``result_uri`` for the dispatching
task and is also the flow run's return value. Composition only: the work is ``tasks.dispatch.execute_step_task``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from tasks.dispatch import execute_step_task

WORK_POOL = "gpu"


@flow(name="gpu-step", log_prints=True)
def gpu_step(step: str, params: dict[str, Any] | None = None, result_uri: str | None = None) -> Any:
    """Run ``step`` (a name from ``tasks.dispatch.STEPS``) with ``params`` (JSON, models tagged by class)."""
    return execute_step_task(step, params or {}, result_uri)
