"""Prefect tasks of the RL fine-tuning flow: one library stage each (``training.rl.stages``),
inside a nested MLflow run.

Policy lives in the decorators: data preparation is cached by inputs; model steps are tagged ``gpu`` and retried
once (a retry resumes from the stage's newest checkpoint, and a finished stage is returned from its manifest).
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import INPUTS

from evaluation.metrics import ScoreTable
from infra import artifacts
from infra.registry import RegisteredCheckpoint
from infra.tracking import child_run
from tasks.policy import retry_unless_input_error
from training.refs import CheckpointRef
from training.rl import heldout
from training.rl import stages as rl
from training.rl import warmup as rl_warmup
from training.rl.config import RLConfig
from training.rl.data import RLDataRef
from training.rl.health import TrainingHealthError


def _retry_unless_unhealthy(task, task_run, state) -> bool:  # noqa: ANN001
    """Retry crashes (the retry resumes from the newest checkpoint), never a health-check stop."""
    return retry_unless_input_error(task, task_run, state) and not isinstance(
        state.result(raise_on_failure=False), TrainingHealthError)


@task(name="rl-open-run", retries=2, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=2, timeout_seconds=300)
def open_run_task(cfg: RLConfig) -> str:
    """Create the flow's parent MLflow run; returns its id."""
    return rl.open_parent_run(cfg)


@task(name="rl-prepare-data", retries=1, retry_condition_fn=retry_unless_input_error,
      timeout_seconds=1800, cache_policy=INPUTS, persist_result=True)
def prepare_data_task(cfg: RLConfig, out_uri: str) -> RLDataRef:
    """verl/TRL parquet files from the preset's question sets."""
    return rl.prepare_data(cfg, out_uri)


@task(name="rl-warmup", tags=["gpu"], retries=1, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=5, timeout_seconds=6 * 3600)
def warmup_task(cfg: RLConfig, out_uri: str, parent_run: str) -> rl_warmup.WarmupRef:
    """Warm-up data for the preset's protocol + masked SFT -> merged HF folder (skipped when already complete)."""
    with child_run(parent_run, "warmup") as run:
        ref = rl_warmup.train_rl_warmup(cfg, out_uri, mlflow_run_id=run.info.run_id)
        rl_warmup.log_warmup(ref)
        return ref


@task(name="rl-difficulty", tags=["gpu"], retries=1, retry_condition_fn=retry_unless_input_error,
      timeout_seconds=4 * 3600)
def bucket_data_task(cfg: RLConfig, data: RLDataRef, model: str, out_uri: str, parent_run: str) -> RLDataRef:
    """Rollouts-to-first-correct per question, buckets, ratio mix."""
    with child_run(parent_run, "difficulty"):
        return rl.bucket_data(cfg, data, model, out_uri)


@task(name="rl-train-stage", tags=["gpu"], retries=1, retry_delay_seconds=5, timeout_seconds=48 * 3600,
      retry_condition_fn=_retry_unless_unhealthy)
def train_stage_task(cfg: RLConfig, stage_index: int, data: RLDataRef, init_model: str, out_uri: str,
                     parent_run: str) -> CheckpointRef:
    """Train one stage (engine from the preset); logs health metrics, the health plot and the stage files."""
    stage = cfg.stages[stage_index]
    with child_run(parent_run, f"train-{stage.name}", {"stage": stage.model_dump(mode="json")}):
        ref = rl.train_rl_stage(cfg, stage, data, init_model, out_uri)
        rl.log_stage(ref)
        return ref


@task(name="rl-evaluate", tags=["gpu"], retries=1, retry_condition_fn=retry_unless_input_error,
      timeout_seconds=6 * 3600)
def evaluate_task(cfg: RLConfig, ckpt: CheckpointRef, out_uri: str, parent_run: str) -> ScoreTable:
    """Evaluate the trained policy on the preset's benchmarks; metrics go to the run."""
    with child_run(parent_run, "evaluate"):
        scores = rl.evaluate_rl_checkpoint(cfg, ckpt.uri, out_uri)
        rl.log_scores(scores)
        return scores


@task(name="rl-heldout", tags=["gpu"], retries=1, retry_condition_fn=retry_unless_input_error, timeout_seconds=6 * 3600)
def heldout_task(cfg: RLConfig, model: str, out_uri: str, parent_run: str, label: str) -> str:
    """Greedy held-out rollouts of one policy (``start`` or ``final``) -> per-question rows; means to the run."""
    with child_run(parent_run, f"heldout-{label}"):
        path = heldout.evaluate_start(cfg, model, out_uri) if label == "start" else \
            heldout.evaluate_heldout(cfg, model, out_uri)
        heldout.log_heldout(path, label)
        if label == "start":
            heldout.check_start_policy(cfg, path)  # warns, or stops before RL (eval.start_gate)
        return path


@task(name="rl-learning-report", retries=1, retry_condition_fn=retry_unless_input_error, timeout_seconds=1800)
def learning_report_task(cfg: RLConfig, start: str, final: str, ckpts: list[CheckpointRef], data: RLDataRef,
                         root: str, parent_run: str) -> heldout.LearningRef:
    """Paired start-vs-final report, learning curve, evidence folder and plots (also under ``eval.evidence_dir``)."""
    with child_run(parent_run, "learning-report"):
        return heldout.write_learning_report(cfg, start, final, ckpts, data, artifacts.join(root, "evidence"))


@task(name="rl-register", retries=2, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=5, timeout_seconds=1800)
def register_task(cfg: RLConfig, ckpt: CheckpointRef, parent_run: str) -> RegisteredCheckpoint:
    """Register the final policy as an MLflow model version."""
    with child_run(parent_run, "register"):
        return rl.register_checkpoint(ckpt, f"searchloop-{cfg.name}")
