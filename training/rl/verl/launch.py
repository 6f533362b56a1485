"""verl launcher: ``python -m verl.trainer.main_ppo`` as a subprocess in verl's own environment (GPU workers).

UNVERIFIED: no GPU or verl install was available when this was written; the overrides are checked against verl's
config keys (``tests/training/rl/test_verl_config.py``) and, where verl imports, against its hydra config.

Steps of :func:`train_stage_verl`:
1. write the search tool YAML (verl ``SearchTool`` -> our retriever's Search-R1 ``/retrieve``) and the overrides;
2. run ``main_ppo`` with ``MLFLOW_RUN_ID`` / ``MLFLOW_TRACKING_URI`` so verl's mlflow tracker logs into our run,
   ``PYTHONPATH`` so verl can import our reward adapter, ``trainer.resume_mode=auto`` so a re-run resumes from the
   newest ``global_step_N``; stdout/stderr go to ``verl.log``;
3. convert verl's rollout dumps (``rollout_dump/<step>.jsonl``: input, output, gts, score) to trajectory records;
4. merge the newest FSDP actor checkpoint into an HF folder with ``python -m verl.model_merger merge``.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import yaml

from infra import artifacts
from infra.config import config_hash
from infra.errors import SearchloopError
from infra.paths import repo_path
from infra.settings import REPO_ROOT, get_settings
from training.generation.models import resolve_policy
from training.refs import CheckpointRef
from training.rl.config import RLConfig, StageSpec
from training.rl.data import RLDataRef, train_split
from training.rl.verl.agent_loop import agent_loop_entry
from training.rl.verl.config import VerlConfig, render_overrides, render_search_tool_config

log = logging.getLogger(__name__)

REWARD_MODULE = repo_path("training/rewards/adapters.py")


class VerlRunError(SearchloopError):
    """verl's trainer or model merger exited with an error; the message points to its log."""


def stage_verl_config(cfg: RLConfig, stage: StageSpec) -> VerlConfig:
    """The stage's verl settings with the stage's max turns applied (top-k: ``cfg.stage_top_k(stage)``)."""
    if stage.verl is None:
        raise ValueError(f"stage {stage.name!r} has no verl settings")
    update: dict[str, Any] = {}
    if stage.max_turns:
        update["max_turns"] = stage.max_turns
    return stage.verl.model_copy(update=update)


def build_command(cfg: RLConfig, stage: StageSpec, data: RLDataRef, init_model: str, out: Path,
                  loop_entry: dict[str, Any] | None = None) -> list[str]:
    """Write the tool config and the agent-loop YAML; return the full ``main_ppo`` command line.

    ``loop_entry``: the agent-loop YAML entry to register instead of the plain tag loop's (e.g. SmartSearch's
    ``training.smartsearch.verl_loop.smartsearch_loop_entry``, judge settings included).
    """
    vcfg = stage_verl_config(cfg, stage)
    if not cfg.retrieval.url:
        raise ValueError("verl needs the retriever service: set retrieval.url")
    tool_path = out / "search_tool.yaml"
    artifacts.write_text(str(tool_path), yaml.safe_dump(render_search_tool_config(cfg.retrieval.url, vcfg,
                                                                                         cfg.stage_top_k(stage))))
    loop_path = out / "agent_loop.yaml"
    entry = loop_entry or agent_loop_entry(cfg.protocol, cfg.stage_top_k(stage), stage.max_turns, cfg.template,
                                           cfg.retrieval.url, vcfg.max_tokens_per_turn)
    artifacts.write_text(str(loop_path), yaml.safe_dump([entry]))
    val = data.split_uri("val") if "val" in data.splits else data.split_uri("train")
    overrides = render_overrides(
        vcfg, model_path=resolve_policy(init_model), train_files=data.split_uri(train_split(stage, data)),
        val_files=val,
        tool_config_path=str(tool_path), agent_loop_config_path=str(loop_path), reward_path=str(REWARD_MODULE),
        reward_name=f"compute_score_{stage.reward}",
        output_dir=str(out / "checkpoints"), experiment="searchloop", run_name=f"{cfg.name}-{stage.name}",
        rollout_dump_dir=str(out / "rollout_dump"))
    return [cfg.verl_python, "-m", "verl.trainer.main_ppo", *overrides]


def verl_env(run_id: str | None) -> dict[str, str]:
    """Environment of the verl subprocess: our MLflow store and run, our repo importable, offline hub off."""
    env = dict(os.environ)
    env["MLFLOW_TRACKING_URI"] = get_settings().tracking_uri
    if run_id:
        env["MLFLOW_RUN_ID"] = run_id
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _run(cmd: list[str], env: dict[str, str], log_path: Path, what: str) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as fh:
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise VerlRunError(f"{what} exited with status {proc.returncode}; see {log_path}. Last output:\n{tail}")


def latest_actor(ckpt_dir: Path) -> tuple[int, Path] | None:
    """(step, actor dir) of the newest ``global_step_N/actor`` checkpoint, or None."""
    steps = [(int(p.name.split("_")[-1]), p / "actor") for p in ckpt_dir.glob("global_step_*")
             if p.name.split("_")[-1].isdigit() and (p / "actor").is_dir()]
    return max(steps) if steps else None


def convert_rollout_dumps(dump_dir: Path, protocol: str, agent_loop: str = "tags") -> list[Any]:
    """verl rollout dumps (one jsonl per step) -> ``training.agent.records.Trajectory`` records (step in ``sample``).

    Searches are counted the protocol's way (``<result>``, ``<information>``, ``<|begin_of_documents|>``, ExSearch's
    ``<SEARCH>`` user turns); verl's own function-calling loop (``agent_loop="tool_agent"``) inserts
    ``<tool_response>``. The finish reason is ``eos``/``length`` from the reward's ``finished`` column when the dump
    has one (our agent loop reports it), else ``eos``."""
    from training.agent.records import Trajectory
    from training.protocols.base import load_protocol

    proto = load_protocol(protocol)
    out = []
    for path in sorted(dump_dir.glob("*.jsonl"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1):
        for i, line in enumerate(path.read_bytes().splitlines()):
            if not line.strip():
                continue
            row = orjson.loads(line)
            gts = row.get("gts")
            golds = [str(g) for g in gts] if isinstance(gts, list) else ([str(gts)] if gts is not None else [])
            output = row.get("output", "")
            check = proto.validate(output)
            searches = output.count("<tool_response>") if agent_loop == "tool_agent" else proto.count_searches(output)
            finished = row.get("finished")
            reason = "eos" if finished is None or float(finished) > 0 else "length"
            out.append(Trajectory(
                question_id=f"verl-step{row.get('step', path.stem)}-{i}", question=row.get("input", ""),
                golden_answers=golds, sample=int(row.get("step", 0)), protocol=protocol, prompt=row.get("input", ""),
                response=row.get("output", ""), final_answer=proto.extract_answer(row.get("output", "")),
                finish_reason=reason, n_searches=searches,
                format_ok=check.ok, format_reasons=check.reasons,
                timings={"score": float(row.get("score", 0.0) or 0.0)}))
    return out


def train_stage_verl(cfg: RLConfig, stage: StageSpec, data: RLDataRef, init_model: str, out_uri: str,
                     loop_entry: dict[str, Any] | None = None) -> CheckpointRef:
    """Run one verl stage (see the module docstring) and return the merged HF checkpoint (``loop_entry``: see
    :func:`build_command`)."""
    from infra import tracking
    from training.agent.records import write_trajectories

    out = artifacts.local_path(out_uri)
    out.mkdir(parents=True, exist_ok=True)
    cmd = build_command(cfg, stage, data, init_model, out, loop_entry)
    artifacts.write_text(str(out / "command.txt"), " ".join(cmd) + "\n")
    env = verl_env(tracking.active_run_id())
    _run(cmd, env, out / "verl.log", "verl main_ppo")
    found = latest_actor(out / "checkpoints")
    if found is None:
        raise VerlRunError(f"verl finished but wrote no global_step_*/actor under {out / 'checkpoints'}; "
                           "set verl.save_freq > 0 (verl also saves at the last step)")
    step, actor = found
    merge = [cfg.verl_python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor),
             "--target_dir", str(out / "model")]
    _run(merge, env, out / "merge.log", "verl model_merger")
    trajs = convert_rollout_dumps(out / "rollout_dump", cfg.protocol, stage_verl_config(cfg, stage).agent_loop)
    if trajs:
        write_trajectories(trajs, str(out / "rollouts"), stage=stage.name, engine="verl")
    ref = CheckpointRef(uri=str(out / "model"), base_model=init_model, stage_dir=str(out), stage=stage.name,
                        engine="verl", steps=step)
    artifacts.write_manifest(str(out), kind="rl_stage", checkpoint=ref.model_dump(), init_model=init_model,
                             config_hash=config_hash(cfg), reward=stage.reward, command=cmd)
    return ref
