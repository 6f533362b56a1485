"""The RL fine-tuning preset model: data, retriever, protocol, stages (each with its reward and engine settings).

One YAML in ``flows/configs`` per experiment (``research_grpo``, ``r1searcher_two_stage``, ``searchr1_grpo`` and
their ``_cpu_demo`` variants). Stages run in order, each starting from the previous stage's checkpoint, which is
how R1-Searcher's two stages chain. ``engine`` picks TRL (one machine) or verl (GPU workers).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from evaluation.normalize import NormalizationName
from infra.config import StrictModel, config_hash
from retrieval.config import RetrieverSpec
from training.agent.config import AlarmConfig
from training.generation.config import GeneratorSpec
from training.protocols.registry import ProtocolName, protocol_class
from training.rewards.registry import RewardName
from training.rl.engines import ENGINES, EngineName
from training.rl.verl.config import VerlConfig
from training.sft.config import WarmupConfig


class TRLSearchConfig(StrictModel):
    """GRPO settings for the TRL engine (one machine; CPU or one GPU)."""

    algorithm: Literal["grpo", "dr_grpo", "bnpo"] = Field(
        default="grpo", description="TRL loss_type (grpo: per-sequence mean; dr_grpo: no length bias).")
    num_generations: int = Field(default=4, ge=2, description="Rollouts per prompt (group size).")
    prompts_per_step: int = Field(default=2, ge=1, description="Distinct prompts per optimizer step.")
    learning_rate: float = Field(default=1e-6, gt=0, description="AdamW learning rate.")
    beta: float = Field(default=0.001, ge=0, description="KL coefficient to the reference model (0: no ref).")
    epsilon: float = Field(default=0.2, gt=0, description="PPO clip range.")
    scale_rewards: Literal["group", "batch", "none"] = Field(default="group", description="Advantage scaling.")
    max_steps: int = Field(default=10, ge=1, description="Optimizer steps.")
    max_completion_length: int = Field(default=512, ge=8, description="Generated-token budget per trajectory.")
    max_tokens_per_turn: int | None = Field(
        default=128, ge=1, description="New tokens per generation step of a rollout; None = no per-step cap of "
        "ours: the protocol's (ReSearch, like its seed: none, each step may use the whole remaining budget).")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature of rollouts.")
    save_steps: int = Field(default=5, ge=1, description="Checkpoint every N steps (resume picks the latest).")
    save_total_limit: int = Field(default=2, ge=1, description="Checkpoints kept.")
    logging_steps: int = Field(default=1, ge=1, description="Log every N steps.")
    seed: int = Field(default=0, description="Trainer seed.")
    gradient_checkpointing: bool = Field(default=False, description="Activation checkpointing.")
    lora_rank: int | None = Field(
        default=None, ge=1, description="Train LoRA adapters of this rank on every linear layer (None: full "
        "fine-tune). With beta > 0 the reference is the policy with its adapters disabled (no model copy).")
    lora_layers: int | None = Field(
        default=None, ge=1, description="With lora_rank: adapters on the top N decoder layers only (peft "
        "layers_to_transform), so the loss's backward pass stops at the lowest adapted layer and the layers below "
        "keep no activations for it. None: every layer.")
    lora_alpha: int = Field(default=32, ge=1, description="LoRA scaling numerator (with lora_rank).")
    lora_dropout: float = Field(default=0.0, ge=0, lt=1, description="LoRA dropout (with lora_rank).")
    precision: Literal["fp32", "bf16", "auto"] = Field(
        default="fp32", description="bf16: autocast the policy's forward/backward and the rollouts to bfloat16; "
        "only where the hardware has native bf16 (CPU flags avx512_bf16/amx_bf16, or a bf16 GPU), else an error. "
        "auto: bf16 where the hardware has native bf16, fp32 elsewhere (the demo's setting).")
    resample_flat_groups: int = Field(
        default=0, ge=0, description="Dynamic sampling (DAPO): per step, roll out up to this many extra training "
        "prompts' groups to replace groups whose rollouts all earned the same reward (zero advantage, no gradient); "
        "0: off. Every rollout, replaced or kept, goes to the stage's rollout records.")
    resample_ahead: int = Field(
        default=0, ge=0, description="At most resample_flat_groups: this many of dynamic sampling's extra groups "
        "are drawn before the step's rollout and rolled out in the same call (one batch), and when flat groups are "
        "left after them the rest of the allowance goes in one more call; the same candidates in the same order as "
        "one at a time. 0: one extra group per rollout call, drawn when a flat group needs it.")
    micro_batch_size: int | None = Field(
        default=None, ge=1, description="Completions per forward/backward (gradient accumulation over the step's "
        "prompts_per_step x num_generations); None = the whole step at once. Bounds training memory: 16 ReSearch "
        "completions in one batch reached 16.5 GB RSS on CPU.")
    loss_token_budget: int | None = Field(
        default=None, ge=1, description="Tokens per forward/backward of the loss (rows x the part's padded prompt + "
        "completion width): a micro-batch over it is cut into parts of similar length, each trimmed of its padding, "
        "whose losses are weighted by their share of the micro-batch and back-propagated in turn, so the gradient is "
        "the micro-batch's (up to float order) and the loss's activations are bounded by tokens, not rows. None: the "
        "micro-batch in one forward/backward.")
    share_prompt: bool = Field(
        default=False, description="Forward each distinct prompt of a loss micro-batch once and its completions on "
        "its key/value cache (training/rl/shared_prompt.py; the same log-probs and gradient up to float order), with "
        "the step's rows put in micro-batches one prompt at a time (loss types grpo and dr_grpo; bnpo keeps TRL's "
        "order). False: TRL's forward of every row's prompt + completion.")
    loss_attention: Literal["model", "grouped"] = Field(
        default="model", description="Attention of the loss's forward/backward. model: the model's own (sdpa). "
        "grouped: training.generation.attention.grouped_attention (plain matrix products, the query heads of a "
        "key/value head as one product) where the model runs sdpa on CPU; the same values up to float order, and "
        "PyTorch's CPU flash-attention backward is avoided. Elsewhere nothing changes.")

    @model_validator(mode="after")
    def _micro_batch_divides_the_step(self) -> TRLSearchConfig:
        step = self.prompts_per_step * self.num_generations
        if self.micro_batch_size is not None and step % self.micro_batch_size:
            raise ValueError(f"micro_batch_size={self.micro_batch_size} must divide prompts_per_step x "
                             f"num_generations = {step}")
        return self

    @model_validator(mode="after")
    def _lora_layers_need_lora(self) -> TRLSearchConfig:
        if self.lora_layers is not None and self.lora_rank is None:
            raise ValueError(f"lora_layers={self.lora_layers} puts LoRA adapters on the top layers, but lora_rank is "
                             "unset (a full fine-tune): set lora_rank, or lora_layers to null")
        return self

    @model_validator(mode="after")
    def _resample_ahead_within_the_allowance(self) -> TRLSearchConfig:
        if self.resample_ahead > self.resample_flat_groups:
            raise ValueError(f"resample_ahead={self.resample_ahead} rolls out more extra groups ahead than dynamic "
                             f"sampling may use (resample_flat_groups={self.resample_flat_groups}): set "
                             "resample_ahead at most resample_flat_groups, or 0")
        return self

    @model_validator(mode="after")
    def _shared_prompt_needs_the_cache(self) -> TRLSearchConfig:
        if self.share_prompt and self.gradient_checkpointing:
            raise ValueError("share_prompt forwards completions on the prompt's key/value cache, which transformers "
                             "turns off under gradient_checkpointing: set one of them to false")
        return self


class HealthConfig(AlarmConfig):
    """Thresholds of the health checks (None disables a check) and of the alarms (``AlarmConfig``'s fields:
    ``search_collapse_ratio``, ``search_baseline_steps``, ``max_copied_share``, ``max_answer_share``,
    ``min_answer_questions``, ``stop_on``)."""

    window: int = Field(default=5, ge=1, description="Consecutive steps a collapse condition must hold.")
    min_reward_std: float | None = Field(
        default=None, ge=0, description="Collapse if the reward's std over the window is below this (None: off).")
    max_format_failure_rate: float | None = Field(
        default=0.98, ge=0, le=1, description="Collapse if format failures stay above this for the window.")
    min_response_length: float | None = Field(
        default=2.0, ge=0, description="Collapse if mean response length (tokens) stays below this.")
    min_entropy: float | None = Field(default=0.01, ge=0, description="Collapse if entropy stays below this.")
    max_kl: float | None = Field(default=10.0, gt=0, description="Stop if KL exceeds this on any step.")
    stop_on_nan: bool = Field(default=True, description="Stop on a NaN/inf loss, reward, KL or grad norm.")
    warmup_steps: int = Field(default=0, ge=0, description="Steps ignored by the collapse checks.")


class DifficultyConfig(StrictModel):
    """Difficulty bucketing by rollouts-to-first-correct (R1-Searcher: easy < 10, medium 10-20, difficult > 20)."""

    easy_below: int = Field(default=10, ge=1, description="First correct rollout index (1-based) below this: easy.")
    difficult_above: int = Field(default=20, ge=1, description="Index above this (or never correct): difficult.")
    unsolved: Literal["difficult", "drop"] = Field(
        default="difficult", description="Questions never answered within the budget: count as difficult or drop.")
    ratio: dict[str, float] = Field(
        default_factory=lambda: {"easy": 0.0, "medium": 0.5, "difficult": 0.5},
        description="Mixing ratio per bucket (normalised); R1-Searcher trains on medium + difficult.")
    total: int | None = Field(default=None, ge=1, description="Questions in the mixed set; None = as many as fit.")
    seed: int = Field(default=0, description="Sampling seed for the mix.")


class DataSpec(StrictModel):
    """Question sets for training and validation (jsonl files of Question rows; repo-relative paths allowed)."""

    train: list[str] = Field(description="Training question files.")
    val: list[str] = Field(default_factory=list, description="Validation question files (verl in-training eval).")
    train_limit: int | None = Field(default=None, ge=1, description="Use only the first N training questions.")
    val_limit: int | None = Field(default=None, ge=1, description="Use only the first N validation questions.")


class StageSpec(StrictModel):
    """One training stage: reward, turn/top-k limits and the engine's settings."""

    name: str = Field(description="Stage name (stage1, stage2, grpo...).")
    reward: RewardName = Field(
        description="Reward name in training.rewards (research, r1searcher_stage1, searchr1_em...).")
    reward_options: dict[str, float | int | bool] = Field(
        default_factory=dict, description="Keyword options of the reward's score function, e.g. searchr1_format's "
        "retrieval_score (the seed's bonus for a valid sequence whose retrieved documents hold a gold answer); "
        "checked against the function's signature before training (engine=trl).")
    max_turns: int | None = Field(default=None, ge=1, description="Generation passes per trajectory (None: seed).")
    top_k: int | None = Field(default=None, ge=1, description="Documents per search (None: the preset's top_k).")
    question_stage: int | None = Field(
        default=None, ge=1, description="Train only on the training questions whose metadata.stage equals this "
        "(R1-Searcher ships its 350 stage-1 and 8,148 stage-2 questions in one file); None: every training question.")
    trl: TRLSearchConfig | None = Field(default=None, description="TRL GRPO settings (engine=trl).")
    verl: VerlConfig | None = Field(default=None, description="verl settings (engine=verl).")


class EvalSpec(StrictModel):
    """Evaluation of the trained checkpoint."""

    benchmarks: list[str] = Field(default_factory=list, description="Question files to evaluate on.")
    offset: int = Field(default=0, ge=0, description="Skip the first N questions of each benchmark (the minis are "
                                                     "the first 50 rows of each dev file; 50 keeps them out).")
    limit: int | None = Field(default=None, ge=1, description="Questions per benchmark (after the offset).")
    corpus: str | None = Field(default=None, description="Corpus of the evaluation's in-process BM25 (held-out "
                                                         "questions' paragraphs); None: retrieval.corpus.")
    compare_start: bool = Field(
        default=False, description="Also evaluate the policy RL starts from (after warm-up) on the same questions "
        "with the same greedy settings, and write the paired before/after comparison (training.rl.heldout).")
    start_min_format_ok: float | None = Field(
        default=0.9, ge=0, le=1, description="With compare_start: the share of held-out questions the start policy "
        "must answer in the protocol's format; RL teaches answers, not format, so a warm-up below it is reported "
        "(MLflow tag health.alarm.start_format) and, with start_gate=stop, RL does not start. None: no check.")
    reuse_start: bool = Field(
        default=True, description="With compare_start: reuse the start evaluation an earlier run made of the same "
        "policy (its files' bytes) on the same questions with the same evaluation settings, reward, code, library "
        "versions, machine and threads (training.rl.heldout.start_cache_dir; about 10 minutes for 600 questions on "
        "a 2-core CPU); false: always compute it.")
    isolate_start: bool = Field(
        default=False, description="With compare_start: run the start evaluation in a fresh (spawned) process, so "
        "its heap is gone before training. In one process, the final evaluation after a start evaluation and GRPO "
        "ran 1.4-1.8x slower than the start one (glibc malloc searching a fragmented heap, session 25); with this "
        "switch 1.08x, and GRPO steps 76 s against 99 s (session 26; the learning presets set it). Same rows either "
        "way. Runtime only: not part of the run's key.")
    start_gate: Literal["warn", "stop"] = Field(
        default="warn", description="What a start policy under start_min_format_ok does: warn, or stop the run "
        "before any RL step.")
    curve_every: int | None = Field(
        default=None, ge=1, description="Every N optimizer steps (and at step 0), score the live policy greedily on "
        "curve_questions held-out questions: the held-out learning curve (MLflow heldout_curve/*, curve.png).")
    curve_questions: int = Field(default=30, ge=1, description="Held-out questions of the curve (an even spread).")
    evidence_dir: str | None = Field(
        default=None, description="With compare_start: copy rows, summary and plots here (repo-relative, e.g. "
        "docs/results/learning/searchr1_grpo).")
    split_by: str | None = Field(
        default="metadata.relation", description="With compare_start: also split the held-out F1 change by this "
        "field of the questions (a dotted path; by_group.md in the evidence); questions without it form the group "
        "(none), and none having it means no split. Report only: not part of the run's key.")
    max_new_tokens: int = Field(default=256, ge=8, description="Response budget per trajectory.")
    chunk: int | None = Field(
        default=None, ge=1, description="Held-out questions rolled out together through all their turns "
        "(training.agent.rollout.RolloutConfig.chunk; None: all at once). With generator.prefix_cache_tokens it "
        "bounds the evaluation's memory: 64 with 16,384 tokens held 210 questions at 2.86 GB instead of 4.73, "
        "0.83x the speed, 208/210 answers the same (docs/results/engines/session29).")
    top_k: int | None = Field(
        default=None, ge=1, description="Documents per search at evaluation (R1-Searcher evaluates with 5, trains with "
        "3); None: the last stage's top-k.")
    normalization: NormalizationName | None = Field(  # type: ignore[valid-type]
        default=None, description="Answer normalization for EM/F1/cover-EM (a name in "
        "evaluation.normalize.NORMALIZATIONS); None: the protocol's own rule (SearchProtocol.normalization).")
    generator: GeneratorSpec = Field(
        default_factory=lambda: GeneratorSpec(batch_size=16),
        description="Generation engine of evaluation and difficulty rollouts; its model is the policy evaluated.")


class InitSpec(StrictModel):
    """How the initial policy is made (``model`` is used as is when no step is given)."""

    warmup: WarmupConfig | None = Field(default=None, description="Warm-up SFT on protocol-rendered trajectories.")
    fit_rollout_budget: bool = Field(
        default=True, description="Drop warm-up trajectories a TRL rollout of the first stage could not produce "
        "(a step longer than max_tokens_per_turn, or longer than max_completion_length in all).")


class RLConfig(StrictModel):
    """An RL fine-tuning experiment."""

    name: str = Field(description="Experiment/preset name (MLflow run name prefix, registered model name).")
    engine: EngineName = Field(  # type: ignore[valid-type]
        description="A name in training.rl.engines.ENGINES: trl (one machine), verl (GPU workers, subprocess).")
    model: str = Field(description="Initial policy: HF folder, or a name under the model cache.")
    init: InitSpec = Field(
        default_factory=InitSpec, description="Steps that make the initial policy from `model` (warm-up SFT).")
    protocol: ProtocolName = Field(description="Tag protocol (a key of training.protocols.registry.PROTOCOLS).")
    template: Literal["instruct", "base"] = Field(default="instruct", description="Prompt template kind.")
    data: DataSpec = Field(description="Question sets.")
    retrieval: RetrieverSpec = Field(
        default_factory=lambda: RetrieverSpec(corpus=["data/corpus/mini.jsonl"]),
        description="Retriever used in rollouts, warm-up and evaluation: url | index (any backend, in process) | "
        "corpus (BM25 in memory). verl needs url (its workers search over HTTP).",
    )
    top_k: int = Field(default=3, ge=1, description="Documents per search (a stage may override).")
    difficulty: DifficultyConfig | None = Field(default=None, description="Optional difficulty bucketing + mix.")
    difficulty_rollouts: int = Field(default=8, ge=1, description="Rollouts per question for difficulty estimation.")
    stages: list[StageSpec] = Field(
        min_length=1, description="Training stages, chained in order (YAML: a mapping stage name -> settings).")
    health: HealthConfig = Field(default_factory=HealthConfig, description="Training-health thresholds.")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="Evaluation after training.")
    register_model: bool = Field(default=True, description="Register the final checkpoint as an MLflow model version.")
    verl_python: str = Field(default="python", description="Interpreter of the verl environment (GPU workers).")

    @model_validator(mode="before")
    @classmethod
    def _stages_by_name(cls, data: Any) -> Any:
        """Presets write ``stages`` as a mapping name -> settings (so ``stages.<name>.trl.max_steps=3`` overrides
        work); it becomes the ordered list of :class:`StageSpec`."""
        if isinstance(data, dict) and isinstance(data.get("stages"), dict):
            data = {**data, "stages": [{"name": k, **(v or {})} for k, v in data["stages"].items()]}
        return data

    def stage_top_k(self, stage: StageSpec) -> int:
        """Documents per search in ``stage``: the stage's ``top_k``, else the preset's (the one place this is
        decided; rollouts, warm-up, verl's tool and agent loop all read it)."""
        return stage.top_k or self.top_k

    def key(self) -> str:
        """Short hash of the preset + overrides (its experiment directory, ``infra.paths.experiment_root``); the
        warm-up SFT's ``timeout_s``, the report-only ``eval.split_by`` and the process layout ``eval.isolate_start``
        are left out, so a re-run may change them and still reuse the directory; so is an unset
        ``loss_token_budget``, ``lora_layers`` or ``eval.chunk``, an off ``share_prompt``, a zero ``resample_ahead``
        and the model's own ``loss_attention`` (an unset
        ``prefix_cache_tokens`` is left out of every generator spec's dump)."""
        data = self.model_dump(mode="json")
        for runtime_only in ("split_by", "isolate_start"):  # report / process layout only: the run is reused
            data["eval"].pop(runtime_only, None)
        if data["init"].get("warmup"):
            data["init"]["warmup"]["sft"].pop("timeout_s", None)
        if data["eval"].get("chunk", 0) is None:  # unset, these leave the keys of earlier runs unchanged
            del data["eval"]["chunk"]
        for stage in data["stages"]:  # unset, it leaves the keys of the runs from before it existed unchanged
            if (stage.get("trl") or {}).get("loss_token_budget", 0) is None:
                del stage["trl"]["loss_token_budget"]
            if (stage.get("trl") or {}).get("share_prompt") is False:
                del stage["trl"]["share_prompt"]
            if (stage.get("trl") or {}).get("resample_ahead") == 0:
                del stage["trl"]["resample_ahead"]
            if (stage.get("trl") or {}).get("loss_attention") == "model":
                del stage["trl"]["loss_attention"]
            if (stage.get("trl") or {}).get("lora_layers", 0) is None:
                del stage["trl"]["lora_layers"]
        return config_hash(data)[:10]

    def eval_normalization(self) -> str:
        """Answer normalization at evaluation: ``eval.normalization``, else the protocol's own rule (the protocol
        class is imported by name, so this module stays a leaf)."""
        return self.eval.normalization or protocol_class(self.protocol).normalization

    def eval_top_k(self) -> int:
        """Documents per search at evaluation: ``eval.top_k``, else the last stage's."""
        return self.eval.top_k or self.stage_top_k(self.stages[-1])

    @model_validator(mode="after")
    def _engine_settings(self) -> RLConfig:
        errors = []
        engine = ENGINES.get(self.engine)  # None: already reported by the field check
        section = engine.settings if engine else None
        missing = [s.name for s in self.stages if section and getattr(s, section, None) is None]
        if missing:
            errors.append(f"engine={self.engine} but stage(s) {missing} have no `{section}:` section")
        by_stage = [s.name for s in self.stages if s.question_stage is not None]
        if by_stage and self.difficulty is not None:
            errors.append(f"stage(s) {by_stage} pick their questions by metadata.stage and `difficulty` re-buckets "
                          "them with the policy: set one of the two (difficulty: null follows the seed)")
        if self.eval.offset and not self.eval.compare_start:
            errors.append("eval.offset is read by the held-out comparison only: set eval.compare_start=true")
        if self.eval.compare_start and not self.eval.benchmarks:
            errors.append("eval.compare_start needs eval.benchmarks (the held-out questions)")
        with_options = [s.name for s in self.stages if s.reward_options]
        if with_options and self.engine != "trl":
            errors.append(f"stage(s) {with_options} set reward_options, which only engine=trl passes to the reward "
                          "(verl's reward entry takes the seed defaults): remove them or use engine=trl")
        if engine and engine.remote_search and not self.retrieval.url:
            errors.append(f"engine={self.engine} searches from its GPU workers over HTTP: set retrieval.url (start "
                          "one with `searchloop serve retriever --index <dir>`)")
        if errors:
            raise ValueError("; ".join(errors))
        return self

