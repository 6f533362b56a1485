"""SmartSearch curriculum flow: (judge endpoint) -> evaluate the initial model -> stage 1 screened SFT -> stage 2
DPO on refined-vs-original pairs -> stage 3 query-aware GRPO, each trained stage evaluated on the held-out sets and
registered.

Composition only (tasks in ``tasks.smartsearch``). The judge/refiner endpoint is the preset's URL, or our generation
server started here and stopped when the flow ends. Re-running the same preset + overrides reuses the experiment
directory: finished stages come back from their manifests (written last) and an interrupted GRPO resumes from its
newest checkpoint. A stage with no data (nothing kept by the screen, no pair) passes its input model on.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from pydantic import BaseModel, Field

from evaluation.metrics import ScoreTable
from flows.specs import Overrides, preset_choice, resolve
from infra import artifacts
from infra.paths import experiment_root
from infra.registry import RegisteredCheckpoint
from tasks.run_status import RUN_STATUS_HOOKS
from tasks.smartsearch import (
    evaluate_task,
    open_run_task,
    register_task,
    stage1_task,
    stage2_task,
    stage3_task,
    start_endpoint_task,
    stop_endpoint_task,
)
from training.smartsearch.config import SmartSearchConfig
from training.smartsearch.stages import StageResult

SmartSearchPreset = preset_choice("smartsearch-curriculum")


class CurriculumResult(BaseModel):
    """What the curriculum produced."""

    run_id: str = Field(description="Parent MLflow run id.")
    root: str = Field(description="Experiment directory.")
    stages: list[StageResult] = Field(description="sft, dpo, grpo results in order.")
    scores: dict[str, ScoreTable] = Field(
        default_factory=dict, description="{initial|sft|dpo|grpo: a row per benchmark, means with intervals}.")
    registered: dict[str, RegisteredCheckpoint] = Field(
        default_factory=dict, description="Per stage: the registered model version.")


@flow(name="smartsearch-curriculum", **RUN_STATUS_HOOKS)
def smartsearch_curriculum(preset: SmartSearchPreset = "smartsearch_cpu_demo",  # type: ignore[valid-type]
                           overrides: Overrides = ()) -> CurriculumResult:
    """Run the SmartSearch curriculum of a preset.

    Args:
        preset: a smartsearch-curriculum preset from flows/configs (the CLI also takes a YAML path).
        overrides: key.sub=value settings on top of the preset.
    """
    logger = get_run_logger()
    cfg: SmartSearchConfig = resolve("smartsearch-curriculum", preset, overrides)  # type: ignore[assignment]
    root = str(experiment_root("smartsearch", cfg.name, cfg.key()))
    run_id = open_run_task(cfg)
    logger.info("smartsearch-curriculum %s in %s, MLflow run %s", cfg.name, root, run_id)
    served = None if cfg.endpoint.base_url else start_endpoint_task(cfg, artifacts.join(root, "services"))
    url = cfg.endpoint.base_url or served.url  # type: ignore[union-attr]
    scores: dict[str, ScoreTable] = {}
    registered: dict[str, dict] = {}
    stages: list[StageResult] = []
    try:
        if cfg.eval.benchmarks:
            scores["initial"] = evaluate_task(cfg, cfg.model, "initial", artifacts.join(root, "eval", "initial"),
                                              run_id)
        model = cfg.model
        for name, step in (("sft", stage1_task), ("dpo", stage2_task), ("grpo", stage3_task)):
            out = artifacts.join(root, name)
            result = step(cfg, url, out, run_id) if name == "sft" else step(cfg, url, model, out, run_id)
            stages.append(result)
            logger.info("stage %s: trained=%s counts=%s (%.0fs)", name, result.trained, result.counts,
                        result.seconds)
            model = result.model  # the input model, resolved, when the stage had no data
            if not result.trained:
                continue
            if cfg.eval.benchmarks:
                scores[name] = evaluate_task(cfg, model, name, artifacts.join(root, "eval", name), run_id)
            if cfg.register_models:
                registered[name] = register_task(cfg, result, run_id)
    finally:
        if served is not None:
            stop_endpoint_task(served)
    return CurriculumResult(run_id=run_id, root=root, stages=stages, scores=scores, registered=registered)
