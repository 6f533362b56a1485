"""Prefect side of ``infra.progress``: each tracked loop inside a flow or task run is one progress artifact
(``create_progress_artifact`` then ``update_progress_artifact``) whose description carries counts, rate and ETA.

Artifacts are keyed ``progress-<loop name>-<task run name>`` (one key per loop per task run: two datasets' loops of
the same name stay apart). Outside a
Prefect run the sink does nothing. Updates are throttled to one per ``MIN_INTERVAL_S`` per loop (plus the last).
"""

from __future__ import annotations

import re
import threading
from uuid import UUID

from infra import progress

MIN_INTERVAL_S = 2.0
_ARTIFACTS: dict[str, UUID] = {}
_LOCK = threading.Lock()


def _in_prefect_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def artifact_key(name: str, run_name: str | None = None) -> str:
    """``rollouts exsearch`` in task run ``evaluate-dataset-1f3`` -> ``progress-rollouts-exsearch-evaluate-dataset-1f3``
    (Prefect keys: lowercase letters, digits, dashes). The task run's name keeps two datasets' loops of the same
    name (two ``evaluate-dataset`` runs, each with ``rollouts exsearch (1 trajectories)``) on separate artifacts."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40].strip("-")
    run = re.sub(r"[^a-z0-9]+", "-", run_name.lower()).strip("-") if run_name else ""
    return "-".join(p for p in ("progress", slug, run) if p)[:100].strip("-")


def _run_name() -> str | None:
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    return ctx.task_run.name if ctx is not None and ctx.task_run is not None else None


def prefect_sink(event: progress.ProgressEvent) -> None:
    """Create or update the progress artifact of ``event``'s loop."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    if not _in_prefect_run():
        return
    pct = 100.0 * (event.fraction if event.fraction is not None else (1.0 if event.finished else 0.0))
    with _LOCK:
        artifact_id = _ARTIFACTS.get(event.key)
        if artifact_id is None:
            _ARTIFACTS[event.key] = create_progress_artifact(progress=pct, key=artifact_key(event.name, _run_name()),
                                                             description=event.describe())
        else:
            update_progress_artifact(artifact_id, progress=pct, description=event.describe())
        if event.finished:
            _ARTIFACTS.pop(event.key, None)


def install() -> None:
    """Register the Prefect progress sink (idempotent)."""
    progress.register_sink(prefect_sink, MIN_INTERVAL_S)
