"""Prefect tasks of the SmartSearch curriculum: one library stage each (``training.smartsearch``), inside a nested
MLflow run. Model stages are tagged ``gpu`` and retried once (a finished stage comes back from its manifest; an
interrupted GRPO resumes from its newest checkpoint)."""

from __future__ import annotations

from prefect import task

from evaluation.metrics import ScoreTable
from infra.registry import RegisteredCheckpoint
from infra.tracking import child_run
from tasks.policy import retry_unless_input_error
from training.smartsearch import session
from training.smartsearch.config import SmartSearchConfig
from training.smartsearch.endpoint import ServedEndpoint, start_endpoint, stop_endpoint
from training.smartsearch.grpo import run_stage3
from training.smartsearch.stages import StageResult, evaluate_model, run_stage1, run_stage2


@task(name="smartsearch-open-run", retries=2, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=2, timeout_seconds=300)
def open_run_task(cfg: SmartSearchConfig) -> str:
    """Create the curriculum's parent MLflow run; returns its id."""
    return session.open_parent_run(cfg)


@task(name="smartsearch-start-endpoint", retries=1, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=5, timeout_seconds=900)
def start_endpoint_task(cfg: SmartSearchConfig, run_dir: str) -> ServedEndpoint:
    """Start our generation server as the judge/refiner endpoint and wait until it is healthy."""
    return start_endpoint(cfg.endpoint, run_dir)


@task(name="smartsearch-stop-endpoint")
def stop_endpoint_task(served: ServedEndpoint) -> bool:
    """Stop the judge/refiner server."""
    return stop_endpoint(served)


@task(name="smartsearch-stage1-sft", tags=["gpu"], retries=1, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=5, timeout_seconds=12 * 3600)
def stage1_task(cfg: SmartSearchConfig, url: str, out_uri: str, parent_run: str) -> StageResult:
    """Sample, judge, screen, SFT on the kept trajectories."""
    with child_run(parent_run, "stage1-sft") as run:
        judge, _ = session.open_judge(cfg, url)
        result = run_stage1(cfg, judge, session.open_searcher(cfg), out_uri, mlflow_run_id=run.info.run_id)
        session.log_stage(result)
        return result


@task(name="smartsearch-stage2-dpo", tags=["gpu"], retries=1, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=5, timeout_seconds=12 * 3600)
def stage2_task(cfg: SmartSearchConfig, url: str, init_model: str, out_uri: str, parent_run: str) -> StageResult:
    """Sample with the SFT model, refine + regenerate, build pairs, LoRA DPO, merge."""
    with child_run(parent_run, "stage2-dpo"):
        judge, refiner = session.open_judge(cfg, url)
        result = run_stage2(cfg, judge, refiner, session.open_searcher(cfg), init_model, out_uri)
        session.log_stage(result)
        return result


@task(name="smartsearch-stage3-grpo", tags=["gpu"], retries=1, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=5, timeout_seconds=48 * 3600)
def stage3_task(cfg: SmartSearchConfig, url: str, init_model: str, out_uri: str, parent_run: str) -> StageResult:
    """Query-aware GRPO with refinement branches and the judge in the reward."""
    with child_run(parent_run, "stage3-grpo"):
        judge, refiner = session.open_judge(cfg, url)
        result = run_stage3(cfg, judge, refiner, session.open_searcher(cfg), init_model, out_uri)
        session.log_stage(result)
        return result


@task(name="smartsearch-evaluate", tags=["gpu"], retries=1, retry_condition_fn=retry_unless_input_error,
      timeout_seconds=6 * 3600)
def evaluate_task(cfg: SmartSearchConfig, model: str, label: str, out_uri: str, parent_run: str) -> ScoreTable:
    """Held-out scores (with bootstrap intervals) of one checkpoint."""
    with child_run(parent_run, f"eval-{label}", {"model": model}):
        scores = evaluate_model(cfg, model, out_uri)
        session.log_scores(scores)
        return scores


@task(name="smartsearch-register", retries=2, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=5, timeout_seconds=1800)
def register_task(cfg: SmartSearchConfig, result: StageResult, parent_run: str) -> RegisteredCheckpoint:
    """Register a trained stage's checkpoint as an MLflow model version."""
    with child_run(parent_run, f"register-{result.stage}"):
        return session.register_stage(result, f"searchloop-{cfg.name}-{result.stage}")
