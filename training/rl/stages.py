"""RL launchers: ``train_rl_stage`` runs one stage with the preset's engine and returns a :class:`CheckpointRef`.

Engines are named in :data:`training.rl.engines.ENGINES` (dotted strings, imported only when chosen):

* ``trl`` (:func:`train_stage_trl`, here): GRPO with search in the loop on one machine (``training.rl.trl_engine``),
  health monitors as a callback, rollouts dumped as trajectory records, final policy saved as an HF folder.
* ``verl`` (``training.rl.verl.launch.train_stage_verl``): verl's ``main_ppo`` as a subprocess in its own
  environment on GPU workers.

A stage directory holds ``checkpoints/`` (engine checkpoints; a re-run resumes from the newest), ``model/`` (the
final HF folder), ``rollouts/`` (trajectory records), ``health.json`` and ``manifest.json`` written last. A stage
whose directory already has a manifest is returned as is (idempotent re-runs after a crash later in the flow).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from evaluation.metrics import ScoreTable
from infra import artifacts
from infra.config import config_hash
from infra.registry import RegisteredCheckpoint
from infra.tracking import create_run
from retrieval.open import open_searcher
from training.generation.models import resolve_policy
from training.generation.spec import open_generator
from training.refs import CheckpointRef
from training.rl.config import RLConfig, StageSpec
from training.rl.data import RLDataRef, train_split
from training.rl.engines import get_engine

log = logging.getLogger(__name__)


def finished_stage(out_uri: str) -> CheckpointRef | None:
    """The CheckpointRef of a completed stage directory, or None when it has no manifest."""
    manifest = artifacts.read_manifest(out_uri)
    if manifest is None or "checkpoint" not in manifest:
        return None
    return CheckpointRef(**manifest["checkpoint"])


def train_rl_stage(cfg: RLConfig, stage: StageSpec, data: RLDataRef, init_model: str, out_uri: str) -> CheckpointRef:
    """Train one stage with ``cfg.engine`` from ``init_model``; resume inside ``out_uri`` if it was started."""
    from infra.lazy import load_object

    done = finished_stage(out_uri)
    if done is not None:
        log.info("stage %s already finished at %s", stage.name, out_uri)
        return done
    return load_object(get_engine(cfg.engine).launch)(cfg, stage, data, init_model, out_uri)


def _last_metrics(log_history: list[dict[str, Any]]) -> dict[str, float]:
    logs = [h for h in log_history if "loss" in h]
    return {k: float(v) for k, v in (logs[-1] if logs else {}).items() if isinstance(v, (int, float))}


def train_stage_trl(cfg: RLConfig, stage: StageSpec, data: RLDataRef, init_model: str, out_uri: str) -> CheckpointRef:
    """TRL GRPO with search in the loop for one stage (see ``training.rl.trl_engine``)."""
    from training.agent.records import write_trajectories
    from training.agent.rollout import RolloutConfig
    from training.generation.models import load_tokenizer
    from training.protocols.base import load_protocol
    from training.rewards.adapters import check_reward_options, trl_reward_func
    from training.rl.data import read_parquet, trl_rows
    from training.rl.health import health_callback, raise_if_unhealthy
    from training.rl.trl_engine import (
        build_trainer,
        engine_rollout_fn,
        last_checkpoint,
        policy_for_saving,
        prompt_rows,
        rollout_batch_size,
    )

    tcfg = stage.trl
    if tcfg is None:
        raise ValueError(f"stage {stage.name!r} has no trl settings")
    out = artifacts.local_path(out_uri)
    model_path = resolve_policy(init_model)
    tok = load_tokenizer(model_path)
    protocol = load_protocol(cfg.protocol, top_k=cfg.stage_top_k(stage), max_turns=stage.max_turns,
                             template=cfg.template)
    rows = prompt_rows(protocol, trl_rows(read_parquet(data.split_uri(train_split(stage, data)))), tok)
    sink: list = []
    rollout_cfg = RolloutConfig(temperature=tcfg.temperature, best_of=1, max_tokens_per_turn=tcfg.max_tokens_per_turn,
                                max_total_tokens=tcfg.max_completion_length, seed=tcfg.seed)
    rollout = engine_rollout_fn(protocol, open_searcher(cfg.retrieval), rollout_cfg,
                                batch_size=rollout_batch_size(tcfg), sink=sink)
    health = health_callback(cfg.health)
    check_reward_options(stage.reward, stage.reward_options)
    reward = trl_reward_func(stage.reward, eos_token_id=tok.eos_token_id, **stage.reward_options)
    ckpt_dir = str(out / "checkpoints")
    resume = last_checkpoint(ckpt_dir)
    state = _trainer_state(resume)
    if resume and state.get("global_step", 0) >= tcfg.max_steps:  # crashed after the last save: just finish
        log.info("stage %s already reached %s steps in %s", stage.name, tcfg.max_steps, resume)
        _save_policy(resume, str(out / "model"), tok)
        steps, history = int(state["global_step"]), state.get("log_history", [])
    else:
        if resume:
            log.info("resuming stage %s from %s", stage.name, resume)
        callbacks = [health]
        if cfg.eval.curve_every:  # held-out score of the live policy during training (training.rl.heldout)
            from training.rl.heldout import heldout_curve_callback

            callbacks.append(heldout_curve_callback(cfg, str(out)))
        trainer = build_trainer(tcfg, model_path, rows, [reward], rollout, ckpt_dir, callbacks=callbacks)
        trainer.train(resume_from_checkpoint=resume)
        _write_health(out, health.series, health.alarms)
        if sink:
            write_trajectories(sink, str(out / "rollouts"), stage=stage.name, engine="trl")
        raise_if_unhealthy(health)
        policy_for_saving(trainer.model).save_pretrained(str(out / "model"))  # LoRA: adapters merged
        tok.save_pretrained(str(out / "model"))
        steps, history = int(trainer.state.global_step), trainer.state.log_history
    ref = CheckpointRef(uri=str(out / "model"), base_model=init_model, stage_dir=str(out), stage=stage.name,
                        engine="trl", steps=steps,
                        metrics=_last_metrics(history))
    artifacts.write_manifest(str(out), kind="rl_stage", checkpoint=ref.model_dump(), init_model=init_model,
                             resumed_from=resume, config_hash=config_hash(cfg), reward=stage.reward)
    return ref


def _trainer_state(checkpoint: str | None) -> dict[str, Any]:
    if not checkpoint:
        return {}
    return artifacts.read_json(str(Path(checkpoint) / "trainer_state.json"))


def _save_policy(checkpoint: str, target: str, tokenizer: Any) -> None:
    """Save a trainer checkpoint's weights as the stage's final HF folder (a LoRA checkpoint's adapters merged)."""
    from transformers import AutoModelForCausalLM

    if (Path(checkpoint) / "adapter_config.json").exists():
        from peft import AutoPeftModelForCausalLM

        AutoPeftModelForCausalLM.from_pretrained(checkpoint).merge_and_unload().save_pretrained(target)
        tokenizer.save_pretrained(target)
        return
    AutoModelForCausalLM.from_pretrained(checkpoint).save_pretrained(target)
    tokenizer.save_pretrained(target)


def _write_health(out: Path, series: list[dict[str, float]], alarms: list[Any] = ()) -> None:
    """Append this run's health series to the stage's ``health.json`` (a resumed run continues it) and plot it;
    the alarms that fired (``training.agent.alarms.Alarm``) go to ``alarms.json`` (a resumed run adds its own)."""
    from training.rl.health import plot_health

    path = out / "health.json"
    old = artifacts.read_json(str(path)) if path.exists() else []
    first = series[0]["step"] if series else float("inf")
    merged = [row for row in old if row["step"] < first] + list(series)
    artifacts.write_json(str(path), merged)
    if merged:
        plot_health(merged, str(out / "health.png"))
    apath = out / "alarms.json"
    old_alarms = artifacts.read_json(str(apath)) if apath.exists() else []
    names = {a["name"] for a in old_alarms}
    artifacts.write_json(str(apath), old_alarms + [a.model_dump() for a in alarms if a.name not in names])


def register_checkpoint(ref: CheckpointRef, name: str) -> RegisteredCheckpoint:
    """Log the policy's HF folder as an MLflow model of the active run and register it as a version of ``name``
    (idempotent per folder and run; portable through ``models:/<name>/<version>``), tagged with stage, engine and
    steps.
    """
    from infra.registry import log_checkpoint
    from infra.tracking import active_run_id, set_tags

    tags = {"stage": ref.stage, "engine": ref.engine, "steps": str(ref.steps)}
    reg = log_checkpoint(ref.uri, name, tags=tags)
    if active_run_id() is not None:
        set_tags({"registered_model": f"{name}/{reg.version}"})
    return reg


def stage_plot(ref: CheckpointRef) -> str | None:
    """The health plot of a stage, if one was written."""
    p = Path(ref.stage_dir) / "health.png"
    return str(p) if p.exists() else None


def _policy_rollouts(cfg: RLConfig, model: str, questions: list[Any], n: int, temperature: float,
                     max_tokens: int) -> list[Any]:
    from training.agent.rollout import RolloutConfig, run_rollouts
    from training.protocols.base import load_protocol

    stage = cfg.stages[0]
    protocol = load_protocol(cfg.protocol, top_k=cfg.stage_top_k(stage), max_turns=stage.max_turns,
                             template=cfg.template)
    gen = open_generator(cfg.eval.generator.model_copy(update={"model": resolve_policy(model)}),
                         items=len(questions) * n)
    rcfg = RolloutConfig(n=n, temperature=temperature, best_of=1, max_total_tokens=max_tokens, seed=0)
    return run_rollouts(questions, protocol, gen, open_searcher(cfg.retrieval), rcfg)


def estimate_difficulty(cfg: RLConfig, questions: list[Any], model: str) -> dict[str, list[bool]]:
    """Per question, whether each of ``cfg.difficulty_rollouts`` sampled rollouts is correct (cover-EM), in order.

    This is R1-Searcher's signal: how many rollouts it takes to get the first correct answer.
    """
    from evaluation.metrics import cover_exact_match

    trajs = _policy_rollouts(cfg, model, questions, cfg.difficulty_rollouts, 1.0, cfg.eval.max_new_tokens)
    out: dict[str, list[bool]] = {q.id: [] for q in questions}
    for t in trajs:
        out[t.question_id].append(bool(t.final_answer) and cover_exact_match(t.final_answer, t.golden_answers) > 0)
    return out


def evaluate_rl_checkpoint(cfg: RLConfig, model: str, out_uri: str) -> ScoreTable:
    """Evaluate ``model`` on every ``cfg.eval.benchmarks`` entry (``training.agent.evaluate.score_checkpoint``):
    one row per benchmark (means with bootstrap intervals); each benchmark's directory (trajectories, examples,
    manifest) sits under ``out_uri``."""
    from training.agent.evaluate import score_checkpoint
    from training.rl.heldout import eval_config

    return score_checkpoint(eval_config(cfg, model), cfg.eval.benchmarks, out_uri)


def prepare_data(cfg: RLConfig, out_uri: str, train: list[Any] | None = None) -> RLDataRef:
    """Load the preset's question sets (or the given ``train`` questions) and write verl/TRL parquet files.

    The chat prompt is the protocol's system template plus the question (what verl's agent loop renders); the TRL
    engine rebuilds the protocol's exact prompt text from ``extra_info.question``.
    """
    from evaluation.benchmarks import load_benchmark
    from training.protocols.base import load_protocol
    from training.rl.data import default_messages, prepare_rl_data

    def load(sources: list[str], limit: int | None) -> list[Any]:
        qs = [q for src in sources for q in load_benchmark(src)]
        return qs[:limit] if limit else qs

    if train is not None:
        splits = {"train": train}
    else:
        every = load(cfg.data.train, None)
        splits = {"train": every[: cfg.data.train_limit] if cfg.data.train_limit else every}
        for stage in cfg.stages:  # R1-Searcher: each stage trains on its own shipped questions
            if stage.question_stage is not None:
                picked = [q for q in every if q.metadata.get("stage") == stage.question_stage]
                if not picked:
                    from infra.errors import DataError

                    raise DataError(f"stage {stage.name!r}: no training question has metadata.stage="
                                    f"{stage.question_stage} in {cfg.data.train}")
                splits[f"train_{stage.name}"] = picked[: cfg.data.train_limit] if cfg.data.train_limit else picked
    if cfg.data.val:
        splits["val"] = load(cfg.data.val, cfg.data.val_limit)
    system = getattr(load_protocol(cfg.protocol), "system_template", None)
    tool = get_engine(cfg.engine).tool_name
    return prepare_rl_data(splits, out_uri, default_messages(system), tool_name=tool,
                           sources={"train": cfg.data.train, "val": cfg.data.val}, protocol=cfg.protocol,
                           config_hash=config_hash(cfg))


def bucket_data(cfg: RLConfig, data: RLDataRef, model: str, out_uri: str) -> RLDataRef:
    """R1-Searcher difficulty selection: rollouts per training question -> buckets -> ratio mix -> new data dir."""
    from evaluation.benchmarks import Question
    from training.rl.data import bucket_questions, mix_buckets, read_parquet

    if cfg.difficulty is None:
        return data
    done = artifacts.read_manifest(out_uri)
    if done is not None:
        return RLDataRef(uri=out_uri, splits=done["splits"])
    rows = read_parquet(data.split_uri("train"))
    questions = [Question(id=str(r["extra_info"]["id"]), question=r["extra_info"]["question"],
                          golden_answers=list(r["reward_model"]["ground_truth"]), dataset=r["data_source"])
                 for r in rows]
    flags = estimate_difficulty(cfg, questions, model)
    buckets = bucket_questions(questions, flags, cfg.difficulty)
    mixed = mix_buckets(buckets, cfg.difficulty)
    artifacts.write_json(artifacts.join(out_uri, "buckets.json"),
                         {b: [q.id for q in qs] for b, qs in buckets.items()})
    return prepare_data(cfg, out_uri, train=mixed)


def open_parent_run(cfg: RLConfig) -> str:
    """Create the experiment's parent MLflow run (params = the preset), left ``RUNNING`` and not activated: the
    flow's state hooks end it (``tasks.run_status``); returns its id."""
    return create_run(f"rl-{cfg.name}", tags={"searchloop.flow": "rl_finetune"}, params=cfg.model_dump(mode="json"))


def log_stage(ref: CheckpointRef) -> None:
    """Log a stage's final metrics, health series/plot and rollout records to the active MLflow run."""
    from infra.tracking import log_artifact, log_metrics

    log_metrics({f"final/{k}": v for k, v in ref.metrics.items()})
    for name in ("health.json", "health.png", "alarms.json", "curve.json", "curve.png", "manifest.json", "command.txt"):
        p = Path(ref.stage_dir) / name
        if p.exists():
            log_artifact(p, "stage")
    rollouts = Path(ref.stage_dir) / "rollouts" / "trajectories.jsonl"
    if rollouts.exists():
        log_artifact(rollouts, "rollouts")


def log_scores(scores: ScoreTable) -> None:
    """Log ``{benchmark}/{metric}`` evaluation means (and interval ends) to the active MLflow run."""
    from infra.tracking import log_metrics

    log_metrics(scores.flat())
