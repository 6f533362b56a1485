"""``searchloop eval``: run the evaluate flow from a preset with ``key=value`` overrides."""

from __future__ import annotations

import typer
from rich.console import Console

console = Console()


def eval_command(
    preset: str = typer.Option("eval_mini", "--preset", "-p", help="Preset name in flows/configs or a YAML path."),
    overrides: list[str] = typer.Argument(None, help="key.sub=value overrides, e.g. agent.limit=5"),
) -> None:
    """Evaluate search agents on benchmarks (one retried task per protocol x dataset) and print the table."""
    from flows.evaluate import EvaluateConfig, evaluate
    from infra.config import load_config
    from infra.settings import apply_embedded_environment

    cfg = load_config(EvaluateConfig, preset, overrides or [])
    apply_embedded_environment()
    result = evaluate(cfg)
    console.print(result.markdown, soft_wrap=True)
    console.print(f"report: [bold]{result.report_dir}/report.md[/]  MLflow run: [bold]{result.run_id}[/]")


def register(app: typer.Typer) -> None:
    """Add ``eval`` to the root app."""
    app.command("eval")(eval_command)
