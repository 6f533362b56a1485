"""Configuration of the ExSearch EM loop (``flows/configs/exsearch_*.yaml``): data, retriever, warm-up, E-step,
M-step, evaluation and promotion. Consumed by ``training.em.stages`` (stage functions) and ``flows.em_loop``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from infra.config import StrictModel, config_hash
from infra.errors import ConfigError
from retrieval.config import RetrieverSpec
from training.agent.config import HeldoutSpec, RolloutConfig
from training.generation.config import GeneratorSpec
from training.refs import QuestionSource
from training.sft.config import SFTConfig, WarmupConfig

Method = Literal["importance", "reward", "rejection", "exsearch_released_buggy"]


class ScoringConfig(StrictModel):
    """How trajectories are scored in the E-step."""

    tokens: Literal["answer", "trajectory"] = Field(
        default="answer",
        description="`answer`: score log p(y*|x,z) only (the importance weight of a self-sampled z; default). "
        "`trajectory`: every assistant turn, log p(z,y*|x) (released ExSearch; ablation only).",
    )
    batch_tokens: int = Field(default=4096, ge=64, description="Token budget per forward batch (padded B x T).")
    max_length: int = Field(default=4096, ge=16, description="Longer sequences are not scored (NaN, then dropped).")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(default="float32", description="Model dtype.")


class SelectionConfig(StrictModel):
    """How E-step weights are computed from scored trajectories."""

    method: Method = Field(default="importance", description="Weighting method (see module docstring).")
    temperature: float = Field(default=1.0, gt=0, description="tau in softmax(L_i / tau) for `importance`.")
    score: Literal["sum", "mean"] = Field(
        default="sum",
        description="L_i = summed log-prob of the supervised tokens (`sum`) or its per-token mean (`mean`).",
    )
    drop_single: bool = Field(default=True, description="Drop questions with a single finite-scored trajectory.")
    drop_all_equal: bool = Field(
        default=False, description="Drop questions whose finite scores are all equal (within `equal_tol`)."
    )
    equal_tol: float = Field(default=1e-9, ge=0, description="Tolerance for the all-equal test.")
    correct_threshold: float = Field(
        default=1.0, ge=0, le=1, description="`rejection`: a trajectory is correct when its `correct` score >= this."
    )
    max_empty_facts: int | None = Field(
        default=2, ge=0, description="Drop trajectories with more empty <FACT> steps than this (the released "
        "ExSearch entropy step: more than 2); None keeps them.")


class SamplingSettings(StrictModel):
    """E-step sampling: K trajectories per training question from the current checkpoint."""

    questions: list[QuestionSource] = Field(default_factory=list, description="Training questions to sample.")
    generator: GeneratorSpec = Field(
        default_factory=lambda: GeneratorSpec(batch_size=16),
        description="Generation engine (backend, batch, dtype...); its model is the current checkpoint.")
    rollout: RolloutConfig = Field(
        default_factory=lambda: RolloutConfig(n=4, temperature=0.8, top_p=0.95),
        description="K (=n), temperature, top_p, per-step best-of and limits.",
    )
    timeout_s: int = Field(default=7200, ge=10, description="Prefect timeout of the sampling task.")


class EvaluationSettings(StrictModel):
    """Held-out evaluation after each iteration (greedy rollouts, EM/F1 with bootstrap intervals)."""

    questions: list[QuestionSource] = Field(default_factory=list, description="Held-out questions.")
    generator: GeneratorSpec = Field(
        default_factory=lambda: GeneratorSpec(batch_size=16),
        description="Generation engine (backend, batch, dtype...); its model is the checkpoint evaluated.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Greedy by default (temperature 0).")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Bootstrap interval mass.")
    n_resamples: int = Field(default=1000, ge=10, description="Bootstrap resamples.")
    timeout_s: int = Field(default=7200, ge=10, description="Prefect timeout of the evaluation task.")


class LearningSettings(StrictModel):
    """Learning evidence: greedy evaluation of the warm-up (EM start) and every later checkpoint on a held-out set
    that no stage trains on (``training.agent.heldout``), with a paired start-vs-final report."""

    heldout: HeldoutSpec = Field(default_factory=HeldoutSpec, description="Held-out dev questions.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Greedy rollout limits (temperature 0).")
    batch_size: int = Field(default=32, ge=1, description="Prompts per generate call (transformers).")
    every_iteration: bool = Field(default=True, description="Evaluate after every iteration (else start and final).")
    evidence_dir: str | None = Field(default=None, description="Also copy the evidence here (repo-relative ok).")
    recipe: str = Field(default="exsearch_em", description="Recipe name in the summary.")
    split_by: str | None = Field(
        default="metadata.relation", description="Also split the held-out F1 change by this field of the questions "
        "(a dotted path; by_group.md in the evidence); none having it means no split. Report only: not in the key.")
    n_resamples: int = Field(default=10000, ge=10, description="Paired bootstrap resamples.")


class EMLoopConfig(StrictModel):
    """The ExSearch EM loop: warm-up SFT, then N x (sample, score, select, weighted train, evaluate)."""

    experiment: str = Field(default="exsearch-em", description="Experiment name (MLflow experiment, run dir).")
    protocol: Literal["exsearch"] = Field(
        default="exsearch", description="Chat protocol (document turns are user turns, so the engine masks them)."
    )
    base_model: str = Field(default="smollm2", description="Model name/path resolved by training.generation.models.")
    registered_model: str = Field(default="exsearch-em", description="MLflow registered model name.")
    iterations: int = Field(default=2, ge=1, description="EM iterations after the warm-up.")
    early_stop_drops: int = Field(default=2, ge=1, description="Stop when held-out F1 falls this many times in a row.")
    retrieval: RetrieverSpec = Field(
        default_factory=lambda: RetrieverSpec(corpus=["data/corpus/mini.jsonl", "data/train/corpus_train_mini.jsonl"]),
        description="Retriever for warm-up, sampling and evaluation: url | index (any backend, in process) | corpus "
        "(BM25 in memory). Warm-up gold paragraphs come from the corpus files or the index's passage store.",
    )
    warmup: WarmupConfig = Field(default_factory=WarmupConfig, description="Warm-up data and SFT.")
    sampling: SamplingSettings = Field(default_factory=SamplingSettings, description="E-step sampling.")
    scoring: ScoringConfig = Field(default_factory=ScoringConfig, description="E-step scoring.")
    selection: SelectionConfig = Field(default_factory=SelectionConfig, description="E-step weights.")
    alignment: SFTConfig = Field(default_factory=SFTConfig, description="M-step weighted training settings.")
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings, description="Held-out evaluation.")
    step_timeout_s: int = Field(default=3600, ge=10, description="Prefect timeout of scoring/selection/train tasks.")
    learning: LearningSettings | None = Field(default=None, description="Held-out learning evidence (None: off).")

    @model_validator(mode="after")
    def _check(self) -> EMLoopConfig:
        problems = []
        if not self.sampling.questions:
            problems.append("sampling.questions is empty: list the training question files")
        if not self.evaluation.questions:
            problems.append("evaluation.questions is empty: list the held-out question files")
        if self.sampling.rollout.n < 2 and self.selection.method == "importance" and self.selection.drop_single:
            problems.append("sampling.rollout.n must be >= 2 for importance weights (or set selection.drop_single)")
        if self.warmup.no_search_share:
            problems.append("warmup.no_search_share is read by the RL warm-up only (training.rl.warmup, which "
                            "SmartSearch's teacher shares); the EM loop's warm-up chats always search: remove it")
        if problems:
            raise ConfigError("; ".join(problems))
        return self

    def key(self) -> str:
        """Short hash of everything that shapes the artifacts (same key = same directory = resume). Loop control
        (``iterations``, ``early_stop_drops``) and timeouts are left out, so they can change on a resume."""
        data = self.model_dump(mode="json", exclude={"iterations", "early_stop_drops", "step_timeout_s"})
        if data.get("learning"):
            data["learning"].pop("split_by", None)  # report only
        for section in ("warmup", "sampling", "evaluation"):
            data[section].pop("timeout_s", None)
        for sft in (data["warmup"]["sft"], data["alignment"]):
            sft.pop("timeout_s", None)
        return config_hash(data)[:10]
