"""Retry policy shared by every task decorator: retry what may pass next time, never a bad input.

A configuration or data error (``ConfigError``, ``DataError``: a missing corpus, a directory where a file belongs,
a bad preset value) fails the same way on every attempt, so retrying it only delays the one-line message. Prefect
calls :func:`retry_unless_input_error` (``retry_condition_fn``) before each retry.
"""

from __future__ import annotations

from typing import Any

from infra.errors import ConfigError, DataError, StoppedError

NOT_RETRIED = (ConfigError, DataError, StoppedError, IsADirectoryError, NotADirectoryError)


def retry_unless_input_error(task: Any, task_run: Any, state: Any) -> bool:
    """``retry_condition_fn`` for ``@task``: False when the failure is an input error that cannot succeed later.

    Args:
        task: the Prefect task (unused).
        task_run: the failed task run (unused).
        state: the Failed state; its ``data`` holds the raised exception.
    """
    del task, task_run
    return not isinstance(getattr(state, "data", None), NOT_RETRIED)
