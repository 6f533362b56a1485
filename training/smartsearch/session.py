"""What the curriculum's stages share: the experiment directory, the judge/refiner pair, the retriever, and the
MLflow side (parent run, per-stage logging of counts, losses and data files, checkpoint registration)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from training.smartsearch.config import SmartSearchConfig
from training.smartsearch.stages import StageResult

log = logging.getLogger(__name__)

DATA_FILES = ("counts.json", "manifest.json", "trajectories.jsonl", "regenerations.jsonl", "verdicts.jsonl",
              "refinements.jsonl", "screen.jsonl", "scores.jsonl", "pairs.jsonl", "log_history.jsonl",
              "command.txt")


def gold_support(cfg: SmartSearchConfig) -> Any:
    """Gold supporting paragraphs of every question the curriculum uses (stages 1-3 and the teacher's files), for
    the rule judge and the rule refiner."""
    from training.smartsearch.judge import GoldSupport
    from training.smartsearch.stages import load_questions

    sources = [*cfg.stage1.questions, *cfg.stage2.questions, *cfg.stage3.questions]
    if cfg.stage1.teacher is not None:
        sources += list(cfg.stage1.teacher.decomposition_files)
    return GoldSupport(load_questions(sources))


def open_judge(cfg: SmartSearchConfig, base_url: str | None) -> tuple[Any, tuple[Any, Any, Any]]:
    """(judge, (endpoint client, refiner spec, gold support)): the judge and refiner the preset's ``kind`` asks for
    (the seed's LLM ones over the endpoint at ``base_url``, or the rule stand-ins)."""
    from training.smartsearch.endpoint import EndpointClient
    from training.smartsearch.judge import make_judge

    rules = "rule" in (cfg.judge.kind, cfg.refiner.kind)
    support = gold_support(cfg) if rules else None
    client = EndpointClient(cfg.endpoint, base_url=base_url) if base_url else None
    return make_judge(cfg.judge, client, support), (client, cfg.refiner, support)


def open_searcher(cfg: SmartSearchConfig) -> Any:
    """The retriever, called directly (in-process BM25 or our HTTP service); model output is never executed."""
    from retrieval.open import open_searcher as open_spec

    return open_spec(cfg.retrieval)


def open_parent_run(cfg: SmartSearchConfig) -> str:
    """Create the curriculum's parent MLflow run (params = the preset, secrets excluded), left ``RUNNING`` and not
    activated: the flow's state hooks end it (``tasks.run_status``); returns its id."""
    from infra.tracking import create_run

    return create_run(f"smartsearch-{cfg.name}", tags={"searchloop.flow": "smartsearch_curriculum"},
                      params=cfg.model_dump(mode="json", exclude={"endpoint": {"api_key_env"}}))


def log_stage(result: StageResult) -> None:
    """Counts, per-step losses, wall time and the stage's data files to the active MLflow run."""
    from infra.tracking import log_artifact, log_metrics

    log_metrics({f"counts/{k}": v for k, v in result.counts.items()})
    log_metrics({"stage/seconds": result.seconds, "stage/trained": float(result.trained)})
    for step, loss in enumerate(result.losses):
        log_metrics({"stage/loss": loss}, step=step)
    for name in DATA_FILES:
        p = Path(result.dir) / name
        if p.exists():
            log_artifact(p, "data")
    for sub in ("sft/loss_curve.jsonl", "dpo/loss_curve.jsonl", "sft/train.yaml", "rollouts/trajectories.jsonl"):
        p = Path(result.dir) / sub
        if p.exists():
            log_artifact(p, "data")


def log_scores(scores: Any) -> None:
    """Held-out ``{benchmark}/{metric}`` means and interval ends (an ``evaluation.metrics.ScoreTable``) to the
    active MLflow run."""
    from infra.tracking import log_metrics

    log_metrics(scores.flat())


def register_stage(result: StageResult, name: str) -> Any:
    """Register a trained stage's HF folder as a version of ``name`` (idempotent per folder)."""
    from training.refs import CheckpointRef
    from training.rl.stages import register_checkpoint

    ref = CheckpointRef(uri=result.model, stage_dir=result.dir, stage=result.stage,
                        engine="trl" if result.stage != "sft" else "llamafactory",
                        steps=int(result.counts.get("steps", 0)))
    return register_checkpoint(ref, name)
