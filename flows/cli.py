"""The ``searchloop`` command line: one command per flow, plus the retriever server, search and ops commands.

Command groups live in ``flows/commands/*``; each registers its commands on the root app. Errors a user can act
on (``SearchloopError``) are printed in one red line and exit with status 2.
"""

from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console

from infra.errors import SearchloopError

COMMAND_MODULES = (
    "flows.commands.retrieval",
    "flows.commands.agent",
    "flows.commands.train",
    "flows.commands.ops",
)

app = typer.Typer(
    name="searchloop",
    help="Train and evaluate LLM search agents (retrieval service, rollouts, EM loop, RL) as Prefect flows.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err_console = Console(stderr=True)

for _module in COMMAND_MODULES:
    try:
        importlib.import_module(_module).register(app)
    except ModuleNotFoundError as exc:  # a command group not present in this checkout
        if exc.name != _module:
            raise


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        app(args=argv, standalone_mode=True)
    except SearchloopError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
