"""MLflow run status follows the Prefect flow run: Prefect state change hooks that end the runs a flow run left open.

A flow that opens a parent MLflow run for its whole length (``rl-finetune``, ``smartsearch-curriculum``, ``em-loop``
and its ``em-iteration`` subflows, ``evaluate``) creates it ``RUNNING`` and never ends it in its body; the child runs
of its tasks (``infra.tracking.child_run``) and ``resume_run`` blocks never touch it. When the flow run reaches a
final state, the hooks in :data:`RUN_STATUS_HOOKS` end every MLflow run still ``RUNNING`` that carries this flow
run's ``prefect.flow_run_id`` tag (every run created inside a flow run has it, ``tasks/links.py``):

=================  ==========
flow run state      MLflow run
=================  ==========
Completed           FINISHED
Failed              FAILED
Crashed             FAILED
Cancelling          KILLED
=================  ==========

Use: ``@flow(name=..., **RUN_STATUS_HOOKS)``. Hooks run in the flow's process after its final state is set (a
runner also runs the crash and cancellation hooks of a flow run whose process died), outside the flow run context,
so they take the run id from their ``flow_run`` argument. A failing hook is logged by Prefect and never changes the
flow run's state. See https://docs.prefect.io/v3/how-to-guides/workflows/state-change-hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from infra import tracking

log = logging.getLogger(__name__)

FLOW_RUN_TAG = "prefect.flow_run_id"

Hook = Callable[[Any, Any, Any], None]


def end_runs_of(flow_run_id: str, status: str) -> list[str]:
    """End with ``status`` the MLflow runs of Prefect flow run ``flow_run_id`` that are still ``RUNNING``."""
    ended = tracking.finish_tagged_runs({FLOW_RUN_TAG: flow_run_id}, status)
    if ended:
        log.info("flow run %s: MLflow run(s) %s marked %s", flow_run_id, ", ".join(ended), status)
    return ended


def _hook(status: str) -> Hook:
    def hook(flow: Any, flow_run: Any, state: Any) -> None:  # noqa: ARG001 - Prefect's hook signature
        end_runs_of(str(flow_run.id), status)

    hook.__name__ = hook.__qualname__ = f"mlflow_runs_{status.lower()}"
    hook.__doc__ = f"Prefect state hook: the flow run's open MLflow runs become {status}."
    return hook


mark_finished = _hook("FINISHED")
mark_failed = _hook("FAILED")
mark_killed = _hook("KILLED")

RUN_STATUS_HOOKS: dict[str, list[Hook]] = {
    "on_completion": [mark_finished],
    "on_failure": [mark_failed],
    "on_crashed": [mark_failed],
    "on_cancellation": [mark_killed],
}
