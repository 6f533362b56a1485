"""The RL fine-tuning preset model: data, retriever, protocol, stages (each with its reward and engine settings).

One YAML in ``flows/configs`` per experiment (``research_grpo``, ``r1searcher_two_stage``, ``searchr1_grpo`` and
their ``_cpu_demo`` variants). Stages run in order, each starting from the previous stage's checkpoint, which is
how R1-Searcher's two stages chain. ``engine`` picks TRL (one machine) or verl (GPU workers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from infra.config import StrictModel
from retrieval.open import RetrieverSpec
from training.generation.spec import GeneratorSpec
from training.protocols.base import ProtocolName
from training.rewards.adapters import RewardName
from training.rl.data import DifficultyConfig
from training.rl.engines import ENGINES, EngineName
from training.rl.health import HealthConfig
from training.rl.trl_engine import TRLSearchConfig
from training.rl.verl.config import VerlConfig
from training.sft.config import WarmupConfig


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
    max_new_tokens: int = Field(default=256, ge=8, description="Response budget per trajectory.")
    top_k: int | None = Field(
        default=None, ge=1, description="Documents per search at evaluation (R1-Searcher evaluates with 5, trains with "
        "3); None: the last stage's top-k.")
    normalization: Literal["squad", "r1searcher"] = Field(
        default="squad", description="Answer normalization for EM/F1/cover-EM (r1searcher: the seed's own rule).")
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
    protocol: ProtocolName = Field(description="Tag protocol (research, searchr1, r1searcher, smartsearch, exsearch).")
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
        if engine and engine.remote_search and not self.retrieval.url:
            errors.append(f"engine={self.engine} searches from its GPU workers over HTTP: set retrieval.url (start "
                          "one with `searchloop serve retriever --index <dir>`)")
        if errors:
            raise ValueError("; ".join(errors))
        return self


def resolve_model(model: str) -> str:
    """A local HF folder for ``model`` (name such as ``smollm2``, folder or GGUF; see ``training.generation.models``).

    Hub ids (``org/name``) that are not local pass through unchanged: verl workers download them themselves.
    """
    from infra.errors import ConfigError
    from training.generation.models import resolve_model as resolve_local

    try:
        return str(resolve_local(model))
    except ConfigError:
        if model.count("/") == 1 and not Path(model).exists() and not model.startswith("models:/"):
            return model
        raise
