"""SmartSearch curriculum settings: the judge/refiner endpoint, the stage-1 screen, stage-2 DPO and stage-3 GRPO.

A leaf: imports only other config models and infra. One YAML per experiment in ``flows/configs``
(``smartsearch_cpu_demo``, ``smartsearch_paper``); ``a.b=value`` overrides from the CLI.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from infra.config import StrictModel, config_hash
from retrieval.config import RetrieverSpec
from training.refs import QuestionSource
from training.rl.config import TRLSearchConfig
from training.rl.engines import ENGINES, EngineName
from training.rl.verl.config import VerlConfig
from training.sft.config import SFTConfig, WarmupConfig


class EndpointSpec(StrictModel):
    """An OpenAI-compatible endpoint for the judge and the refiner: a URL, or our generation server started by the
    flow over ``serve_model`` (stopped when the flow ends).

    Any server, its own format: in ``chat`` mode (the default for a URL) the server applies *its* chat template to
    the messages and the request names *its* model (``model: null`` asks ``GET /models``), with the judge's and the
    refiner's reply budgets (the seed: 2048 tokens each) and, for Qwen3-style servers, the seed's non-thinking
    switch (``enable_thinking: false`` -> ``chat_template_kwargs``). ``completions`` mode (the default when the flow
    serves its own small model) renders our local tokenizer's template plus a response prefix."""

    base_url: str | None = Field(default=None, description="OpenAI-compatible base URL ending in /v1 (vLLM, ours).")
    model: str | None = Field(
        default=None, description="Model name the server serves (the `model` request field); None = the first id "
        "of the server's GET /models (a served model is started under `serve_model`'s folder name).")
    serve_model: str | None = Field(
        default=None, description="Start our generation server over this model (name/folder) when base_url is None.")
    api_key_env: str | None = Field(
        default=None, description="Environment variable holding the bearer token (the token never enters records).")
    mode: Literal["auto", "chat", "completions"] = Field(
        default="auto", description="chat: messages, the server's own chat template; completions: the prompt "
        "rendered with `tokenizer`'s chat template + the response prefix (lets small judges start right at the "
        "verdict); auto: completions when the flow serves its own model (serve_model, no base_url), chat otherwise.")
    enable_thinking: bool | None = Field(
        default=None, description="Qwen3-style thinking switch, sent as chat_template_kwargs.enable_thinking "
        "(false = the seed's non-thinking judge/refiner, which it forces with an empty <think></think>); None = "
        "not sent (servers that reject unknown fields).")
    serve_max_tokens: int | None = Field(
        default=None, ge=1, description="Reply cap used only while the flow serves its own model (a 135M judge "
        "needs a few tokens; 2048 on CPU take minutes); None = the judge's/refiner's max_tokens.")
    tokenizer: str | None = Field(
        default=None, description="Local model/tokenizer for completions mode (default: serve_model or model).")
    timeout_s: float = Field(default=120.0, gt=0, description="Per-request timeout (httpx).")
    retries: int = Field(default=3, ge=1, description="Attempts per request on transport errors, 429 and 5xx.")
    concurrency: int = Field(default=8, ge=1, description="Requests in flight.")
    startup_timeout_s: float = Field(default=600.0, gt=0, description="Wait for a started server's /health.")

    @model_validator(mode="after")
    def _one_source(self) -> EndpointSpec:
        if not self.base_url and not self.serve_model:
            raise ValueError("endpoint needs base_url (an OpenAI-compatible /v1 URL) or serve_model (a model our "
                             "generation server should serve)")
        return self

    @property
    def served(self) -> bool:
        """True when the flow starts its own server (serve_model set, no base_url)."""
        return not self.base_url and bool(self.serve_model)

    def resolved_mode(self) -> Literal["chat", "completions"]:
        """``mode`` with ``auto`` resolved (completions for our own served model, chat for any URL)."""
        if self.mode != "auto":
            return self.mode
        return "completions" if self.served else "chat"

    def served_name(self) -> str:
        """The name our generation server serves ``serve_model`` under."""
        from pathlib import PurePath

        return self.model or PurePath(str(self.serve_model)).name or "judge"

    def reply_budget(self, max_tokens: int) -> int:
        """Tokens per reply: ``max_tokens``, capped by ``serve_max_tokens`` while our own model is served."""
        return min(max_tokens, self.serve_max_tokens) if self.served and self.serve_max_tokens else max_tokens


class JudgeSpec(StrictModel):
    """The usefulness judge (model-level process reward), or its deterministic gold-informed stand-in."""

    kind: Literal["model", "rule"] = Field(
        default="model", description="model: the seed's LLM judge over the endpoint; rule: a deterministic "
        "stand-in, NOT the seed's judge: a round is useful when its retrieved documents contain a gold answer or a "
        "gold supporting paragraph (training.smartsearch.judge.RuleJudge).")
    template_file: str | None = Field(default=None, description="Own prompt template (str.format fields: question, "
                                      "golden_answers, process); None = ours.")
    response_prefix: str = Field(default="", description="Text the judge's answer starts with (completions mode; "
                                 "e.g. `<answer>` so a small judge writes the verdict first).")
    temperature: float = Field(default=0.6, ge=0, description="Sampling temperature (the seed: 0.6).")
    max_tokens: int = Field(default=2048, ge=1, description="Tokens per verdict (the seed: 2048).")
    max_redundancy: int = Field(default=1, ge=0, description="A round is redundant above this many repeated docs.")


class RefinerSpec(StrictModel):
    """The query refiner (same endpoint as the judge), or its deterministic gold-informed stand-in."""

    kind: Literal["model", "rule"] = Field(
        default="model", description="model: the seed's LLM refiner over the endpoint; rule: a deterministic "
        "stand-in, NOT the seed's refiner: the title of the first gold supporting paragraph not retrieved before "
        "the round, else the question (training.smartsearch.refine.rule_refinements).")
    template_file: str | None = Field(default=None, description="Own prompt template (fields: question, process, "
                                      "issues); None = ours.")
    response_prefix: str = Field(default="", description="Text the refiner's answer starts with (completions mode).")
    temperature: float = Field(default=0.6, ge=0, description="Sampling temperature (the seed: 0.6).")
    max_tokens: int = Field(default=2048, ge=1, description="Tokens per refinement (the seed: 2048).")


class LoopSpec(StrictModel):
    """SmartSearch's settings for verl's agent loop (``training.smartsearch.verl_loop``), rendered into the
    ``agent_loop_config_path`` YAML: endpoint settings only, never a token (``endpoint.api_key_env`` names the
    environment variable the workers read it from)."""

    endpoint: EndpointSpec = Field(description="Judge/refiner endpoint; base_url must be reachable from the workers.")
    judge: JudgeSpec = Field(default_factory=JudgeSpec, description="Usefulness judge.")
    refiner: RefinerSpec = Field(default_factory=RefinerSpec, description="Query refiner.")
    branch: bool = Field(default=True, description="Refinement branches inside each group.")
    judge_reward: bool = Field(default=True, description="Report the judge's per-round verdicts to the reward.")
    max_length_diff: int = Field(default=50, ge=1, description="Skip a refined prefix whose token length differs "
                                 "from the original prefix by this many tokens or more (seed 50).")

    @model_validator(mode="after")
    def _reachable(self) -> LoopSpec:
        if not self.endpoint.base_url and "model" in (self.judge.kind, self.refiner.kind):
            raise ValueError("verl's agent loop needs endpoint.base_url (a judge server the GPU workers reach); "
                             "endpoint.serve_model only starts a server on the flow's machine")
        return self


class SamplingSpec(StrictModel):
    """How a stage samples trajectories from a policy."""

    n: int = Field(default=1, ge=1, description="Samples per question.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")
    max_tokens_per_turn: int = Field(default=256, ge=1, description="New tokens per generation step.")
    max_total_tokens: int = Field(default=1024, ge=1, description="Generated tokens per trajectory.")
    seed: int = Field(default=0, description="Sampling seed.")


class ScreenSpec(StrictModel):
    """Stage 1: which sampled trajectories are kept for SFT (the seed: all four rules, F1 >= 0.8)."""

    min_f1: float = Field(default=0.8, ge=0, le=1, description="Outcome F1 of the last \\boxed{} (seed 0.8).")
    require_format: bool = Field(default=True, description="ReSearch-style validator must pass.")
    failed_verdict: Literal["drop", "keep"] = Field(
        default="drop", description="A round whose judge call failed: drop the trajectory (the seed: score != '1') "
        "or treat it as good.")


class Stage1Spec(StrictModel):
    """Stage 1, screened imitation: sample, screen, SFT."""

    questions: list[QuestionSource] = Field(description="Training questions to sample on.")
    policy: str | None = Field(default=None, description="Sampling policy (None = the experiment's model).")
    policy_warmup_steps: int = Field(
        default=0, ge=0, description="0 = sample with `policy` as it is (the seed, whose sampling policy is a strong "
        "model). N > 0 = a stand-in for that strong policy where only a small model is at hand (NOT the seed): the "
        "scripted teacher trajectories are screened first, `model` is fine-tuned N steps on the kept ones (the "
        "`sft` settings, max_steps = N) and the policy's samples come from that checkpoint, so they search and "
        "their rounds reach the judge. The stage's own SFT still starts from `model`. Needs `teacher`.")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="Sampling settings.")
    teacher: WarmupConfig | None = Field(
        default=None, description="Scripted strong-policy trajectories (decompositions/FireAct rendered by the "
        "rollout engine) added to the sampled pool and screened by the same rules; stands in for the seed's strong "
        "sampling model where none is served.")
    screen: ScreenSpec = Field(default_factory=ScreenSpec, description="Screening rules.")
    mask_retrieved: bool = Field(
        default=False, description="Mask retrieved text from the SFT loss. The seed trains on the whole turn (its "
        "LLaMA-Factory alpaca `output` holds the <result> blocks), so the default follows it; retrieved text is "
        "masked in GRPO either way.")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="LLaMA-Factory SFT settings.")

    @model_validator(mode="after")
    def _warmup_needs_teacher(self) -> Stage1Spec:
        if self.policy_warmup_steps and self.teacher is None:
            raise ValueError("stage1.policy_warmup_steps fine-tunes the policy on the teacher trajectories: set "
                             "stage1.teacher, or policy_warmup_steps: 0")
        return self


class DPOSpec(StrictModel):
    """LoRA DPO settings (TRL DPOTrainer; the seed: LLaMA-Factory qwen_lora_dpo.yaml)."""

    beta: float = Field(default=0.1, gt=0, description="pref_beta.")
    loss_type: Literal["sigmoid", "ipo", "hinge"] = Field(default="sigmoid", description="DPO loss.")
    learning_rate: float = Field(default=7e-6, gt=0, description="Learning rate.")
    warmup_ratio: float = Field(
        default=0.1, ge=0, lt=1, description="Share of the steps with a rising learning rate (seed 0.1; a 2-step run "
        "with 0.1 spends its first step at learning rate 0, so its second step still logs margin 0).")
    num_train_epochs: float = Field(default=3.0, gt=0, description="Epochs (ignored when max_steps > 0).")
    max_steps: int = Field(default=-1, description="Optimizer steps (-1 = epochs).")
    per_device_train_batch_size: int = Field(default=1, ge=1, description="Pairs per micro-batch.")
    gradient_accumulation_steps: int = Field(default=8, ge=1, description="Micro-batches per step.")
    lora_rank: int = Field(default=8, ge=1, description="LoRA rank (all linear modules).")
    lora_alpha: int = Field(default=16, ge=1, description="LoRA alpha.")
    max_length: int = Field(default=10000, ge=16, description="Prompt + response token cutoff (seed 10000).")
    seed: int = Field(default=42, description="Trainer seed.")


class Stage2Spec(StrictModel):
    """Stage 2, query alignment: sample with the SFT model, refine + regenerate, build pairs, LoRA DPO, merge."""

    questions: list[QuestionSource] = Field(description="Training questions.")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="Sampling of originals + regenerations.")
    regenerations: int = Field(default=1, ge=1, description="Continuations per refined prefix.")
    min_f1: float = Field(default=0.8, ge=0, le=1, description="Correctness threshold of the pair rules.")
    dpo: DPOSpec = Field(default_factory=DPOSpec, description="DPO engine settings.")


class Stage3Spec(StrictModel):
    """Stage 3, query-aware GRPO: the SmartSearch reward with the judge, refinement branches in each group."""

    questions: list[QuestionSource] = Field(description="Training questions.")
    engine: EngineName = Field(  # type: ignore[valid-type]
        default="trl", description="A name in training.rl.engines.ENGINES: trl (this machine), verl (GPU workers).")
    max_turns: int = Field(default=5, ge=1, description="Generation passes per trajectory (seed 5).")
    branch: bool = Field(default=True, description="Refinement branches inside each group (the seed's rollout).")
    max_length_diff: int = Field(default=50, ge=1, description="Skip a refined prefix whose token length differs "
                                 "from the original prefix by this many tokens or more (seed 50).")
    judge_reward: bool = Field(default=True, description="The judge as a round scorer of the reward.")
    trl: TRLSearchConfig | None = Field(default=None, description="TRL GRPO settings (engine=trl).")
    verl: VerlConfig | None = Field(default=None, description="verl settings (engine=verl).")

    @model_validator(mode="after")
    def _engine_settings(self) -> Stage3Spec:
        section = ENGINES[self.engine].settings
        if section and getattr(self, section, None) is None:
            raise ValueError(f"stage3.engine={self.engine} needs a `stage3.{section}:` section")
        return self


class EvalSpec(StrictModel):
    """Held-out evaluation of every checkpoint (greedy)."""

    benchmarks: list[str] = Field(default_factory=list, description="Held-out question files / benchmark names.")
    limit: int | None = Field(default=None, ge=1, description="Questions per benchmark.")
    max_new_tokens: int = Field(default=512, ge=8, description="Response budget per trajectory.")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Bootstrap interval mass.")


class SmartSearchConfig(StrictModel):
    """A SmartSearch curriculum experiment: SFT -> DPO -> GRPO."""

    name: str = Field(description="Experiment name (MLflow run name prefix, registered model names).")
    model: str = Field(description="Initial policy: HF folder or a name under the model cache (smollm2).")
    template: Literal["instruct", "base"] = Field(default="instruct", description="Prompt template kind.")
    retrieval: RetrieverSpec = Field(
        default_factory=lambda: RetrieverSpec(corpus=["data/corpus/mini.jsonl"]),
        description="Retriever (called directly): url | index (any backend, in process) | corpus (BM25 in memory).")
    top_k: int = Field(default=3, ge=1, description="Documents per search.")
    endpoint: EndpointSpec = Field(description="Judge and refiner endpoint.")
    judge: JudgeSpec = Field(default_factory=JudgeSpec, description="Usefulness judge.")
    refiner: RefinerSpec = Field(default_factory=RefinerSpec, description="Query refiner.")
    stage1: Stage1Spec = Field(description="Screened SFT.")
    stage2: Stage2Spec = Field(description="DPO on refined-vs-original pairs.")
    stage3: Stage3Spec = Field(description="Query-aware GRPO.")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="Held-out evaluation.")
    register_models: bool = Field(default=True, description="Register each stage's checkpoint in MLflow.")
    verl_python: str = Field(default="python", description="Interpreter of the verl environment (GPU workers).")

    def key(self) -> str:
        """Short hash of the preset + overrides (its experiment directory, ``infra.paths.experiment_root``);
        endpoint URLs and timeouts are left out (a restarted judge server gets a new port)."""
        data = self.model_dump(mode="json")
        data["endpoint"] = {k: v for k, v in data["endpoint"].items()
                            if k not in {"base_url", "timeout_s", "startup_timeout_s"}}
        return config_hash(data)[:10]
