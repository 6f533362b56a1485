"""``searchloop run search-value --preset searchr1_learn_cpu [key=value ...]``: what search is worth to an RL
preset's warm-up policy (``training.rl.search_value``).

It takes the RL preset as it is (the same config, overrides and input checks as ``run rl``), builds or reuses the
preset's warm-up (the rl flow's first stage, cached by its inputs), and evaluates it greedily on the preset's held-out
questions closed-book, with its own searches, with the question as the query (top-k) and with the gold paragraphs.
No Prefect flow: one process, one evaluation, files in ``--out``.
"""

from __future__ import annotations

import typer

from flows.commands._flow import OVERRIDES_HELP
from flows.commands._run_group import run_app


def search_value(
    overrides: list[str] | None = typer.Argument(None, show_default=False,
                                                 help=OVERRIDES_HELP.format(example="eval.max_new_tokens=64")),
    preset: str = typer.Option("searchr1_learn_cpu", "--preset", "-p", help="An RL preset with an eval section."),
    conditions: str = typer.Option("closed,own,bm25@1,bm25@3,bm25@5,gold", "--conditions",
                                   help="Comma list: closed, own, gold, <retriever>@<k> (bm25@3, dense@1)."),
    per_dataset: int | None = typer.Option(None, "--per-dataset", min=1,
                                           help="First N held-out questions of each dataset (default: all)."),
    out: str = typer.Option("search_value", "--out", help="Output folder (condition files there are reused)."),
    model: str | None = typer.Option(None, "--model", help="Evaluate this checkpoint instead of the warm-up."),
    own_rows: str | None = typer.Option(None, "--own-rows",
                                        help="Recorded held-out rows of the same checkpoint (heldout_start.jsonl) "
                                             "used for `own`."),
    dense_index: str | None = typer.Option(None, "--dense-index", help="Dense index folder for dense@k."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the preset and the conditions; run nothing."),
) -> None:
    """Evaluate the preset's warm-up policy closed-book, with its own searches, question-as-query and gold docs."""
    from rich.console import Console

    from flows.commands._flow import prepare
    from training.rl.search_value import parse_condition, run_search_value

    names = [c for c in conditions.split(",") if c.strip()]
    for c in names:
        parse_condition(c)
    cfg = prepare("rl-finetune", preset, overrides, dry_run=False) if not dry_run else None
    console = Console(soft_wrap=True)
    if dry_run:
        from flows.specs import resolve

        cfg = resolve("rl-finetune", preset, overrides or [])
        console.print(f"search-value on {cfg.name}: protocol {cfg.protocol}, held-out {cfg.eval.benchmarks} from row "
                      f"{cfg.eval.offset} ({per_dataset or cfg.eval.limit} each), conditions {names}; nothing run")
        return
    result = run_search_value(cfg, names, out, per_dataset=per_dataset, model=model, own_rows=own_rows,
                              dense_index=dense_index,
                              on_condition=lambda c, s: console.print(f"{c}: {s:.0f} s"))
    console.print(f"[bold]{cfg.name}[/] {result.model}: {result.n} questions per condition; files in {result.out_dir}")
    console.print(result.table, markup=False)


def register(app: typer.Typer) -> None:
    """Attach ``search-value`` to the shared ``run`` group."""
    del app
    run_app.command("search-value")(search_value)
