"""``searchloop demo``: the main job on embedded defaults (local Prefect, local MLflow, shipped data, small models)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from flows.commands._flow import flow_command

console = Console()


def _run(cfg, preset: str, overrides: tuple[str, ...]) -> None:  # noqa: ANN001 - DemoConfig
    from flows.demo import demo
    from infra.settings import get_settings

    result = demo(preset, overrides)
    datasets = sorted({d for r in result.recall.values() for d in r})
    table = Table(title="Recall@5 (any gold passage) over data/corpus/mini.jsonl")
    table.add_column("index")
    for d in datasets:
        table.add_column(d, justify="right")
    table.add_column("MLflow run")
    for name, row in result.recall.items():
        table.add_row(name, *[f"{row[d]:.3f}" if d in row else "-" for d in datasets], result.index_runs[name])
    console.print(table)
    if result.eval_table:
        console.print("[bold]Search agent (SmolLM2-135M) on the minis[/]")
        console.print(result.eval_table, soft_wrap=True)
        console.print(f"agent evaluation MLflow run: [bold]{result.eval_run}[/]")
    if result.train_table:
        console.print(f"[bold]Training stage ({cfg.train_preset}): policy RL started from vs trained, held-out "
                      "questions (final - start with paired bootstrap 95% intervals)[/]")
        console.print(result.train_table, soft_wrap=True)
        console.print(f"training MLflow run: [bold]{result.train_run}[/]")
    uri = get_settings().tracking_uri
    console.print(f"MLflow store: {uri}" + ("" if uri.startswith("http") else f"  (browse: mlflow ui "
                                                                             f"--backend-store-uri {uri})"))


def register(app: typer.Typer) -> None:
    """Add ``demo`` to the root app."""
    app.command("demo")(flow_command(
        "demo", "run_agent=false", _run,
        "Build a BM25 index over the mini corpus (index_presets adds dense, ...), serve it, evaluate recall, the "
        "SmolLM2 agent and a short training stage (preset demo)."))
