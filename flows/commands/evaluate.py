"""``searchloop eval --preset P [key=value ...]``: run the evaluate flow and print the table."""

from __future__ import annotations

import typer

from flows.commands._flow import flow_command


def _run(cfg, preset: str, overrides: tuple[str, ...]) -> None:  # noqa: ANN001 - EvaluateConfig
    from rich.console import Console

    from flows.evaluate import evaluate

    result = evaluate(preset, overrides)
    console = Console()
    console.print(result.markdown, soft_wrap=True)
    console.print(f"report: [bold]{result.report_dir}/report.md[/]  MLflow run: [bold]{result.run_id}[/]")


def register(app: typer.Typer) -> None:
    """Add ``eval`` to the root app."""
    app.command("eval")(flow_command(
        "evaluate", "agent.limit=5", _run,
        "Evaluate search agents on benchmarks (one retried task per protocol x dataset) and print the table. "
        "Default preset eval_demo (one protocol, 2 x 2 questions, about a minute); --preset eval_mini is every "
        "protocol on all 200 mini questions (about 20 minutes on 2 cores)."))
