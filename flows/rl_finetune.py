"""RL fine-tuning flow: prepare data -> (warm-up SFT) -> (difficulty bucketing) -> train stage(s) -> evaluate ->
register.

Composition only (tasks in ``tasks.rl``). With ``eval.compare_start`` the policy RL starts from and the final one
are both evaluated on the held-out questions and compared pairwise (``training.rl.heldout``). With ``init.warmup``
the initial policy is a warm-up SFT of ``model`` on trajectories of the preset's protocol (``training.rl.warmup``);
every later step starts from it. The engine comes from the preset (``trl`` on one machine, ``verl`` on GPU workers);
R1-Searcher's two stages are two chained ``rl-train-stage`` task runs, the second starting from the first's
checkpoint. Re-running the same preset + overrides reuses the experiment directory: prepared data comes from the
task cache, the warm-up and finished stages from their manifests, and an interrupted stage resumes from its newest
checkpoint.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from pydantic import BaseModel, Field

from evaluation.metrics import ScoreTable
from flows.specs import Overrides, preset_choice, resolve
from infra import artifacts
from infra.paths import experiment_root
from infra.registry import RegisteredCheckpoint
from tasks.rl import (
    bucket_data_task,
    evaluate_task,
    heldout_task,
    learning_report_task,
    open_run_task,
    prepare_data_task,
    register_task,
    train_stage_task,
    warmup_task,
)
from tasks.run_status import RUN_STATUS_HOOKS
from training.refs import CheckpointRef
from training.rl.config import RLConfig
from training.rl.heldout import LearningRef
from training.rl.warmup import warmup_root

RLPreset = preset_choice("rl-finetune")


class RLResult(BaseModel):
    """What the flow produced."""

    run_id: str = Field(description="Parent MLflow run id.")
    root: str = Field(description="Experiment directory.")
    checkpoints: list[CheckpointRef] = Field(description="One per stage, in order.")
    scores: ScoreTable | None = Field(default=None, description="Evaluation of the final checkpoint: a row per "
                                      "benchmark, means with bootstrap intervals (None: no eval.benchmarks).")
    registered: RegisteredCheckpoint | None = Field(default=None, description="The registered final policy.")
    learning: LearningRef | None = Field(
        default=None, description="Held-out start vs final policy, paired (eval.compare_start).")


@flow(name="rl-finetune", **RUN_STATUS_HOOKS)
def rl_finetune(preset: RLPreset = "research_grpo_cpu_demo", overrides: Overrides = ()) -> RLResult:  # type: ignore[valid-type]
    """Run the RL fine-tuning pipeline of a preset.

    Args:
        preset: an rl-finetune preset from flows/configs (the CLI also takes a YAML path).
        overrides: key.sub=value settings on top of the preset, e.g. stages.grpo.trl.max_steps=2.
    """
    logger = get_run_logger()
    cfg: RLConfig = resolve("rl-finetune", preset, overrides)  # type: ignore[assignment]
    root = str(experiment_root("rl", cfg.name, cfg.key()))
    run_id = open_run_task(cfg)
    logger.info("rl_finetune %s (engine %s) in %s, MLflow run %s", cfg.name, cfg.engine, root, run_id)
    data = prepare_data_task(cfg, artifacts.join(root, "data"))
    model, ckpts = cfg.model, []
    if cfg.init.warmup is not None:
        warm = warmup_task(cfg, warmup_root(cfg), run_id)
        logger.info("warm-up SFT: %d of %d valid %s trajectories trained -> %s", warm.n_trained, warm.n_rows,
                    cfg.protocol, warm.uri)
        model = warm.uri
    if cfg.difficulty is not None:
        data = bucket_data_task(cfg, data, model, artifacts.join(root, "data_bucketed"), run_id)
    start = heldout_task(cfg, model, artifacts.join(root, "heldout_start"), run_id, "start") \
        if cfg.eval.compare_start else None
    for i, stage in enumerate(cfg.stages):
        ckpt = train_stage_task(cfg, i, data, model, artifacts.join(root, stage.name), run_id)
        logger.info("stage %s: %d steps -> %s", stage.name, ckpt.steps, ckpt.uri)
        ckpts.append(ckpt)
        model = ckpt.uri
    scores, learning = None, None
    if start is not None:
        final = heldout_task(cfg, model, artifacts.join(root, "heldout_final"), run_id, "final")
        learning = learning_report_task(cfg, start, final, ckpts, data, root, run_id)
        logger.info("held-out start -> final (%d questions, paired intervals):\n%s", learning.n, learning.table)
    elif cfg.eval.benchmarks:
        scores = evaluate_task(cfg, ckpts[-1], artifacts.join(root, "eval"), run_id)
    registered = register_task(cfg, ckpts[-1], run_id) if cfg.register_model else None
    return RLResult(run_id=run_id, root=root, checkpoints=ckpts, scores=scores, registered=registered,
                    learning=learning)
