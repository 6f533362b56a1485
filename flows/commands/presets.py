"""``searchloop presets``: every preset in ``flows/configs`` with the flow it configures and a one-line description.

The description is the first line of the YAML file's leading comment; the flow is the one whose config model
validates the preset (``flows.specs.list_presets``). ``--flow`` keeps one flow's presets.
"""

from __future__ import annotations

import textwrap

import typer

from flows.specs import FLOWS
from infra.errors import ConfigError

NO_PRESETS = {
    "retrain": "set its parameters as config.<key>=value (`searchloop deploy run retrain --dry-run` prints them; "
               "flows/configs/retrain*.yaml are its deployment's settings)",
    "gpu-step": "it runs one dispatched GPU step of another flow (SEARCHLOOP_DISPATCH=pool)",
}


def presets(
    flow: str | None = typer.Option(None, help=f"Only this flow's presets: {', '.join(FLOWS)}."),
) -> None:
    """List the presets (name, flow, one-line description); use one with `--preset NAME`."""
    from rich.console import Console

    from flows.specs import list_presets

    if flow in NO_PRESETS:
        raise ConfigError(f"flow {flow!r} takes no presets: {NO_PRESETS[flow]}")
    if flow is not None and flow not in FLOWS:
        from infra.lazy import unknown_name

        raise ConfigError(f"--flow: {unknown_name('flow', flow, [*FLOWS, *NO_PRESETS])}")
    rows = [p for p in list_presets() if flow is None or flow in p.flows]
    console = Console(highlight=False)
    width = max(len(p.name) for p in rows)
    flow_width = max(len(", ".join(p.flows) or "(invalid)") for p in rows)
    room = console.width - width - flow_width - 5
    console.print(f"[bold]{'preset':<{width}}  {'flow':<{flow_width}}  description[/]")
    for p in rows:
        head = f"{p.name:<{width}}  {', '.join(p.flows) or '(invalid)':<{flow_width}}"
        if room >= 30:  # the whole description, wrapped in its column
            lines = textwrap.wrap(p.description, room, break_on_hyphens=False) or [""]
            console.print(f"{head}  {lines[0]}", markup=False)
            for line in lines[1:]:
                console.print(f"{'':<{width + flow_width + 4}}{line}", markup=False)
        else:  # a narrow terminal: the description below, indented
            console.print(head.rstrip(), markup=False)
            for line in textwrap.wrap(p.description, max(20, console.width - 5), break_on_hyphens=False):
                console.print(f"    {line}", markup=False)


def register(app: typer.Typer) -> None:
    """Add ``presets`` to the root app."""
    app.command("presets")(presets)
