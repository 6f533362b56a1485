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


def open_judge(cfg: SmartSearchConfig, base_url: str) -> tuple[Any, tuple[Any, Any]]:
    """(usefulness judge, (endpoint client, refiner spec)) over the endpoint at ``base_url``."""
    from training.smartsearch.endpoint import EndpointClient
    from training.smartsearch.judge import UsefulnessJudge

    client = EndpointClient(cfg.endpoint, base_url=base_url)
    return UsefulnessJudge(client, cfg.judge), (client, cfg.refiner)


def open_searcher(cfg: SmartSearchConfig) -> Any:
    """The retriever, called directly (in-process BM25 or our HTTP service); model output is never executed."""
    from retrieval.open import open_searcher as open_spec

    return open_spec(cfg.retrieval)


def open_parent_run(cfg: SmartSearchConfig) -> str:
    """The curriculum's parent MLflow run (params = the preset, secrets excluded); returns its id."""
    from infra.tracking import child_run

    with child_run(None, f"smartsearch-{cfg.name}", cfg.model_dump(mode="json", exclude={"endpoint": {"api_key_env"}}),
                   tags={"searchloop.flow": "smartsearch_curriculum"}) as run:
        return run.info.run_id


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
