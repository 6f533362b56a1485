"""Render verl command-line overrides (``python -m verl.trainer.main_ppo key=value ...``) from our RL config.

We do not mirror verl's schema: :class:`VerlConfig` holds the handful of settings our presets choose (estimator, group
size, learning rates, KL, batch sizes, lengths, search turns and top-k, GPU layout) and :func:`render_overrides` turns
them into hydra overrides of keys that exist in verl's ``ppo_trainer.yaml`` (``VERL_KEYS`` lists the ones we use, read
from verl @ b178a3cd5 and checked against verl 0.9.1; a test checks rendered keys against it and, where verl is
importable, against verl's own hydra config). Multi-turn search goes through verl's tool agent loop and its
``SearchTool``, which POSTs the Search-R1 ``/retrieve`` schema to our retriever service; verl's agent loop sets
``response_mask`` to 0 on tool tokens, so retrieved text is masked from the loss. For the seeds' text-tag formats
``agent_loop=tags`` (default) registers ``training.rl.verl.agent_loop`` instead, which drives our protocols and sets the
same mask from span tracking. Rewards come from our module via ``reward.custom_reward_function.path/name`` (verl 0.9
reads only this; its top-level ``custom_reward_function`` is a legacy block that only the fully-async entry migrates, so
``main_ppo`` would silently use its default scorer); metrics go to our MLflow run (verl reattaches through
``MLFLOW_RUN_ID``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from infra.config import StrictModel

Algorithm = Literal["grpo", "reinforce_pp", "ppo"]

# verl's adv_estimator name per algorithm (verl/trainer/ppo/core_algos.py: AdvantageEstimator).
ADV_ESTIMATOR = {"grpo": "grpo", "reinforce_pp": "reinforce_plus_plus_baseline", "ppo": "gae"}

# Key paths of verl's ppo_trainer config that we render (verl @ b178a3cd5; all present and none legacy in verl 0.9.1).
VERL_KEYS = frozenset({
    "algorithm.adv_estimator", "algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef",
    "algorithm.norm_adv_by_std_in_grpo", "algorithm.gamma", "algorithm.lam",
    "data.train_files", "data.val_files", "data.train_batch_size", "data.val_batch_size", "data.max_prompt_length",
    "data.max_response_length", "data.filter_overlong_prompts", "data.truncation", "data.return_raw_chat",
    "data.prompt_key", "data.shuffle",
    "actor_rollout_ref.model.path", "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.model.enable_gradient_checkpointing", "actor_rollout_ref.model.trust_remote_code",
    "actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio",
    "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.actor.kl_loss_type", "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.loss_agg_mode",
    "actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.ref.fsdp_config.param_offload",
    "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.mode", "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_p",
    "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.max_model_len",
    "actor_rollout_ref.rollout.multi_turn.enable", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns",
    "actor_rollout_ref.rollout.multi_turn.max_user_turns", "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length",
    "actor_rollout_ref.rollout.multi_turn.format", "actor_rollout_ref.rollout.agent.default_agent_loop",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path", "actor_rollout_ref.rollout.agent.num_workers",
    "critic.optim.lr", "critic.model.path", "critic.ppo_micro_batch_size_per_gpu",
    "reward.custom_reward_function.path", "reward.custom_reward_function.name",
    "trainer.logger", "trainer.project_name", "trainer.experiment_name", "trainer.nnodes",
    "trainer.n_gpus_per_node", "trainer.total_epochs", "trainer.total_training_steps", "trainer.save_freq",
    "trainer.test_freq", "trainer.val_before_train", "trainer.critic_warmup", "trainer.default_local_dir",
    "trainer.rollout_data_dir", "trainer.validation_data_dir", "trainer.resume_mode", "trainer.log_val_generations",
    "trainer.device",
})


class VerlConfig(StrictModel):
    """The verl settings a preset chooses; everything else keeps verl's defaults.

    Documents per search are not a verl setting: the stage's ``top_k`` (else the preset's) is read everywhere
    through ``RLConfig.stage_top_k``.
    """

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "top_k" in data:
            raise ValueError("verl.top_k was removed (it was overwritten by the stage's top-k): set documents per "
                             "search with the stage's `top_k` (stages.<name>.top_k) or the preset's `top_k`")
        return data

    algorithm: Algorithm = Field(default="grpo", description="grpo, reinforce_pp (REINFORCE++ w/ baseline) or ppo.")
    n: int = Field(default=5, ge=1, description="Rollouts per prompt (GRPO group size).")
    lr: float = Field(default=1e-6, gt=0, description="Actor learning rate.")
    critic_lr: float = Field(default=1e-5, gt=0, description="Critic learning rate (PPO only).")
    warmup_ratio: float = Field(default=0.0, ge=0, le=1, description="Actor LR warm-up ratio.")
    use_kl_loss: bool = Field(default=True, description="KL to the reference as a loss term (GRPO style).")
    kl_coef: float = Field(default=0.001, ge=0, description="KL coefficient (loss or in-reward).")
    kl_loss_type: str = Field(default="low_var_kl", description="verl kl_loss_type (low_var_kl, kl, mse...).")
    kl_in_reward: bool = Field(default=False, description="KL penalty in the reward (PPO style).")
    entropy_coeff: float = Field(default=0.0, ge=0, description="Entropy bonus coefficient.")
    train_batch_size: int = Field(default=256, ge=1, description="Prompts per training step.")
    val_batch_size: int | None = Field(default=None, ge=1, description="Validation batch; None = whole set.")
    ppo_mini_batch_size: int = Field(default=256, ge=1, description="PPO mini-batch (prompts).")
    micro_batch_size_per_gpu: int = Field(default=4, ge=1, description="Micro batch per GPU for updates/logprobs.")
    max_prompt_length: int = Field(default=512, ge=16, description="Prompt token budget.")
    max_response_length: int = Field(default=8192, ge=16, description="Whole multi-turn response budget (tokens).")
    max_turns: int = Field(default=5, ge=1, description="Max assistant turns (search rounds + answer).")
    max_tool_response_length: int = Field(default=512, ge=16, description="Token cap on one tool response.")
    max_tokens_per_turn: int | None = Field(
        default=None, ge=8, description="New tokens per step of the tag agent loop (None = the protocol's default: "
        "512, or the whole response budget for ReSearch, whose seed has no per-step cap).")
    agent_loop: Literal["tags", "tool_agent"] = Field(
        default="tags", description="tags: our protocol loop (training.rl.verl.agent_loop, seed tag formats); "
        "tool_agent: verl's function-calling loop with its SearchTool.")
    retrieval_timeout: int = Field(default=30, ge=1, description="Search tool HTTP timeout (s).")
    retrieval_workers: int = Field(default=64, ge=1, description="Search tool worker pool / rate limit.")
    rollout_engine: Literal["vllm", "sglang"] = Field(default="vllm", description="verl rollout backend.")
    temperature: float = Field(default=1.0, ge=0, description="Rollout sampling temperature.")
    tensor_parallel: int = Field(default=1, ge=1, description="Rollout tensor-parallel size.")
    gpu_memory_utilization: float = Field(default=0.6, gt=0, le=1, description="Rollout engine GPU memory share.")
    nnodes: int = Field(default=1, ge=1, description="Ray nodes.")
    gpus_per_node: int = Field(default=1, ge=1, description="GPUs per node.")
    total_epochs: int = Field(default=2, ge=1, description="Epochs over the training parquet.")
    total_training_steps: int | None = Field(default=None, ge=1, description="Stop after this many steps.")
    save_freq: int = Field(default=10, description="Checkpoint every N steps (-1: never).")
    test_freq: int = Field(default=10, description="Validate every N steps (-1: never).")
    gradient_checkpointing: bool = Field(default=True, description="Activation checkpointing in the actor.")
    param_offload: bool = Field(default=False, description="FSDP parameter offload for actor and ref.")


def _fmt(value: Any) -> str:
    """Format a python value as a hydra override value."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(f"'{v}'" if isinstance(v, str) else _fmt(v) for v in value) + "]"
    if isinstance(value, str) and any(c in value for c in " ,[]{}=:'\""):
        return "'" + value.replace("'", "\\'") + "'"
    return str(value)


def render_search_tool_config(retrieval_url: str, cfg: VerlConfig, top_k: int) -> dict[str, Any]:
    """verl tool config (YAML body) for its ``SearchTool`` posting Search-R1 ``/retrieve`` to our service, asking
    for ``top_k`` documents per search (the stage's, ``RLConfig.stage_top_k``)."""
    url = retrieval_url.rstrip("/")
    if not url.endswith("/retrieve"):
        url += "/retrieve"
    return {"tools": [{
        "class_name": "verl.tools.search_tool.SearchTool",
        "config": {"retrieval_service_url": url, "topk": top_k, "timeout": cfg.retrieval_timeout,
                   "num_workers": cfg.retrieval_workers, "rate_limit": cfg.retrieval_workers, "type": "native"},
        "tool_schema": {"type": "function", "function": {
            "name": "search",
            "description": "Searches Wikipedia for passages relevant to the given queries.",
            "parameters": {"type": "object", "required": ["query_list"], "properties": {"query_list": {
                "type": "array", "item": {"type": "string"},
                "description": "Fully-formed queries; results come back for each one."}}},
        }},
    }]}


def _algorithm_overrides(cfg: VerlConfig) -> dict[str, Any]:
    out: dict[str, Any] = {
        "algorithm.adv_estimator": ADV_ESTIMATOR[cfg.algorithm],
        "algorithm.use_kl_in_reward": cfg.kl_in_reward,
        "algorithm.kl_ctrl.kl_coef": cfg.kl_coef,
        "actor_rollout_ref.actor.use_kl_loss": cfg.use_kl_loss,
        "actor_rollout_ref.actor.kl_loss_coef": cfg.kl_coef,
        "actor_rollout_ref.actor.kl_loss_type": cfg.kl_loss_type,
        "actor_rollout_ref.actor.entropy_coeff": cfg.entropy_coeff,
        "trainer.critic_warmup": 0,
    }
    if cfg.algorithm == "ppo":
        out["critic.optim.lr"] = cfg.critic_lr
        out["critic.ppo_micro_batch_size_per_gpu"] = cfg.micro_batch_size_per_gpu
    return out


def _agent_loop_overrides(cfg: VerlConfig, tool_config_path: str | None,
                          agent_loop_config_path: str | None) -> dict[str, Any]:
    if cfg.agent_loop == "tool_agent":
        if not tool_config_path:
            raise ValueError("agent_loop=tool_agent needs tool_config_path (render_search_tool_config)")
        return {"actor_rollout_ref.rollout.multi_turn.tool_config_path": tool_config_path,
                "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent"}
    if not agent_loop_config_path:
        raise ValueError("agent_loop=tags needs agent_loop_config_path (training.rl.verl.agent_loop.agent_loop_entry)")
    return {"actor_rollout_ref.rollout.agent.agent_loop_config_path": agent_loop_config_path,
            "actor_rollout_ref.rollout.agent.default_agent_loop": "searchloop_tags"}


def render_overrides(
    cfg: VerlConfig,
    *,
    model_path: str,
    train_files: str,
    val_files: str,
    tool_config_path: str | None,
    agent_loop_config_path: str | None,
    reward_path: str,
    reward_name: str,
    output_dir: str,
    experiment: str,
    run_name: str,
    rollout_dump_dir: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> list[str]:
    """Return ``key=value`` overrides for ``python -m verl.trainer.main_ppo``.

    Args:
        cfg: our verl settings (from the preset).
        model_path: HF folder of the initial actor (and critic for PPO).
        train_files / val_files: parquet files from :mod:`training.rl.data`.
        tool_config_path: YAML from :func:`render_search_tool_config` (``agent_loop=tool_agent``).
        agent_loop_config_path: YAML registering ``training.rl.verl.agent_loop`` (``agent_loop=tags``).
        reward_path / reward_name: file and function of our verl reward adapter (``compute_score``).
        output_dir: ``trainer.default_local_dir`` (checkpoints; resume_mode=auto picks up the latest).
        experiment / run_name: MLflow experiment and run name (verl reattaches to ``MLFLOW_RUN_ID`` when set).
        rollout_dump_dir: where verl dumps rollouts as jsonl each step (converted to our trajectories).
        extra: further ``key: value`` pairs (e.g. GPU tuning), appended last.
    """
    micro = cfg.micro_batch_size_per_gpu
    values: dict[str, Any] = {
        "data.train_files": train_files, "data.val_files": val_files,
        "data.train_batch_size": cfg.train_batch_size, "data.max_prompt_length": cfg.max_prompt_length,
        "data.max_response_length": cfg.max_response_length, "data.filter_overlong_prompts": True,
        "data.truncation": "error", "data.return_raw_chat": True,
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.model.enable_gradient_checkpointing": cfg.gradient_checkpointing,
        "actor_rollout_ref.model.use_remove_padding": True,
        "actor_rollout_ref.actor.optim.lr": cfg.lr,
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": cfg.warmup_ratio,
        "actor_rollout_ref.actor.ppo_mini_batch_size": cfg.ppo_mini_batch_size,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.actor.fsdp_config.param_offload": cfg.param_offload,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": cfg.param_offload,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.ref.fsdp_config.param_offload": cfg.param_offload,
        "actor_rollout_ref.rollout.name": cfg.rollout_engine, "actor_rollout_ref.rollout.mode": "async",
        "actor_rollout_ref.rollout.n": cfg.n, "actor_rollout_ref.rollout.temperature": cfg.temperature,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": cfg.tensor_parallel,
        "actor_rollout_ref.rollout.gpu_memory_utilization": cfg.gpu_memory_utilization,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.rollout.multi_turn.enable": True,
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": cfg.max_turns,
        "actor_rollout_ref.rollout.multi_turn.max_user_turns": cfg.max_turns,
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": cfg.max_tool_response_length,
        "reward.custom_reward_function.path": reward_path, "reward.custom_reward_function.name": reward_name,
        "trainer.logger": ["console", "mlflow"], "trainer.project_name": experiment,
        "trainer.experiment_name": run_name, "trainer.nnodes": cfg.nnodes, "trainer.n_gpus_per_node": cfg.gpus_per_node,
        "trainer.total_epochs": cfg.total_epochs, "trainer.save_freq": cfg.save_freq,
        "trainer.test_freq": cfg.test_freq, "trainer.default_local_dir": output_dir, "trainer.resume_mode": "auto",
        "trainer.val_before_train": False,
    }
    values.update(_agent_loop_overrides(cfg, tool_config_path, agent_loop_config_path))
    if cfg.val_batch_size is not None:
        values["data.val_batch_size"] = cfg.val_batch_size
    if cfg.total_training_steps is not None:
        values["trainer.total_training_steps"] = cfg.total_training_steps
    if rollout_dump_dir:
        values["trainer.rollout_data_dir"] = rollout_dump_dir
    values.update(_algorithm_overrides(cfg))
    if cfg.algorithm == "ppo":
        values["critic.model.path"] = model_path
    values.update(extra or {})
    return [f"{k}={_fmt(v)}" for k, v in values.items()]


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    """Split ``key=value`` overrides back into a mapping (for tests and logging)."""
    return dict(o.split("=", 1) for o in overrides)
