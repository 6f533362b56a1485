"""Retrieval evaluation: recall@k of gold supporting passages, per dataset, from any Searcher.

For each question with gold passages, at each k: any-gold (at least one gold passage in the top k), all-gold
(every gold passage in the top k) and the mean fraction of gold passages found. Hit ids of split passages
(``<id>#<n>``) count for their source document. Questions without gold passages (Bamboogle) are skipped and the
report says so. This module takes plain records (``RecallExample``), not ``evaluation.benchmarks.Question``, so the
retrieval layer never imports the evaluation layer; any object with ``question``/``supporting_doc_ids`` fits.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from infra.artifacts import read_jsonl
from infra.config import StrictModel
from infra.errors import DataError
from retrieval.types import Hit, Searcher


class RecallConfig(StrictModel):
    """Which eval files to score an index on, and at which cut-offs."""

    files: list[str] = Field(
        default_factory=lambda: ["data/eval/hotpotqa_mini.jsonl"],
        description="Eval jsonl files (rows with question + supporting_doc_ids); paths resolve like the corpus.",
    )
    ks: list[int] = Field(default_factory=lambda: [1, 5, 10], description="Cut-offs k for recall@k.")
    batch_size: int = Field(default=256, ge=1, description="Questions per Searcher.search call.")


class RecallExample(BaseModel):
    """The part of a benchmark question that retrieval evaluation needs."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Question id.")
    question: str = Field(description="Question text (the query).")
    dataset: str = Field(default="", description="Dataset name (groups the report).")
    supporting_doc_ids: list[str] = Field(default_factory=list, description="Corpus ids of the gold passages.")


class DatasetRecall(BaseModel):
    """Recall of one dataset."""

    model_config = ConfigDict(frozen=True)

    dataset: str = Field(description="Dataset name.")
    n: int = Field(description="Questions scored (with gold passages).")
    skipped: int = Field(description="Questions without gold passages (not scored).")
    any_gold: dict[int, float] = Field(description="k -> share of questions with at least one gold in the top k.")
    all_gold: dict[int, float] = Field(description="k -> share of questions with every gold in the top k.")
    mean_fraction: dict[int, float] = Field(description="k -> mean share of gold passages in the top k.")
    note: str = Field(default="", description="Why the dataset was skipped, when it was.")


class RecallReport(BaseModel):
    """Recall of one index over several datasets."""

    model_config = ConfigDict(frozen=True)

    index: str = Field(description="Searcher name or index path.")
    ks: list[int] = Field(description="Cut-offs.")
    datasets: list[DatasetRecall] = Field(description="Per-dataset results, in input order.")

    def metrics(self) -> dict[str, float]:
        """Flat metrics for MLflow: ``recall.<dataset>.any_gold@5`` etc."""
        out: dict[str, float] = {}
        for d in self.datasets:
            if not d.n:
                continue
            for k in self.ks:
                out[f"recall.{d.dataset}.any_gold@{k}"] = d.any_gold[k]
                out[f"recall.{d.dataset}.all_gold@{k}"] = d.all_gold[k]
                out[f"recall.{d.dataset}.mean_fraction@{k}"] = d.mean_fraction[k]
        return out


def load_examples(path: str | os.PathLike[str], dataset: str | None = None) -> list[RecallExample]:
    """Read eval jsonl rows (``id``, ``question``, ``supporting_doc_ids``, optional ``dataset``).

    Raises:
        DataError: naming the file and row when a row lacks a question.
    """
    if not Path(str(path)).exists() and "://" not in str(path):
        raise DataError(f"eval file {path} does not exist; pass a jsonl such as data/eval/hotpotqa_mini.jsonl")
    name = dataset or Path(str(path)).stem.removesuffix("_mini").removesuffix("_dev").removesuffix("_test")
    out = []
    for i, row in enumerate(read_jsonl(path), 1):
        if not isinstance(row, dict) or not isinstance(row.get("question"), str):
            raise DataError(f"{path}:{i}: eval rows need a 'question' string (and 'supporting_doc_ids' for recall)")
        out.append(RecallExample(id=str(row.get("id", i)), question=row["question"],
                                 dataset=row.get("dataset") or name,
                                 supporting_doc_ids=[str(x) for x in row.get("supporting_doc_ids") or []]))
    return out


def _doc_id(hit: Hit) -> str:
    return hit.id.split("#", 1)[0]


def score_dataset(name: str, examples: Sequence[RecallExample], results: Sequence[list[Hit]],
                  ks: Sequence[int]) -> DatasetRecall:
    """Recall of ``results`` (aligned with ``examples``) at each k."""
    anyg, allg, frac = defaultdict(float), defaultdict(float), defaultdict(float)
    scored = skipped = 0
    for ex, hits in zip(examples, results, strict=True):
        gold = set(ex.supporting_doc_ids)
        if not gold:
            skipped += 1
            continue
        scored += 1
        ranked = [_doc_id(h) for h in hits]
        for k in ks:
            found = gold & set(ranked[:k])
            anyg[k] += bool(found)
            allg[k] += found == gold
            frac[k] += len(found) / len(gold)
    note = "" if scored else "no gold supporting passages (e.g. Bamboogle): recall not defined, skipped"
    div = max(scored, 1)
    return DatasetRecall(dataset=name, n=scored, skipped=skipped, note=note,
                         any_gold={k: anyg[k] / div for k in ks}, all_gold={k: allg[k] / div for k in ks},
                         mean_fraction={k: frac[k] / div for k in ks})


def evaluate_recall(searcher: Searcher, examples: Iterable[RecallExample], ks: Sequence[int] = (1, 5, 10),
                    batch_size: int = 256, index_name: str | None = None) -> RecallReport:
    """Search every question (batched) and report recall@k per dataset."""
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    groups: dict[str, list[RecallExample]] = defaultdict(list)
    for ex in examples:
        groups[ex.dataset].append(ex)
    reports = []
    for name, exs in groups.items():
        todo = [i for i, e in enumerate(exs) if e.supporting_doc_ids]
        results: list[list[Hit]] = [[] for _ in exs]
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            for i, hits in zip(batch, searcher.search([exs[i].question for i in batch], ks[-1]), strict=True):
                results[i] = hits
        reports.append(score_dataset(name, exs, results, ks))
    return RecallReport(index=index_name or getattr(searcher, "name", "index"), ks=ks, datasets=reports)


def evaluate_index_recall(index_dir: str | os.PathLike[str], cfg: RecallConfig,
                          query_backend: str | None = None, query_model: str | None = None) -> RecallReport:
    """Load the index in ``index_dir`` (a dense index's queries encoded by ``query_backend`` / ``query_model`` when
    given) and score it on every file of ``cfg``."""
    from infra.paths import resolve_path
    from retrieval.index import load_searcher

    examples = [ex for f in cfg.files for ex in load_examples(resolve_path(f))]
    return evaluate_recall(load_searcher(index_dir, query_backend, query_model), examples, cfg.ks, cfg.batch_size,
                           index_name=str(index_dir))
