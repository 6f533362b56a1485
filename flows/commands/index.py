"""CLI: ``searchloop index build`` runs the build-index flow from a preset; ``searchloop index eval`` scores an index.

Heavy imports (Prefect, the backends) happen inside the commands so ``searchloop --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

from flows.commands._flow import flow_command
from infra.errors import ConfigError


def recall_table(report, title: str):  # noqa: ANN001, ANN201 - RecallReport -> rich Table (lazy imports)
    """A rich table with one row per dataset and cut-off k: any-gold, all-gold and mean fraction of gold found."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("dataset", "n", "k", "any-gold", "all-gold", "mean frac"):
        table.add_column(col, justify="left" if col == "dataset" else "right")
    for d in report.datasets:
        if not d.n:
            table.add_row(d.dataset, "0", "-", "-", "-", "-", end_section=True)
            continue
        for i, k in enumerate(report.ks):
            table.add_row(d.dataset if i == 0 else "", str(d.n) if i == 0 else "", str(k), f"{d.any_gold[k]:.3f}",
                          f"{d.all_gold[k]:.3f}", f"{d.mean_fraction[k]:.3f}", end_section=i == len(report.ks) - 1)
    return table


def _run_build(cfg, preset: str, overrides: tuple[str, ...]) -> None:  # noqa: ANN001 - BuildIndexFlowConfig
    from rich.console import Console

    from flows.build_index import build_index_flow

    result = build_index_flow(preset, overrides)
    console = Console()
    ref = result.index
    console.print(f"[green]index[/] {ref.backend} at {ref.uri}: {ref.n_passages} passages, "
                  f"{ref.size_bytes / 1e6:.1f} MB{' (reused)' if ref.reused else ''}")
    if result.recall is not None:
        console.print(recall_table(result.recall, f"recall ({ref.backend}, {cfg.name})"))
        for d in result.recall.datasets:
            if d.note:
                console.print(f"[yellow]{d.dataset}[/]: {d.note}")
    console.print(f"MLflow run id: [bold]{result.mlflow_run_id}[/]")


build = flow_command("build-index", "index.backend=dense", _run_build,
                     "Build an index with the build-index Prefect flow, evaluate recall and log an MLflow run.")


def evaluate(
    index_dir: Path = typer.Argument(..., help="A built index directory (with manifest.json)."),
    eval_files: list[str] = typer.Option(["data/eval/hotpotqa_mini.jsonl"], "--eval", "-e",
                                         help="Eval jsonl (repeatable)."),
    k: list[int] = typer.Option([1, 5, 10], "--ks", "-k", help="Cut-offs (repeatable; config key evaluation.ks)."),
    query_backend: str | None = typer.Option(None, help="What encodes a dense index's queries: torch, torch-int8, "
                                                      "onnx or onnx-int8; default: the index's setting."),
    query_model: Path | None = typer.Option(None, help="A query encoder distilled for this dense index "
                                                       "(`searchloop index distill-queries`)."),
) -> None:
    """Recall@k of gold passages for an existing index (no flow, no MLflow run)."""
    from rich.console import Console

    from infra.config import build_config
    from retrieval.config import QUERY_BACKENDS
    from retrieval.recall import RecallConfig, evaluate_index_recall

    if any(x < 1 for x in k):
        raise ConfigError(f"--ks values must be >= 1, got {k}")
    if query_backend is not None and query_backend not in QUERY_BACKENDS:
        raise ConfigError(f"--query-backend {query_backend!r} is not one of {', '.join(QUERY_BACKENDS)}")
    cfg = build_config(RecallConfig, {"files": eval_files, "ks": k}, "command line")
    report = evaluate_index_recall(index_dir, cfg, query_backend, None if query_model is None else str(query_model))
    console = Console()
    console.print(recall_table(report, f"recall of {index_dir}"))
    for d in report.datasets:
        if d.note:
            console.print(f"[yellow]{d.dataset}[/]: {d.note}")


def distill_queries(
    index_dir: Path = typer.Option(..., "--index", help="The dense index whose encoder the student stands in for, "
                                                        "for queries only (a hybrid index: its dense part)."),
    out: Path = typer.Option(..., "--out", help="The student's folder (must not exist)."),
    layers: str | None = typer.Option(None, help="Comma-separated teacher layers the student keeps (default: every "
                                                 "other one, from the first: 0,2,4 of MiniLM's 6)."),
    questions: list[str] = typer.Option(None, "--questions", help="Training-question jsonl (repeatable; default: "
                                                                   "shared data's train/ files); never eval files."),
    epochs: int = typer.Option(4, min=1, help="Training epochs."),
    limit: int | None = typer.Option(None, min=1, help="Use at most this many training queries."),
    seed: int = typer.Option(0, help="Shuffling and training seed."),
) -> None:
    """Distill a smaller query encoder into a dense index's space (serve it with --query-model; opt-in: measure its
    recall with `searchloop index eval --query-model`)."""
    from rich.console import Console

    from infra.artifacts import require_manifest
    from retrieval.distill import distill_query_encoder
    from retrieval.index import IndexBuildConfig

    cfg = IndexBuildConfig.model_validate(require_manifest(index_dir, kind="index")["config"])
    if cfg.backend != "dense":
        hint = f" (pass its dense part, e.g. {index_dir}/dense)" if cfg.backend == "hybrid" else ""
        raise ConfigError(f"{index_dir} is a {cfg.backend} index: a query encoder is distilled for a dense index{hint}")
    try:
        keep = None if layers is None else [int(x) for x in layers.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"--layers {layers!r}: give comma-separated layer numbers, e.g. 0,2,4") from exc
    manifest = distill_query_encoder(cfg.encoder, out, keep, questions or None, epochs=epochs, limit=limit, seed=seed)
    Console().print(f"[green]distilled[/] {out}: layers {manifest['layers']} of {manifest['teacher_layers']}, "
                    f"{manifest['n_train']} training queries, held-out cosine to the teacher mean "
                    f"{manifest['heldout_cosine_mean']:.4f} (min {manifest['heldout_cosine_min']:.4f}), "
                    f"{manifest['seconds']:.0f} s")


def register(app: typer.Typer) -> None:
    """Add the ``index`` command group."""
    index_app = typer.Typer(help="Build and evaluate retrieval indexes.", no_args_is_help=True)
    index_app.command("build")(build)
    index_app.command("eval")(evaluate)
    index_app.command("distill-queries")(distill_queries)
    app.add_typer(index_app, name="index")
