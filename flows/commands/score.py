"""``searchloop score``: score an existing predictions file (ours or another system's) and print the table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from infra.errors import SearchloopError

console = Console(width=max(Console().width, 160))  # keep the table on one line per row when piped
err_console = Console(stderr=True)


def _print_table(scored, title: str) -> None:
    from evaluation.report import RATE_METRICS

    table = Table(title=title)
    table.add_column("dataset", no_wrap=True)
    table.add_column("n", justify="right")
    for name in scored.table.metric_names:
        table.add_column(name + (" %" if name in RATE_METRICS else ""), justify="right", no_wrap=True)
    for row in scored.table.rows:
        cells = []
        for name in scored.table.metric_names:
            s = row.metrics.get(name)
            k = 100.0 if name in RATE_METRICS else 1.0
            cells.append("–" if s is None else f"{k * s.mean:.1f} [dim][{k * s.low:.1f}, {k * s.high:.1f}][/]")
        table.add_row(row.dataset, str(row.n), *cells)
    console.print(table)
    pct = int(scored.table.confidence * 100)
    console.print(f"[dim]mean with {pct}% bootstrap interval; " + "; ".join(scored.notes) + "[/]")


def _write_outputs(scored, out: Path, predictions: Path) -> None:
    from evaluation.report import write_report
    from infra import artifacts

    artifacts.write_jsonl(artifacts.join(out, "examples.jsonl"), scored.examples)
    artifacts.write_json(artifacts.join(out, "scores.json"), scored.table.model_dump(mode="json"))
    ref = write_report(scored.table, out, title=f"scores of {predictions.name}",
                       details={"predictions": str(predictions)}, notes=scored.notes)
    artifacts.write_manifest(out, kind="scores", predictions=str(predictions), n=len(scored.examples))
    console.print(f"wrote {ref.markdown}")


def _protocol(name: str):
    """The protocol named by ``--extract`` (its answer extraction, normalization and judge prompt)."""
    from infra.errors import ConfigError
    from training.protocols.base import load_protocol

    try:
        return load_protocol(name)
    except ConfigError as exc:
        raise ConfigError(f"--extract: {exc}") from exc


def score(
    predictions: Annotated[Path, typer.Argument(
        help="Predictions: JSON Lines, a JSON list, parquet, or a datasets save_to_disk folder.")],
    pred_field: Annotated[str, typer.Option(help="Field (dotted path) with the predicted answer.")] = "pred",
    gold_field: Annotated[str, typer.Option(help="Field with the gold answers (string or list).")] = "golden_answers",
    id_field: Annotated[str, typer.Option(help="Field with the example id.")] = "id",
    question_field: Annotated[str, typer.Option(help="Field with the question (for --judge).")] = "question",
    dataset_field: Annotated[str, typer.Option(help="Field with the dataset name.")] = "dataset",
    gold_file: Annotated[
        str | None, typer.Option(help="Benchmark name or file; golds are joined from it by id.")
    ] = None,
    dataset: Annotated[str | None, typer.Option(help="Dataset name for rows without one.")] = None,
    extract: Annotated[
        str | None,
        typer.Option(help="The pred field holds a whole response: extract the answer as this protocol does "
                     "(a name in training.protocols.registry.PROTOCOLS)."),
    ] = None,
    normalization: Annotated[
        str | None, typer.Option(help="squad | r1searcher | exsearch_released_buggy (broken; reproduction only); "
                                 "default: the --extract protocol's own rule, else squad.")
    ] = None,
    judge_field: Annotated[
        str | None, typer.Option(help="Field with a stored judge verdict (True/False) reported as acc_l.")
    ] = None,
    judge: Annotated[bool, typer.Option(help="Also ask the LLM judge (SEARCHLOOP_JUDGE_* env).")] = False,
    judge_prompt: Annotated[str | None, typer.Option(
        help="Judge prompt: research | r1searcher; default: the --extract protocol's, else research.")] = None,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the intervals.")] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Directory for report.md, scores.png, examples.jsonl.")] = None,
) -> None:
    """Score a predictions file with EM, F1, precision, recall, acc (cover-EM) and CEM; print the table."""
    from evaluation.judge import JUDGE_PROMPTS, judge_config_from_env
    from evaluation.metrics import NORMALIZATIONS
    from evaluation.predictions import PredictionFields, load_predictions, score_predictions
    from infra.errors import ConfigError

    try:
        protocol = _protocol(extract) if extract else None
        normalization = normalization or (protocol.normalization if protocol else "squad")
        judge_prompt = judge_prompt or (protocol.judge_prompt if protocol else "research")
        if normalization not in NORMALIZATIONS:
            raise ConfigError(f"--normalization {normalization!r} is not one of {', '.join(NORMALIZATIONS)}")
        if judge_prompt not in JUDGE_PROMPTS:
            raise ConfigError(f"--judge-prompt {judge_prompt!r} is not one of {', '.join(JUDGE_PROMPTS)}")
        fields = PredictionFields(id_field=id_field, pred_field=pred_field, gold_field=gold_field,
                                  question_field=question_field, dataset_field=dataset_field, judge_field=judge_field)
        records = load_predictions(predictions, fields, gold_source=gold_file, dataset=dataset,
                                   extract=protocol.extract_answer if protocol else None)
        judge_cfg = judge_config_from_env(judge_prompt) if judge else None  # type: ignore[arg-type]
        scored = score_predictions(records, normalization, judge=judge_cfg, run_judge=judge,  # type: ignore[arg-type]
                                   n_resamples=bootstrap, seed=seed)
        _print_table(scored, f"{predictions.name}: {len(records)} predictions")
        if out is not None:
            _write_outputs(scored, out, predictions)
    except SearchloopError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
        raise typer.Exit(code=2) from exc


def register(app: typer.Typer) -> None:
    """Add ``searchloop score`` to the root app."""
    app.command("score")(score)
