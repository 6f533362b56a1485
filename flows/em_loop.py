"""The ExSearch EM loop as Prefect flows: ``em_loop`` = warm-up SFT -> N x ``em_iteration`` (sample -> score ->
select -> weighted train -> evaluate), with registration/promotion and early stopping. With ``learning`` set, the
warm-up checkpoint (the EM start) and every iteration's checkpoint are also evaluated greedily on the held-out set,
and the loop ends with the paired start-vs-final learning report (``tasks.em.learning_report_task``).

Composition only: every step is a task in ``tasks.em``; numbers are decided by library functions. Re-running the
same experiment (same config -> same directory ``<runs>/em/<experiment>-<config key>``) resumes: complete stages are
skipped (``skipping <step>: already complete at <dir>``), an interrupted one is redone from scratch.
"""

from __future__ import annotations

import logging
import time

from prefect import flow, get_run_logger

from flows.specs import Overrides, preset_choice, resolve
from infra.paths import experiment_root
from tasks.em import (
    RunCtx,
    align_task,
    close_run_task,
    evaluate_task,
    heldout_task,
    learning_report_task,
    open_run_task,
    promote_task,
    sample_task,
    score_task,
    select_task,
    warmup_data_task,
    warmup_sft_task,
)
from tasks.run_status import RUN_STATUS_HOOKS
from training.em.config import EMLoopConfig
from training.em.learning import curve_row
from training.em.records import IterationResult
from training.em.stages import should_stop

log = logging.getLogger(__name__)
EMPreset = preset_choice("em-loop")
SUBFLOWS = {"em-iteration"}  # run inside em-loop; not deployed on their own


def _timeouts(cfg: EMLoopConfig) -> dict:
    return {
        "sample": sample_task.with_options(timeout_seconds=cfg.sampling.timeout_s),
        "score": score_task.with_options(timeout_seconds=cfg.step_timeout_s),
        "align": align_task.with_options(timeout_seconds=cfg.alignment.timeout_s + 120),
        "evaluate": evaluate_task.with_options(timeout_seconds=cfg.evaluation.timeout_s),
        "warmup_sft": warmup_sft_task.with_options(timeout_seconds=cfg.warmup.timeout_s),
        "heldout": heldout_task.with_options(timeout_seconds=cfg.evaluation.timeout_s),
    }


@flow(name="em-iteration", **RUN_STATUS_HOOKS)
def em_iteration(cfg: EMLoopConfig, iteration: int, model_path: str, root: str, parent_run: str) -> IterationResult:
    """One EM iteration from ``model_path``: sample -> score -> select -> weighted train -> evaluate -> promote."""
    t = _timeouts(cfg)
    run_id = open_run_task(root, f"iter_{iteration:02d}", f"iteration-{iteration}", cfg.experiment, parent_run)
    ctx = RunCtx(root=root, experiment=cfg.experiment, parent_run=run_id)
    sampled = t["sample"](cfg, model_path, iteration, ctx)
    scored = t["score"](cfg, model_path, sampled.trajectories, iteration, ctx)
    selected = select_task(cfg, scored.scores, iteration, ctx)
    ckpt = t["align"](cfg, selected.train, model_path, iteration, ctx)
    ev = t["evaluate"](cfg, ckpt.uri, iteration, ctx)
    promo = promote_task(cfg, ckpt.uri, iteration, ev.f1, run_id)
    learn = cfg.learning
    held = None
    if learn is not None and (learn.every_iteration or iteration == cfg.iterations):
        held = t["heldout"](cfg, ckpt.uri, iteration, ctx)
    point = curve_row(iteration, held, sampled, selected)
    result = IterationResult.of(iteration, ckpt.uri, ev, promo, selected, curve=point, heldout=held)
    close_run_task(run_id, result.run_metrics())
    return result


@flow(name="em-loop", **RUN_STATUS_HOOKS)
def em_loop(preset: EMPreset = "exsearch_cpu_demo", overrides: Overrides = ()) -> list[IterationResult]:  # type: ignore[valid-type]
    """Warm-up SFT, evaluation of the warm-up checkpoint, then up to ``iterations`` EM iterations.

    Args:
        preset: an em-loop preset from flows/configs (the CLI also takes a YAML path).
        overrides: key.sub=value settings on top of the preset, e.g. iterations=1.
    """
    logger = get_run_logger()
    t0 = time.time()
    cfg: EMLoopConfig = resolve("em-loop", preset, overrides)  # type: ignore[assignment]
    root = experiment_root("em", cfg.experiment, cfg.key())
    root.mkdir(parents=True, exist_ok=True)
    logger.info("experiment dir: %s", root)
    t = _timeouts(cfg)
    parent = open_run_task(str(root), "parent", cfg.experiment, cfg.experiment)
    warm = open_run_task(str(root), "iter_00", "iteration-0-warmup", cfg.experiment, parent)
    ctx = RunCtx(root=str(root), experiment=cfg.experiment, parent_run=warm)
    from training.generation.models import resolve_model

    base = str(resolve_model(cfg.base_model))
    data = warmup_data_task(cfg, ctx)
    ckpt = t["warmup_sft"](cfg, data.data, base, ctx)
    ev = t["evaluate"](cfg, ckpt.uri, 0, ctx)
    start = t["heldout"](cfg, ckpt.uri, 0, ctx) if cfg.learning is not None else None
    history = [IterationResult.of(0, ckpt.uri, ev, promote_task(cfg, ckpt.uri, 0, ev.f1, warm), heldout=start)]
    curve = [curve_row(0, start)]
    t_start = time.time()
    close_run_task(warm, {"heldout_f1": history[0].f1.mean,
                          **({f"learning_{k}": v for k, v in start.means.items()} if start else {})})
    for i in range(1, cfg.iterations + 1):
        res = em_iteration(cfg, i, history[-1].checkpoint, str(root), parent)
        history.append(res)
        curve.append(res.curve)
        logger.info("iteration %d: held-out F1 %.4f [%.4f, %.4f] (promoted=%s)", i, res.f1.mean, res.f1.low,
                    res.f1.high, res.promoted)
        if should_stop([h.f1.mean for h in history], cfg.early_stop_drops):
            logger.info("early stop: held-out F1 fell %d iterations in a row", cfg.early_stop_drops)
            break
    if start is not None:
        last = history[-1]
        final = last.heldout or t["heldout"](cfg, last.checkpoint, last.iteration, ctx)
        extra = {"wall_s_total": round(time.time() - t0, 1), "wall_s_after_start_eval": round(time.time() - t_start, 1),
                 "iterations": len(history) - 1, "mlflow_parent_run": parent, "experiment_dir": str(root),
                 "config_key": cfg.key(), "preset": preset, "overrides": list(overrides or [])}
        summary = learning_report_task(cfg, start, final, curve, parent, extra)
        logger.info("learning report (%s): %s", cfg.learning.recipe if cfg.learning else "", summary["improved"])
    close_run_task(parent, {"best_heldout_f1": max(h.f1.mean for h in history), "iterations": len(history) - 1})
    return history
