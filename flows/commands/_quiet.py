"""Library notices a CLI run drops: a named list, installed once at the CLI entry (``flows.cli.main``).

Each entry is a notice a user sees on every run (or twice per run) and cannot act on: it says something about a
library's internals, not about their run. A rule names the logger or warning category, the start of the message and
why it is dropped; anything else from the same logger still prints. Flow runs on a worker log as before (their log
is a file, read when something went wrong).
"""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Quiet:
    """One notice to drop: a log record of ``logger`` or a Python warning of ``category``."""

    why: str
    message: str = ""  # regular expression matched at the start of the message ("" with below: any message)
    logger: str | None = None  # exact logger name (a logger's filters do not see its children's records)
    category: type[Warning] = UserWarning  # for Python warnings (logger None)
    module: str = ""  # regular expression matched at the start of the warning's module
    below: int | None = None  # with logger: drop every record of that logger below this level


QUIET: tuple[Quiet, ...] = (
    Quiet("transformers: SmolLM2's Llama tokenizer keeps the legacy behaviour we rely on; said on every load",
          r"You are using the default legacy behaviour", logger="transformers.models.llama.tokenization_llama_fast"),
    Quiet("transformers: the same notice from the slow Llama tokenizer",
          r"You are using the default legacy behaviour", logger="transformers.models.llama.tokenization_llama"),
    Quiet("MLflow: two registered LocalArtifactDatasetSource classes match a local dataset path; printed per "
          "logged dataset", r"The specified dataset source can be interpreted in multiple ways",
          module=r"mlflow\."),
    Quiet("MLflow: creating the tables of a new sqlite store (first run of a data home)",
          r"(Creating initial MLflow database tables|Updating database tables)", logger="mlflow.store.db.utils"),
    Quiet("MLflow: flushing the trace queue at exit", r"Flushing the async trace logging queue",
          logger="mlflow.tracing.export.async_export_queue"),
    Quiet("bm25s: a DEBUG line per index build (bm25s sets its logger to DEBUG when imported, so a level set "
          "before the import does not hold)", logger="bm25s", below=logging.WARNING),
)


class _Drop(logging.Filter):
    """A logger filter dropping the records one ``Quiet`` rule names."""

    def __init__(self, rule: Quiet) -> None:
        super().__init__()
        self.rule = rule
        self.pattern = re.compile(rule.message)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.rule.below is not None and record.levelno < self.rule.below:
            return False
        if self.rule.below is not None and not self.rule.message:
            return True
        return self.pattern.match(record.getMessage()) is None


_INSTALLED: list[tuple[logging.Logger, _Drop]] = []


def install(rules: tuple[Quiet, ...] = QUIET) -> None:
    """Install the rules (once per process: a second call changes nothing)."""
    if _INSTALLED:
        return
    for rule in rules:
        if rule.logger is None:
            warnings.filterwarnings("ignore", message=rule.message, category=rule.category, module=rule.module)
            continue
        logger = logging.getLogger(rule.logger)
        drop = _Drop(rule)
        logger.addFilter(drop)
        _INSTALLED.append((logger, drop))


def uninstall() -> None:
    """Remove the logger filters ``install`` added (tests; warning filters go with ``warnings.catch_warnings``)."""
    while _INSTALLED:
        logger, drop = _INSTALLED.pop()
        logger.removeFilter(drop)
