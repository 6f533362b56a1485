"""Agent evaluation stage: run a search agent over a benchmark and score it (answers + retrieval).

``evaluate_dataset`` is the library function behind the ``evaluate`` flow's per-dataset task: load questions,
roll out the protocol with the generator and the retriever, score every trajectory with the pure metric
functions, and write trajectories, predictions and per-example metrics (manifest last).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator

from evaluation.benchmarks import load_benchmark
from evaluation.metrics import ScoreTable, aggregate, answer_metrics, retrieval_metrics
from evaluation.normalize import NormalizationName
from infra import artifacts
from infra.config import StrictModel
from infra.errors import ConfigError
from retrieval.open import RetrieverSpec, open_searcher
from training.agent.records import Trajectory, write_trajectories
from training.agent.rollout import RolloutConfig, run_rollouts
from training.agent.traces import TraceConfig
from training.generation.spec import GeneratorSpec, open_generator
from training.protocols.registry import ProtocolName, protocol_class

log = logging.getLogger(__name__)

EXAMPLE_METRICS = ("em", "f1", "acc", "precision", "recall", "cem", "searches", "gold_recall", "repeated_doc_rate",
                   "format_ok")


class AgentEvalConfig(StrictModel):
    """One agent evaluation: protocol, model, retriever, rollout settings and scoring options."""

    protocol: ProtocolName = Field(default="research", description="Tag protocol: a key of "
                                                                   "training.protocols.registry.PROTOCOLS.")
    generator: GeneratorSpec = Field(default_factory=GeneratorSpec, description="Generation engine and model.")
    retrieval: RetrieverSpec = Field(default_factory=lambda: RetrieverSpec(corpus=["data/corpus/mini.jsonl"]),
                                     description="Retriever used by the agent (url | index | corpus).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout settings.")
    normalization: NormalizationName | None = Field(  # type: ignore[valid-type]
        default=None, description="Answer normalization, a name in evaluation.normalize.NORMALIZATIONS "
        "(exsearch_released_buggy reproduces a known bug); None: the protocol's own (SearchProtocol.normalization).")
    limit: int | None = Field(default=None, ge=1, description="Questions per dataset (first N).")

    def answer_normalization(self) -> str:
        """``normalization``, else the protocol's own rule."""
        return self.normalization or protocol_class(self.protocol).normalization

    @model_validator(mode="before")
    @classmethod
    def _retriever_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "retriever" in data:
            raise ValueError("`retriever:` is now `retrieval:` (the same url | index | corpus fields, spelled as in "
                             "every other config): rename the key, e.g. agent.retrieval.corpus=data/corpus/mini.jsonl")
        return data


class DatasetEvalRef(BaseModel):
    """Reference to one dataset's evaluation directory and its headline numbers."""

    dataset: str = Field(description="Benchmark name or path.")
    uri: str = Field(description="Directory with trajectories, predictions.jsonl, examples.jsonl, manifest.json.")
    n: int = Field(description="Questions evaluated.")
    means: dict[str, float] = Field(description="Mean of each example metric.")
    seconds: float = Field(description="Wall time of the rollouts.")


def score_trajectory(traj: Trajectory, gold_doc_ids: list[str], normalization: str) -> dict[str, Any]:
    """Per-example metrics of one trajectory: answer metrics, retrieval metrics and format validity."""
    row: dict[str, Any] = {"id": traj.question_id, "dataset": traj.dataset, "sample": traj.sample}
    row.update(answer_metrics(traj.final_answer, traj.golden_answers, normalization))  # type: ignore[arg-type]
    rounds = [t.doc_ids for t in traj.turns if t.query is not None]
    row.update(retrieval_metrics(rounds, gold_doc_ids))
    row["format_ok"] = float(bool(traj.format_ok))
    return row


def evaluate_dataset(
    cfg: AgentEvalConfig,
    dataset: str,
    out_dir: str | os.PathLike[str],
    generator: Any | None = None,
    searcher: Any | None = None,
) -> DatasetEvalRef:
    """Run the agent on one benchmark and write its evaluation directory (manifest last).

    A directory that already has a manifest is reused (the stage is complete) rather than recomputed.
    """
    uri = str(out_dir)
    done = artifacts.read_manifest(uri)
    if done is not None and done.get("kind") == "agent_eval":
        log.info("skipping %s: evaluation already complete at %s", dataset, uri)
        return DatasetEvalRef(dataset=dataset, uri=uri, n=done["count"], means=done["means"], seconds=done["seconds"])
    questions = load_benchmark(dataset, limit=cfg.limit)
    if not questions:
        raise ConfigError(f"benchmark {dataset!r} has no questions (check the file or the limit)")
    # backend auto weighs an engine's start against its per-trajectory time for this many (training.generation.choice)
    generator = generator or open_generator(cfg.generator, cached=True, items=len(questions) * cfg.rollout.n)
    searcher = searcher or open_searcher(cfg.retrieval)
    t0 = time.perf_counter()
    trajs = run_rollouts(questions, cfg.protocol, generator, searcher, cfg.rollout)
    seconds = time.perf_counter() - t0
    gold = {q.id: list(q.supporting_doc_ids) for q in questions}
    examples = [score_trajectory(t, gold.get(t.question_id, []), cfg.answer_normalization()) for t in trajs]
    write_trajectories(trajs, artifacts.join(uri, "trajectories"), dataset=dataset, protocol=cfg.protocol)
    artifacts.write_jsonl(artifacts.join(uri, "examples.jsonl"), examples)
    artifacts.write_jsonl(artifacts.join(uri, "predictions.jsonl"), [
        {"id": t.question_id, "question": t.question, "pred": t.final_answer, "golden_answers": t.golden_answers,
         "finish_reason": t.finish_reason, "searches": t.n_searches} for t in trajs])
    means = {}
    for name in EXAMPLE_METRICS:
        vals = [float(e[name]) for e in examples if e.get(name) is not None]
        if vals:
            means[name] = sum(vals) / len(vals)
    artifacts.write_manifest(uri, kind="agent_eval", dataset=dataset, count=len(examples), means=means,
                             seconds=seconds, config=cfg.model_dump(mode="json"))
    return DatasetEvalRef(dataset=dataset, uri=uri, n=len(examples), means=means, seconds=seconds)


def score_checkpoint(cfg: AgentEvalConfig, benchmarks: Sequence[str], out_uri: str, confidence: float = 0.95,
                     metrics: Sequence[str] = EXAMPLE_METRICS) -> ScoreTable:
    """Evaluate one checkpoint (``cfg.generator.model``) on each benchmark (:func:`evaluate_dataset`, a directory
    per benchmark under ``out_uri``) -> one row per benchmark (its file stem) with bootstrap intervals.

    The one evaluation record of the loops: RL and SmartSearch return it, and EM's evaluation returns
    ``training.em.records.EvalRef``, the same :class:`~evaluation.metrics.ScoreTable` naming its stage directory.
    """
    examples: list[dict[str, Any]] = []
    for name in benchmarks:
        stem = Path(name).stem
        ref = evaluate_dataset(cfg, name, artifacts.join(out_uri, stem))
        examples += [{**e, "dataset": stem} for e in artifacts.read_jsonl(artifacts.join(ref.uri, "examples.jsonl"))]
    return aggregate(examples, [m for m in metrics if any(e.get(m) is not None for e in examples)],
                     confidence=confidence)


class EvalSummary(BaseModel):
    """The aggregated table of several dataset evaluations and where the report was written."""

    uri: str = Field(description="Directory with report.md, scores.png, table.json.")
    table: dict[str, dict[str, float]] = Field(description="{protocol/dataset: {metric: mean}}.")
    markdown: str = Field(description="The markdown metrics table.")


def summarize_evaluations(
    refs: list[DatasetEvalRef], protocols: list[str], out_dir: str | os.PathLike[str], title: str, details: dict
) -> EvalSummary:
    """Pool the per-example metrics of ``refs`` (one per protocol x dataset) into a table + markdown report."""
    from evaluation.metrics import aggregate
    from evaluation.report import render_table, write_report

    examples = []
    for ref, protocol in zip(refs, protocols, strict=True):
        for row in artifacts.read_jsonl(artifacts.join(ref.uri, "examples.jsonl")):
            examples.append({**row, "key": f"{protocol}/{row['dataset']}"})
    metrics = ["em", "f1", "acc", "format_ok", "searches", "gold_recall", "repeated_doc_rate"]
    table = aggregate(examples, metric_names=metrics, dataset_key="key")
    uri = str(out_dir)
    write_report(table, uri, title=title, details=details)
    artifacts.write_json(artifacts.join(uri, "table.json"), table.model_dump(mode="json"))
    md = render_table(table)
    artifacts.write_manifest(uri, kind="eval_summary", evaluations=[r.uri for r in refs])
    return EvalSummary(uri=uri, table=table.as_dict(), markdown=md)


def log_evaluation(run_id: str, summary: EvalSummary, refs: list[DatasetEvalRef],
                   traces: TraceConfig | None = None) -> None:
    """Log ``{protocol/dataset}/{metric}`` means, the report and each dataset's files to MLflow run ``run_id``, and
    fill MLflow's agent views: each question set as a dataset input, a per-question results table and a sample of
    the trajectories as traces (``training.agent.traces``)."""
    from evaluation.benchmarks import resolve_benchmark
    from infra.errors import DataError
    from infra.tracking import log_artifact, log_metrics, resume_run
    from training.agent.records import read_trajectories
    from training.agent.traces import log_dataset_evaluation

    with resume_run(run_id):
        flat = {f"{key}/{name}": value for key, row in summary.table.items() for name, value in row.items()}
        log_metrics(flat)
        local = artifacts.local_path(summary.uri)
        log_artifact(local, "report")
        for ref in refs:
            log_artifact(artifacts.local_path(ref.uri), f"datasets/{os.path.basename(ref.uri.rstrip('/'))}")
            trajs = read_trajectories(artifacts.join(ref.uri, "trajectories"))
            examples = artifacts.read_jsonl(artifacts.join(ref.uri, "examples.jsonl"))
            protocol = trajs[0].protocol if trajs else "none"
            try:
                source = str(resolve_benchmark(ref.dataset).resolve())
            except DataError:
                source = ref.dataset
            log_dataset_evaluation(f"{protocol}/{os.path.basename(ref.uri.rstrip('/'))}", source, trajs, examples,
                                   traces)
