"""``searchloop run em-loop --preset exsearch_cpu_demo [key=value ...]``: the ExSearch EM loop flow."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from flows.commands._flow import flow_command
from flows.commands._run_group import run_app

if TYPE_CHECKING:
    from training.em.records import IterationResult

console = Console()


def _run(cfg, preset: str, overrides: tuple[str, ...]) -> None:  # noqa: ANN001 - EMLoopConfig
    import logging
    import os

    # show the library's INFO lines (e.g. "skipping <step>: already complete at <dir>") in the flow run logs
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "training")
    logging.getLogger("training").setLevel(logging.INFO)
    from flows.em_loop import em_loop

    console.print(history_table(em_loop(preset, overrides)))


def history_table(history: list[IterationResult]) -> Table:
    """The per-iteration held-out table the CLI prints after the EM loop."""
    table = Table(title="held-out results per iteration (95% bootstrap intervals)")
    for col in ("iteration", "F1", "F1 interval", "EM", "EM interval", "version", "champion moved"):
        table.add_column(col)
    for h in history:
        table.add_row(str(h.iteration), f"{h.f1.mean:.4f}", f"[{h.f1.low:.4f}, {h.f1.high:.4f}]",
                      f"{h.em.mean:.4f}", f"[{h.em.low:.4f}, {h.em.high:.4f}]", h.version,
                      "yes" if h.promoted else "no")
    return table


def register(app: typer.Typer) -> None:
    """Attach ``em-loop`` to the shared ``run`` group (the group itself is added by ``_run_group``)."""
    run_app.command("em-loop")(flow_command(
        "em-loop", "iterations=1", _run,
        "Warm-up SFT, then EM iterations (sample, score, select, weighted train, evaluate) with resume."))
