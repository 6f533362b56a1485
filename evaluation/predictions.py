"""Score a predictions file written by any system (ours or a seed's published outputs) with our metrics.

The file is JSON Lines or a JSON list of objects. Field names are configurable and may be dotted paths into
nested objects (FlashRAG's ``intermediate_data.json`` keeps the answer at ``output.pred``). Gold answers come from
a field of each row or, joined by id, from a benchmark file or name (``--gold-file hotpotqa_dev``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evaluation.benchmarks import dataset_from_path, load_benchmark, read_rows
from evaluation.judge import JudgeConfig, JudgeItem, judge_answers, verdict_from_value
from evaluation.metrics import Normalization, ScoreTable, aggregate, answer_metrics
from infra.config import StrictModel
from infra.errors import DataError

_MISSING = object()
#: what :func:`get_field` returns for an absent path (public name for callers outside this module)
MISSING = _MISSING


class PredictionFields(StrictModel):
    """Where each value sits in a prediction row (dotted paths allowed, e.g. ``output.pred``)."""

    id_field: str = Field(default="id", description="Example id (needed to join golds from a benchmark).")
    pred_field: str = Field(default="pred", description="Predicted answer text.")
    gold_field: str = Field(default="golden_answers", description="Gold answers (string or list).")
    question_field: str = Field(default="question", description="Question text (used by the LLM judge).")
    dataset_field: str = Field(default="dataset", description="Dataset name, for the per-dataset table.")
    judge_field: str | None = Field(
        default=None, description="Stored LLM-judge verdict (True/False, correct/incorrect) to report as acc_l."
    )


class PredictionRecord(BaseModel):
    """One prediction with its golds, ready to score."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Example id.")
    prediction: str = Field(description="Predicted answer ('' when the row had null).")
    golden_answers: list[str] = Field(description="Accepted answers.")
    question: str = Field(default="", description="Question text, when known.")
    dataset: str = Field(description="Dataset name.")
    judge: bool | None = Field(default=None, description="Stored judge verdict, when the file carries one.")


class ScoredPredictions(BaseModel):
    """Per-example metrics and the per-dataset table."""

    model_config = ConfigDict(frozen=True)

    examples: list[dict] = Field(description="One dict per prediction: id, dataset, prediction, golds, metrics.")
    table: ScoreTable = Field(description="Aggregated per-dataset scores with intervals.")
    notes: list[str] = Field(default_factory=list, description="Messages for the report (e.g. judge skipped).")


def get_field(row: Any, path: str) -> Any:
    """Value at a dotted path (``output.pred``; digits index lists), or a sentinel when absent."""
    node = row
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _read_rows(path: Path) -> list[tuple[str, Any]]:
    from evaluation.formats import is_hf_dataset_dir

    if path.is_dir() and not is_hf_dataset_dir(path):
        raise DataError(f"{path} is a directory; give the predictions file inside it (JSON Lines, JSON or parquet), "
                        "or a datasets save_to_disk folder")
    if not path.is_file() and not is_hf_dataset_dir(path):
        raise DataError(f"predictions file {path} does not exist (expected JSON Lines, JSON, parquet or a "
                        "datasets save_to_disk folder)")
    out = read_rows(path)
    if not out:
        raise DataError(f"{path} holds no predictions")
    return out


def _as_golds(value: Any, where: str, field: str) -> list[str]:
    if isinstance(value, bool):
        return ["yes" if value else "no"]
    if isinstance(value, (str, int, float)):
        return [str(value)]
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise DataError(f"{where}: gold field {field!r} must be a string or list of strings, got {value!r:.100}")


def _require(row: Any, path: str, where: str, hint: str) -> Any:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    value = get_field(row, path)
    if value is _MISSING:
        raise DataError(f"{where}: no field {path!r} (keys: {sorted(row)}); {hint}")
    return value


def load_predictions(
    path: str | Path,
    fields: PredictionFields | None = None,
    gold_source: str | Path | None = None,
    dataset: str | None = None,
    extract: Callable[[str], str | None] | None = None,
) -> list[PredictionRecord]:
    """Read predictions and attach their golds.

    Args:
        path: JSON Lines, JSON list or parquet file, or a ``datasets`` ``save_to_disk`` folder.
        fields: field names (defaults: id, pred, golden_answers, question, dataset).
        gold_source: benchmark name or file; when given, golds (and missing questions/datasets) are joined from it
            by id and every prediction id must be found there.
        dataset: dataset name for rows without one (default: the gold source's, else the file name's).
        extract: applied to the prediction field when it holds a whole response (e.g. a protocol's
            ``extract_answer``); ``None`` from it becomes the empty prediction.

    Raises:
        DataError: naming the file, line and missing field, unknown ids or duplicate ids.
    """
    f = fields or PredictionFields()
    path = Path(path)
    gold = {q.id: q for q in load_benchmark(gold_source)} if gold_source is not None else None
    default_dataset = dataset or dataset_from_path(path)
    records: list[PredictionRecord] = []
    seen: set[str] = set()
    for index, (where, row) in enumerate(_read_rows(path)):
        record = _record(row, where, index, f, gold, str(gold_source), dataset, default_dataset)
        if extract is not None:
            record = record.model_copy(update={"prediction": extract(record.prediction) or ""})
        if record.id in seen:
            raise DataError(f"{where}: duplicate id {record.id!r}; ids must be unique")
        seen.add(record.id)
        records.append(record)
    return records


def _record(row: Any, where: str, index: int, f: PredictionFields, gold: dict | None, gold_name: str,
            dataset: str | None, default_dataset: str) -> PredictionRecord:
    pred = _require(row, f.pred_field, where, "choose the answer field with --pred-field")
    raw_id = get_field(row, f.id_field)
    if raw_id is _MISSING:
        if gold is not None:
            _require(row, f.id_field, where, "choose the id field with --id-field (needed to join --gold-file)")
        raw_id = index
    qid = str(raw_id)
    question = get_field(row, f.question_field)
    ds = get_field(row, f.dataset_field)
    if gold is not None:
        if qid not in gold:
            raise DataError(f"{where}: id {qid!r} is not in the gold source {gold_name} "
                            f"(e.g. {', '.join(list(gold)[:3])}); check --id-field and --gold-file")
        q = gold[qid]
        golds = q.golden_answers
        question = question if isinstance(question, str) else q.question
        ds = ds if isinstance(ds, str) and ds else (dataset or q.dataset)
    else:
        value = _require(row, f.gold_field, where, "choose it with --gold-field or join golds with --gold-file")
        golds = _as_golds(value, where, f.gold_field)
    verdict = None
    if f.judge_field is not None:
        verdict = verdict_from_value(_require(row, f.judge_field, where, "choose it with --judge-field"))
    return PredictionRecord(
        id=qid,
        judge=verdict,
        prediction="" if pred is None else str(pred),
        golden_answers=golds,
        question=question if isinstance(question, str) else "",
        dataset=ds if isinstance(ds, str) and ds else default_dataset,
    )


def score_predictions(
    records: Sequence[PredictionRecord],
    normalization: Normalization = "squad",
    judge: JudgeConfig | None = None,
    run_judge: bool = False,
    confidence: float = 0.95,
    n_resamples: int = 1000,
    seed: int = 0,
) -> ScoredPredictions:
    """Score predictions: answer metrics per example, optional LLM judge (``acc_l``), per-dataset table.

    Args:
        records: from :func:`load_predictions`.
        normalization: answer normalization (see :mod:`evaluation.metrics`).
        judge: judge endpoint; with ``run_judge`` and no config the environment is used, else the judge is skipped.
        run_judge: ask the LLM judge.
        confidence, n_resamples, seed: bootstrap settings.
    """
    examples = [
        {"id": r.id, "dataset": r.dataset, "prediction": r.prediction, "golden_answers": r.golden_answers,
         **answer_metrics(r.prediction, r.golden_answers, normalization)}
        for r in records
    ]
    notes = [f"normalization: {normalization}"]
    if any(r.judge is not None for r in records):
        for ex, r in zip(examples, records, strict=True):
            ex["acc_l"] = 1.0 if r.judge else 0.0
        notes.append("acc_l from the verdicts stored in the predictions file")
    if run_judge:
        items = [JudgeItem(question=r.question, golden_answers=r.golden_answers, prediction=r.prediction)
                 for r in records]
        result = judge_answers(items, judge)
        notes.append(result.message)
        if not result.skipped:
            for ex, verdict in zip(examples, result.verdicts, strict=True):
                ex["acc_l"] = 1.0 if verdict.correct else 0.0
    table = aggregate(examples, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return ScoredPredictions(examples=examples, table=table, notes=notes)
