"""``searchloop run smartsearch --preset smartsearch_cpu_demo [key=value ...]``: the SmartSearch curriculum."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from flows.commands._flow import flow_command
from flows.commands._run_group import run_app

console = Console()


def _run(cfg, preset: str, overrides: tuple[str, ...]) -> None:  # noqa: ANN001 - SmartSearchConfig
    from flows.smartsearch_curriculum import smartsearch_curriculum

    result = smartsearch_curriculum(preset, overrides)
    table = Table(title=f"SmartSearch run {result.run_id} ({result.root})")
    for col in ("stage", "trained", "seconds", "last loss", "counts"):
        table.add_column(col)
    for s in result.stages:
        counts = ", ".join(f"{k}={v:g}" for k, v in s.counts.items())
        loss = f"{s.losses[-1]:.4f}" if s.losses else "-"
        table.add_row(s.stage, str(s.trained), f"{s.seconds:.0f}", loss, counts)
    console.print(table)
    for label, table in result.scores.items():
        for row in table.rows:
            cells = [f"{m}={s.mean:.3f} [{s.low:.3f}, {s.high:.3f}]"
                     for m, s in row.metrics.items() if m in ("em", "f1", "format_ok")]
            console.print(f"{label:>8} {row.dataset} (n={row.n}): " + ", ".join(cells))
    for stage, reg in result.registered.items():
        console.print(f"registered {stage}: {reg.name} v{reg.version}")


def register(app: typer.Typer) -> None:
    """Attach ``smartsearch`` to the shared ``run`` group."""
    run_app.command("smartsearch")(flow_command(
        "smartsearch-curriculum", "stage3.trl.max_steps=2", _run,
        "SmartSearch: screened SFT -> DPO on refined-vs-original pairs -> query-aware GRPO, each evaluated."))
