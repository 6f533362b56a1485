"""``searchloop run rl --preset research_grpo_cpu_demo [key=value ...]``: the rl-finetune flow."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from flows.commands._flow import flow_command
from flows.commands._run_group import run_app

console = Console()


def _run(cfg, preset: str, overrides: tuple[str, ...]) -> None:  # noqa: ANN001 - RLConfig
    from flows.rl_finetune import rl_finetune

    result = rl_finetune(preset, overrides)
    table = Table(title=f"RL run {result.run_id} ({result.root})")
    for col in ("stage", "engine", "steps", "reward", "format fail", "searches/traj", "checkpoint"):
        table.add_column(col)
    for c in result.checkpoints:
        m = c.metrics
        table.add_row(c.stage, c.engine, str(c.steps), f"{m.get('reward', float('nan')):.3f}",
                      f"{m.get('search/format_failure_rate', float('nan')):.3f}",
                      f"{m.get('search/searches_per_traj', float('nan')):.2f}", c.uri)
    console.print(table)
    for row in result.scores.rows if result.scores else []:
        console.print(f"{row.dataset} (n={row.n}): " + ", ".join(f"{k}={v.mean:.3f}" for k, v in row.metrics.items()))
    if result.learning:
        console.print(f"[bold]held-out, policy RL started from vs trained ({result.learning.n} questions, final - "
                      f"start with paired 95% intervals)[/]; evidence: {result.learning.dir}")
        console.print(result.learning.table, soft_wrap=True)
    if result.registered:
        console.print(f"registered {result.registered.name} v{result.registered.version}")


def register(app: typer.Typer) -> None:
    """Attach ``rl`` to the shared ``run`` group (the group itself is added by ``_run_group``)."""
    run_app.command("rl")(flow_command(
        "rl-finetune", "stages.grpo.trl.max_steps=2", _run,
        "Prepare data, (bucket by difficulty), train the preset's stage(s) with TRL or verl, evaluate, register."))
