"""One CLI shape for every flow: ``searchloop <verb> [<flow>] --preset P [key.sub=value ...] [--dry-run]``.

:func:`flow_command` makes the typer command of a flow from its :class:`flows.specs.FlowSpec`. Before anything
starts it loads the preset, applies the overrides, validates the config and checks every input path
(``flows.specs.resolve``, no Prefect import: well under two seconds), so a mistake is one line and exit status 2.
``--dry-run`` then prints the resolved config and the stage plan and starts nothing. Otherwise the flow runs,
against the local stack when ``searchloop up`` started one (``use_stack``: the command says so), else on embedded
defaults (an ephemeral Prefect API and a sqlite MLflow store in the data home).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

err = Console(stderr=True, soft_wrap=True, highlight=False)

OVERRIDES_HELP = "key.sub=value settings on top of the preset (merged into nested sections), e.g. {example}"
DRY_RUN_HELP = "Validate, print the resolved config and the stage plan; start nothing (exit 0, or 2 on an error)."


def use_stack(quiet: bool = False) -> dict[str, str] | None:
    """Point Prefect and MLflow at the stack ``searchloop up`` started, when it is up; returns its URLs.

    Variables the user set (``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI``) win. Prints one line saying what is used.
    """
    from infra import stack
    from infra.settings import EMBEDDED_KEYS

    live = stack.live_state()
    if live is None:
        return None
    used = {}
    for var, key in (("PREFECT_API_URL", "prefect_api_url"), ("MLFLOW_TRACKING_URI", "mlflow_url")):
        if var not in os.environ or var in EMBEDDED_KEYS:  # the user's own setting wins, our default does not
            os.environ[var] = live[key]
        used[var] = os.environ[var]
    if not quiet:
        err.print(f"[dim]using the running stack: Prefect {used['PREFECT_API_URL']} (UI {live['prefect_ui_url']}), "
                  f"MLflow {used['MLFLOW_TRACKING_URI']}[/]")
    return used


def print_plan(flow: str, cfg: Any, preset: str | None) -> None:
    """Print the resolved config (YAML) and the flow's stage plan."""
    import yaml

    from flows.specs import flow_spec

    spec = flow_spec(flow)
    out = Console(soft_wrap=True, highlight=False)
    out.print(f"[bold]{flow}[/] with preset [bold]{preset or spec.default_preset}[/]: resolved config")
    out.print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False).rstrip(), markup=False)
    out.print("[bold]stage plan[/] (nothing started: --dry-run)")
    for i, step in enumerate(spec.plan(cfg), 1):
        out.print(f"  {i}. {step}", markup=False)


def prepare(flow: str, preset: str | None, overrides: list[str] | None, dry_run: bool) -> Any | None:
    """Resolve and check the config; print it with the plan on ``--dry-run`` (returns None then)."""
    from infra.config import parse_override, resolve_preset

    resolve_preset(preset)  # a typo in the preset name or an override is reported before the models load
    for text in overrides or []:
        parse_override(text)
    from flows.specs import refuse_secret_overrides, resolve

    refuse_secret_overrides(overrides or [])
    use_stack(quiet=dry_run)  # before the check: a models:/ reference is looked up in the registry runs will use
    cfg = resolve(flow, preset, overrides or [])
    if dry_run:
        print_plan(flow, cfg, preset)
        return None
    from infra.settings import apply_embedded_environment

    apply_embedded_environment()
    return cfg


def flow_command(flow: str, example: str, run: Callable[[Any, str, tuple[str, ...]], None], doc: str,
                 ) -> Callable[..., None]:
    """A typer command running ``flow``: ``run(cfg, preset, overrides)`` after the checks (not on ``--dry-run``)."""
    from flows.specs import FLOWS

    default = FLOWS[flow].default_preset

    def command(
        overrides: list[str] | None = typer.Argument(None, help=OVERRIDES_HELP.format(example=example),
                                                     show_default=False),
        preset: str = typer.Option(default, "--preset", "-p",
                                   help="Preset name (see `searchloop presets`) or a YAML path."),
        dry_run: bool = typer.Option(False, "--dry-run", help=DRY_RUN_HELP),
    ) -> None:
        cfg = prepare(flow, preset, overrides, dry_run)
        if cfg is not None:
            from infra.memory import peak_rss_line

            try:
                run(cfg, preset, tuple(overrides or ()))
            finally:  # memory targets are read off every flow's end (docs/STATUS.md, issue 26)
                typer.echo(peak_rss_line())

    command.__doc__ = doc
    command.__name__ = flow.replace("-", "_")
    return command
