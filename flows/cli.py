"""The ``searchloop`` command line: one command per flow, plus the retriever server, search and ops commands.

Command groups live in ``flows/commands/*`` (discovered at start); each registers its commands. Errors a user can act
on (``SearchloopError``) are printed in one red line and exit with status 2.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer
from rich.console import Console
from typer.core import TyperGroup

from infra.errors import SearchloopError


def hide_flag_types(command: typer.core.TyperCommand | TyperGroup) -> None:
    """Show no value type after a flag in help (``--dry-run``, ``--help``), in ``command`` and every subcommand.

    typer 0.29 prints ``<bool>`` after every option with no metavar, flags included, though a flag takes no value
    (``--help <bool>`` reads as if it wanted one). An empty metavar is typer's own way to print no type; the help
    option is built lazily, so it is built here first (it is cached on the command).
    """
    help_option = command.get_help_option(command.context_class(command))
    for param in [*command.params, *([help_option] if help_option else [])]:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        hide_flag_types(sub)


class _RootGroup(TyperGroup):
    """The root command group: hides flag value types in every help page before parsing (see hide_flag_types)."""

    def make_context(self, info_name: str | None, args: list[str], parent: object = None, **extra: object) -> object:
        hide_flag_types(self)
        return super().make_context(info_name, args, parent, **extra)  # type: ignore[arg-type]


app = typer.Typer(
    cls=_RootGroup,
    name="searchloop",
    help="Train and evaluate LLM search agents (retrieval service, rollouts, EM loop, RL) as Prefect flows.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)


def _register_commands() -> None:
    import flows.commands as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"flows.commands.{info.name}")
        if hasattr(module, "register"):  # helpers such as _flow register nothing
            module.register(app)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("searchloop")
        except PackageNotFoundError:  # running from a checkout that was never pip-installed
            v = "0+unknown"
        typer.echo(f"searchloop {v}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the searchloop version and exit."),
) -> None:
    """Train and evaluate LLM search agents (retrieval service, rollouts, EM loop, RL) as Prefect flows."""


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (sets the embedded defaults before any engine is imported)."""
    from flows.commands import _quiet
    from infra import progress
    from infra.proc import exit_on_sigterm
    from infra.settings import apply_embedded_environment

    exit_on_sigterm()  # `kill` stops the services this run started (Prefect's temporary server) with it
    apply_embedded_environment()
    _quiet.install()  # library notices a user cannot act on (the named list in flows/commands/_quiet.py)
    progress.register_sink(progress.TerminalSink(), min_interval_s=0.5)
    try:
        app(args=argv, standalone_mode=True)
    except SearchloopError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
