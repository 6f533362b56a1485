"""RL launchers: ``train_rl_stage`` runs one stage with the preset's engine and returns a :class:`CheckpointRef`.

Engines are named in :data:`ENGINES` (dotted strings, imported only when chosen):

* ``trl`` (:func:`train_stage_trl`, here): GRPO with search in the loop on one machine (``training.trl_search``),
  health monitors as a callback, rollouts dumped as trajectory records, final policy saved as an HF folder.
* ``verl`` (``training.verl_launch.train_stage_verl``): verl's ``main_ppo`` as a subprocess in its own
  environment on GPU workers.

A stage directory holds ``checkpoints/`` (engine checkpoints; a re-run resumes from the newest), ``model/`` (the
final HF folder), ``rollouts/`` (trajectory records), ``health.json`` and ``manifest.json`` written last. A stage
whose directory already has a manifest is returned as is (idempotent re-runs after a crash later in the flow).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import Field

from infra import artifacts
from infra.config import StrictModel, config_hash
from training.rl_config import RetrievalSpec, RLConfig, StageSpec, resolve_model, resolve_path
from training.rl_data import RLDataRef

log = logging.getLogger(__name__)

ENGINES = {"trl": "training.rl:train_stage_trl", "verl": "training.verl_launch:train_stage_verl"}


class CheckpointRef(StrictModel):
    """A trained policy: an HF folder plus where it came from."""

    uri: str = Field(description="HF model folder of the final policy.")
    stage_dir: str = Field(description="Stage directory (checkpoints, rollouts, health, manifest).")
    stage: str = Field(description="Stage name.")
    engine: str = Field(description="trl or verl.")
    steps: int = Field(description="Optimizer steps completed.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Last logged training metrics.")


def make_searcher(spec: RetrievalSpec) -> Any:
    """The rollout retriever: in-process BM25 over ``spec.corpus`` or the HTTP client of our retriever service."""
    if spec.backend == "http":
        from retrieval.client import RetrieverClient

        return RetrieverClient(spec.url or "")
    from retrieval.bm25 import BM25Searcher
    from retrieval.corpus import read_corpus

    return BM25Searcher.build(read_corpus(resolve_path(spec.corpus)))


def stage_dir(root: str, cfg: RLConfig, stage: StageSpec) -> str:
    """Deterministic stage directory (same preset + overrides -> same directory, so re-runs resume)."""
    return artifacts.join(root, f"{cfg.name}-{config_hash(cfg)[:8]}", stage.name)


def finished_stage(out_uri: str) -> CheckpointRef | None:
    """The CheckpointRef of a completed stage directory, or None when it has no manifest."""
    manifest = artifacts.read_manifest(out_uri)
    if manifest is None or "checkpoint" not in manifest:
        return None
    return CheckpointRef(**manifest["checkpoint"])


def train_rl_stage(cfg: RLConfig, stage: StageSpec, data: RLDataRef, init_model: str, out_uri: str) -> CheckpointRef:
    """Train one stage with ``cfg.engine`` from ``init_model``; resume inside ``out_uri`` if it was started."""
    import importlib

    done = finished_stage(out_uri)
    if done is not None:
        log.info("stage %s already finished at %s", stage.name, out_uri)
        return done
    module, _, attr = ENGINES[cfg.engine].partition(":")
    return getattr(importlib.import_module(module), attr)(cfg, stage, data, init_model, out_uri)


def _last_metrics(log_history: list[dict[str, Any]]) -> dict[str, float]:
    logs = [h for h in log_history if "loss" in h]
    return {k: float(v) for k, v in (logs[-1] if logs else {}).items() if isinstance(v, (int, float))}


def train_stage_trl(cfg: RLConfig, stage: StageSpec, data: RLDataRef, init_model: str, out_uri: str) -> CheckpointRef:
    """TRL GRPO with search in the loop for one stage (see ``training.trl_search``)."""
    from training.health import health_callback, plot_health, raise_if_unhealthy
    from training.models import load_tokenizer
    from training.protocols.base import load_protocol
    from training.records import write_trajectories
    from training.reward_adapters import trl_reward_func
    from training.rl_data import read_parquet, trl_rows
    from training.rollout import RolloutConfig
    from training.trl_search import build_trainer, engine_rollout_fn, last_checkpoint, prompt_rows

    tcfg = stage.trl
    if tcfg is None:
        raise ValueError(f"stage {stage.name!r} has no trl settings")
    out = artifacts.local_path(out_uri)
    model_path = resolve_model(init_model)
    tok = load_tokenizer(model_path)
    protocol = load_protocol(cfg.protocol, top_k=stage.top_k or cfg.retrieval.top_k, max_turns=stage.max_turns,
                             template=cfg.template)
    rows = prompt_rows(protocol, trl_rows(read_parquet(data.split_uri("train"))), tok)
    sink: list = []
    rollout_cfg = RolloutConfig(temperature=tcfg.temperature, best_of=1, max_tokens_per_turn=tcfg.max_tokens_per_turn,
                                max_total_tokens=tcfg.max_completion_length, seed=tcfg.seed)
    rollout = engine_rollout_fn(protocol, make_searcher(cfg.retrieval), rollout_cfg, sink=sink)
    health = health_callback(cfg.health)
    reward = trl_reward_func(stage.reward, eos_token_id=tok.eos_token_id)
    ckpt_dir = str(out / "checkpoints")
    trainer = build_trainer(tcfg, model_path, rows, [reward], rollout, ckpt_dir, callbacks=[health])
    resume = last_checkpoint(ckpt_dir)
    if resume:
        log.info("resuming stage %s from %s", stage.name, resume)
    trainer.train(resume_from_checkpoint=resume)
    artifacts.write_json(str(out / "health.json"), health.series)
    if health.series:
        plot_health(health.series, str(out / "health.png"))
    if sink:
        write_trajectories(sink, str(out / "rollouts"), stage=stage.name, engine="trl")
    raise_if_unhealthy(health)
    trainer.save_model(str(out / "model"))
    tok.save_pretrained(str(out / "model"))
    ref = CheckpointRef(uri=str(out / "model"), stage_dir=str(out), stage=stage.name, engine="trl",
                        steps=int(trainer.state.global_step), metrics=_last_metrics(trainer.state.log_history))
    artifacts.write_manifest(str(out), kind="rl_stage", checkpoint=ref.model_dump(), init_model=init_model,
                             resumed_from=resume, config_hash=config_hash(cfg), reward=stage.reward)
    return ref


def register_checkpoint(ref: CheckpointRef, name: str) -> dict[str, Any]:
    """Log the HF folder as an MLflow artifact of the active run and register it as a model version.

    Returns ``{"name", "version", "source"}``. The folder is registered as an artifact directory (no flavor
    dependencies), so any engine's output registers the same way.
    """
    import mlflow

    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("register_checkpoint needs an active MLflow run (wrap it in infra.tracking.stage_run)")
    mlflow.log_artifacts(ref.uri, artifact_path="model")
    source = f"runs:/{run.info.run_id}/model"
    mv = mlflow.register_model(source, name)
    mlflow.set_tag("registered_model", f"{name}/{mv.version}")
    return {"name": name, "version": str(mv.version), "source": source}


def stage_plot(ref: CheckpointRef) -> str | None:
    """The health plot of a stage, if one was written."""
    p = Path(ref.stage_dir) / "health.png"
    return str(p) if p.exists() else None


def _policy_rollouts(cfg: RLConfig, model: str, questions: list[Any], n: int, temperature: float,
                     max_tokens: int) -> list[Any]:
    from training.generation import TransformersGenerator
    from training.protocols.base import load_protocol
    from training.rollout import RolloutConfig, run_rollouts

    stage = cfg.stages[0]
    protocol = load_protocol(cfg.protocol, top_k=stage.top_k or cfg.retrieval.top_k, max_turns=stage.max_turns,
                             template=cfg.template)
    gen = TransformersGenerator.from_model(resolve_model(model))
    rcfg = RolloutConfig(n=n, temperature=temperature, best_of=1, max_total_tokens=max_tokens,
                         max_tokens_per_turn=min(max_tokens, 512), seed=0)
    return run_rollouts(questions, protocol, gen, make_searcher(cfg.retrieval), rcfg)


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


def evaluate_rl_checkpoint(cfg: RLConfig, model: str, out_uri: str) -> dict[str, dict[str, float]]:
    """Greedy rollouts of ``model`` on ``cfg.eval.benchmarks``, scored per dataset; writes records + scores."""
    from evaluation.benchmarks import load_benchmark
    from evaluation.scoring import score_trajectories
    from training.records import write_trajectories

    questions = [q for name in cfg.eval.benchmarks for q in load_benchmark(resolve_path(name), limit=cfg.eval.limit)]
    if not questions:
        return {}
    trajs = _policy_rollouts(cfg, model, questions, 1, 0.0, cfg.eval.max_new_tokens)
    examples, table = score_trajectories(trajs, questions)
    write_trajectories(trajs, artifacts.join(out_uri, "trajectories"), model=model)
    artifacts.write_jsonl(artifacts.join(out_uri, "examples.jsonl"), examples)
    scores = table.as_dict()
    artifacts.write_json(artifacts.join(out_uri, "scores.json"), scores)
    artifacts.write_manifest(out_uri, kind="rl_eval", model=model, benchmarks=cfg.eval.benchmarks,
                             questions=len(questions))
    return scores
