"""Prefect side of ``infra.progress``: each tracked loop inside a flow or task run is one progress artifact
(``create_progress_artifact`` then ``update_progress_artifact``) whose description carries counts, rate and ETA,
and a ``progress <loop>: 3/8 step (38%) ... ETA 2m05s; loss 1.79`` line in the run's log every
``LOG_LINE_INTERVAL_S`` while it has done some work (:class:`RunLogSink`): a deployment run on a worker has no
terminal, and a long step (a warm-up SFT in its engine subprocess) would otherwise leave the worker's log and the
UI's run log silent for minutes.

Artifacts are keyed ``progress-<loop name>-<task run name>`` (one key per loop per task run: two datasets' loops of
the same name stay apart). Outside a
Prefect run the sink does nothing. Updates are throttled to one per ``MIN_INTERVAL_S`` per loop (plus the last).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from uuid import UUID

from infra import progress

MIN_INTERVAL_S = 2.0
LOG_LINE_INTERVAL_S = 30.0
LOG_UPDATE_INTERVAL_S = 0.5  # how fresh the state a log line shows is (storing it is cheap: no I/O)
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


def current_run_logger() -> logging.LoggerAdapter | None:
    """The flow or task run's logger (``get_run_logger``), or None outside a Prefect run."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    if not _in_prefect_run():
        return None
    try:
        return get_run_logger()
    except MissingContextError:
        return None


class RunLogSink(progress.LineSink):
    """Timer lines (``infra.progress.LineSink``) in the log of the run that started each loop.

    The run's logger is taken in the loop's own thread on its first event (the timer thread has no run context;
    the logger carries the flow and task run ids). With no terminal sink registered (a worker's flow-run process)
    a line goes through the run logger: the worker's log and the UI's run log. When the CLI shows progress in the
    terminal (:class:`infra.progress.TerminalSink`), the line goes to the Prefect API only, so the terminal does not
    show each line twice.
    """

    def __init__(self, line_interval_s: float = LOG_LINE_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 run_logger: Callable[[], logging.LoggerAdapter | None] = current_run_logger) -> None:
        super().__init__(line_interval_s, clock)
        self.run_logger = run_logger
        self._api_handler: logging.Handler | None = None

    def _bind(self, event: progress.ProgressEvent) -> object | None:
        return self.run_logger()

    def _write(self, event: progress.ProgressEvent, target: object) -> None:
        logger: logging.LoggerAdapter = target  # type: ignore[assignment]
        message = f"progress {event.describe()}"
        if not progress.has_sink(progress.TerminalSink):
            logger.info(message)
            return
        if self._api_handler is None:
            from prefect.logging.handlers import APILogHandler

            self._api_handler = APILogHandler()
        msg, kwargs = logger.process(message, {})
        record = logger.logger.makeRecord(logger.logger.name, logging.INFO, __file__, 0, msg, (), None,
                                          extra=kwargs.get("extra"))
        self._api_handler.handle(record)


RUN_LOG_SINK = RunLogSink()


def install() -> None:
    """Register the Prefect progress sinks: artifacts and run-log lines (idempotent)."""
    progress.register_sink(prefect_sink, MIN_INTERVAL_S)
    progress.register_sink(RUN_LOG_SINK, LOG_UPDATE_INTERVAL_S)
