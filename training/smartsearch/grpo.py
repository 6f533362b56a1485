"""Stage 3, query-aware GRPO: TRL on this machine with refinement branches and the judge in the reward; verl
overrides rendered for GPU workers.

TRL (``engine: trl``): ``training.rl.trl_engine``'s ``SearchGRPOTrainer`` (rollouts from our engine with the live
policy, retrieved tokens masked from the loss) with :func:`training.smartsearch.branches.branch_rollout_fn` as the
rollout function and :func:`training.smartsearch.branches.smartsearch_trl_reward` (outcome + process + format;
the process counts the redundancy rule and the judge's verdicts). Resumes from the newest ``checkpoint-N``.

verl (``engine: verl``): the stage becomes an ``RLConfig`` stage with the ``smartsearch`` reward and
``training.rl.verl.launch`` renders and runs ``main_ppo`` (command in ``command.txt``, the agent loop in
``agent_loop.yaml``). The agent loop is ``training.smartsearch.verl_loop``: the leader copy of each group is judged
and refined, the other copies continue its kept refined prefixes, and every sample's judge verdicts reach
``compute_score_smartsearch`` through ``extra_info`` (outcome + process with judge and redundancy rule + format).
The YAML carries the endpoint settings (``stage3.branch``, ``stage3.judge_reward``, ``stage3.max_length_diff``,
judge and refiner), never a token; ``endpoint.base_url`` must be reachable from the GPU workers. Unverified on GPUs.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from infra import artifacts
from training.smartsearch.config import SmartSearchConfig
from training.smartsearch.stages import StageResult, _finish, finished, load_questions, protocol_for

log = logging.getLogger(__name__)


def grpo_rows(cfg: SmartSearchConfig, protocol: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """TRL dataset rows: the protocol's prompt text plus the columns the reward reads."""
    return [{"prompt": protocol.build_prompt(q.question, tokenizer), "question": q.question,
             "golden_answers": list(q.golden_answers), "question_id": q.id, "data_source": q.dataset}
            for q in load_questions(cfg.stage3.questions)]


def run_stage3(cfg: SmartSearchConfig, judge: Any, refiner: Any, searcher: Any, init_model: str,
               out_uri: str) -> StageResult:
    """Stage 3 with the preset's engine; skipped when the directory is complete."""
    done = finished(out_uri)
    if done is not None:
        return done
    from infra.errors import ConfigError
    from infra.lazy import load_object
    from training.rl.engines import get_engine

    launch = get_engine(cfg.stage3.engine).stage3
    if launch is None:
        raise ConfigError(f"engine {cfg.stage3.engine!r} has no SmartSearch stage-3 launcher (its `stage3` entry in "
                          "training.rl.engines.ENGINES); choose trl or verl")
    return load_object(launch)(cfg, judge, refiner, searcher, init_model, out_uri)


def run_trl(cfg: SmartSearchConfig, judge: Any, refiner: Any, searcher: Any, init_model: str,
            out_uri: str) -> StageResult:
    """Stage 3 with TRL on this machine: refinement branches in each group, the judge in the reward."""
    from training.agent.records import write_trajectories
    from training.agent.rollout import RolloutConfig
    from training.generation.models import load_tokenizer, resolve_policy
    from training.rl.trl_engine import build_trainer, last_checkpoint
    from training.smartsearch.branches import BranchStats, branch_rollout_fn, smartsearch_trl_reward

    t0, out = time.perf_counter(), artifacts.local_path(out_uri)
    init_model = str(resolve_policy(init_model))
    tcfg = cfg.stage3.trl
    if tcfg is None:
        raise ValueError("stage3.engine=trl needs a stage3.trl section")
    tok = load_tokenizer(init_model)
    protocol = protocol_for(cfg)
    rows = grpo_rows(cfg, protocol, tok)
    rcfg = RolloutConfig(temperature=tcfg.temperature, best_of=1, max_tokens_per_turn=tcfg.max_tokens_per_turn,
                         max_total_tokens=tcfg.max_completion_length, seed=tcfg.seed)
    stats = BranchStats()
    if cfg.stage3.branch:
        rollout = branch_rollout_fn(protocol, searcher, rcfg, judge, refiner, cfg.stage3.max_length_diff, stats)
    else:
        from training.rl.trl_engine import engine_rollout_fn

        rollout = engine_rollout_fn(protocol, searcher, rcfg, sink=stats.trajectories)
    reward = smartsearch_trl_reward(judge if cfg.stage3.judge_reward else None, cfg.judge.max_redundancy)
    ckpt_dir = str(out / "checkpoints")
    resume = last_checkpoint(ckpt_dir)
    trainer = build_trainer(tcfg, init_model, rows, [reward], rollout, ckpt_dir)
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(str(out / "model"))
    tok.save_pretrained(str(out / "model"))
    history = trainer.state.log_history
    artifacts.write_jsonl(out / "log_history.jsonl", history)
    if stats.trajectories:
        write_trajectories([t for t in stats.trajectories if t is not None], str(out / "rollouts"), stage="grpo")
    artifacts.write_jsonl(out / "verdicts.jsonl", stats.verdicts)
    artifacts.write_jsonl(out / "refinements.jsonl", stats.refinements)
    counts: dict[str, float] = {**stats.counts(), "steps": float(trainer.state.global_step),
                                "judge_failed_calls": float(judge.stats["failed"])}
    rewards = [h["reward"] for h in history if "reward" in h]
    if rewards:
        counts |= {"reward_first": rewards[0], "reward_last": rewards[-1]}
    losses = [float(h["loss"]) for h in history if "loss" in h]
    ckpt = {"path": str(out / "model"), "base_model": init_model, "train_loss": losses[-1] if losses else None,
            "n_examples": len(rows), "resumed_from": resume}
    return _finish(out, "grpo", str(out / "model"), True, counts, losses, t0, ckpt)


def verl_stage_config(cfg: SmartSearchConfig, init_model: str) -> Any:
    """The ``RLConfig`` whose single ``grpo`` stage is this curriculum's stage 3 (for the verl launcher)."""
    from training.rl.config import RLConfig

    if cfg.stage3.verl is None:
        raise ValueError("stage3.engine=verl needs a stage3.verl section")
    return RLConfig(
        name=f"{cfg.name}-grpo", engine="verl", model=init_model, protocol="smartsearch", template=cfg.template,
        data={"train": [s.path for s in cfg.stage3.questions]}, retrieval=cfg.retrieval, top_k=cfg.top_k,
        stages=[{"name": "grpo", "reward": "smartsearch", "max_turns": cfg.stage3.max_turns,
                 "top_k": cfg.top_k, "verl": cfg.stage3.verl}],
        register_model=False, verl_python=cfg.verl_python)


def verl_loop_entry(cfg: SmartSearchConfig, rl_cfg: Any) -> dict[str, Any]:
    """The agent-loop YAML entry of stage 3: the tag loop's settings plus the judge/refiner ones (no secrets)."""
    from training.rl.verl.launch import stage_verl_config
    from training.smartsearch.config import LoopSpec
    from training.smartsearch.verl_loop import smartsearch_loop_entry

    stage = rl_cfg.stages[0]
    vcfg = stage_verl_config(rl_cfg, stage)
    if not rl_cfg.retrieval.url:
        raise ValueError("verl needs the retriever service: set retrieval.url")
    spec = LoopSpec(endpoint=cfg.endpoint, judge=cfg.judge, refiner=cfg.refiner, branch=cfg.stage3.branch,
                    judge_reward=cfg.stage3.judge_reward, max_length_diff=cfg.stage3.max_length_diff)
    return smartsearch_loop_entry(rl_cfg.protocol, rl_cfg.stage_top_k(stage), stage.max_turns, rl_cfg.template,
                                  rl_cfg.retrieval.url, vcfg.max_tokens_per_turn, spec)


def render_verl_command(cfg: SmartSearchConfig, init_model: str, out: Path) -> list[str]:
    """Prepare the verl data and return the ``main_ppo`` command of stage 3 (written to ``command.txt``; the agent
    loop with the judge settings to ``agent_loop.yaml``)."""
    from training.rl.stages import prepare_data
    from training.rl.verl.launch import build_command

    rl_cfg = verl_stage_config(cfg, init_model)
    data = prepare_data(rl_cfg, str(out / "data"))
    cmd = build_command(rl_cfg, rl_cfg.stages[0], data, init_model, out, verl_loop_entry(cfg, rl_cfg))
    artifacts.write_text(out / "command.txt", " ".join(cmd) + "\n")
    return cmd


def run_verl(cfg: SmartSearchConfig, judge: Any, refiner: Any, searcher: Any, init_model: str,
             out_uri: str) -> StageResult:
    """Stage 3 on verl's GPU workers (judge and refiner are reached from the agent loop, not passed in)."""
    from training.rl.stages import prepare_data
    from training.rl.verl.launch import train_stage_verl

    t0, out = time.perf_counter(), artifacts.local_path(out_uri)
    rl_cfg = verl_stage_config(cfg, init_model)
    data = prepare_data(rl_cfg, str(out / "data"))
    ref = train_stage_verl(rl_cfg, rl_cfg.stages[0], data, init_model, str(out / "verl"),
                           verl_loop_entry(cfg, rl_cfg))
    return _finish(out, "grpo", ref.uri, True, {"steps": float(ref.steps)}, [], t0, ref.model_dump())
