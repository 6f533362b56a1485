"""SFT settings (the LLaMA-Factory subset we render) and the warm-up: data sources plus the SFT that trains on them.

A leaf: imports only other config models (``retrieval.open.RetrieverSpec``) and infra. Used by the EM loop
(``warmup``) and RL presets (``init.warmup``), so both spell warm-up the same way.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_serializer

from infra.config import StrictModel
from retrieval.config import RetrieverSpec
from training.refs import QuestionSource


class SFTConfig(StrictModel):
    """LLaMA-Factory SFT/alignment settings (the subset we render; everything else keeps its defaults)."""

    template: str = Field(default="smollm2", description="LLaMA-Factory chat template name for the model family.")
    finetuning_type: Literal["lora", "full"] = Field(default="lora", description="LoRA adapters or full fine-tune.")
    lora_rank: int = Field(default=8, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(default=16, ge=1, description="LoRA alpha.")
    lora_target: str = Field(default="all", description="LoRA target modules (`all` = every linear layer).")
    learning_rate: float = Field(default=1e-4, gt=0, description="Peak learning rate.")
    num_train_epochs: float = Field(default=1.0, gt=0, description="Epochs (ignored when max_steps > 0).")
    max_steps: int = Field(default=-1, description="Stop after this many optimizer steps (-1 = use epochs).")
    lr_scheduler_type: str = Field(default="cosine", description="transformers scheduler name.")
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1, description="Warm-up fraction of the steps.")
    cutoff_len: int = Field(default=1024, ge=16, description="Max tokens per example (longer ones are truncated).")
    per_device_train_batch_size: int = Field(default=2, ge=1, description="Micro-batch size per device.")
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.")
    max_samples: int | None = Field(default=None, ge=1, description="Cap on training examples (None = all).")
    bf16: bool | Literal["auto"] = Field(
        default=False, description="bf16 mixed precision (GPU workers); auto: on where the hardware has native bf16 "
        "(a bf16 GPU, or the CPU flags avx512_bf16/amx_bf16), off elsewhere.")
    gradient_checkpointing: bool = Field(
        default=True, description="Activation checkpointing (LLaMA-Factory's default): recomputes each layer's "
        "forward in the backward pass, about a quarter more compute for less activation memory; off where memory "
        "allows (a 135M LoRA on CPU).")
    deepspeed: Literal["none", "z2", "z3"] = Field(default="none", description="DeepSpeed ZeRO stage on GPU workers.")
    nproc_per_node: int = Field(default=1, ge=1, description="Processes (GPUs) per node; >1 launches torchrun.")
    logging_steps: int = Field(default=1, ge=1, description="Log every N steps.")
    seed: int = Field(default=42, description="Training seed.")
    merge_lora: bool = Field(default=True, description="Merge LoRA into a full checkpoint after training.")
    report_to_mlflow: bool = Field(default=True, description="`report_to: mlflow` (joined to our stage run).")
    timeout_s: int = Field(default=3600, ge=10, description="Kill the training subprocess after this many seconds.")


class LFDatasetSource(StrictModel):
    """A user's own warm-up chats: one dataset registered in a LLaMA-Factory ``dataset_info.json``."""

    dataset_info: str = Field(description="Path of the dataset_info.json (its folder is the dataset_dir).")
    name: str = Field(description="Dataset name (a key of dataset_info.json); alpaca or sharegpt, local file.")
    limit: int | None = Field(default=None, ge=1, description="Use the first N rows (None = all).")


class WarmupConfig(StrictModel):
    """Warm-up trajectories rendered in a protocol's format (decompositions / FireAct) and the SFT on them."""

    decomposition_files: list[QuestionSource] = Field(
        default_factory=list, description="Training questions with decompositions / supporting facts.")
    fireact_file: str | None = Field(default=None, description="FireAct ReAct chats (messages JSONL).")
    fireact_limit: int | None = Field(default=None, ge=1, description="Use the first N FireAct chats.")
    lf_datasets: list[LFDatasetSource] = Field(
        default_factory=list,
        description="Your own warm-up chats as LLaMA-Factory datasets (EM loop; checked by the protocol validator).")
    corpus: list[str] = Field(
        default_factory=list,
        description="Corpora for warm-up retrieval (BM25) and gold paragraphs; empty = the run's retriever.")
    top_k: int | None = Field(
        default=None, ge=1, description="Documents per step (None: the run's top-k; EM: 3, as ExSearch shows).")
    max_fact_words: int | None = Field(
        default=None, ge=1, description="Cut each fact/reasoning step to this many words (fits small budgets).")
    no_search_share: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="RL warm-up (and SmartSearch's teacher, which renders through "
        "it): this share of the decomposition episodes is rendered without a search (the agent answers from the "
        "question alone), chosen by a hash of the question id (the same questions for every seed). The sampled start "
        "policy then searches on only part of its rollouts, and RL has to learn when searching pays; the greedy start "
        "searches on few or on most questions depending on the seed (0.5: 0.00-0.27 on eleven ReSearch/R1-Searcher "
        "seeds, 0.90-0.99 on two; docs/results/learning, sessions 39-42; 0.75 left too few searching rollouts to "
        "learn from). 0 = every episode searches (left out of dumps, so earlier warm-up keys stay what they were).")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Warm-up SFT engine settings.")
    timeout_s: int = Field(default=3600, ge=10, description="Prefect timeout of the warm-up SFT task.")

    @model_serializer(mode="wrap")
    def _drop_zero_no_search_share(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if data.get("no_search_share", 1) == 0:
            del data["no_search_share"]
        return data

    def retriever(self, run: RetrieverSpec) -> RetrieverSpec:
        """The retriever of warm-up episodes: BM25 over ``corpus`` when set, else the run's own."""
        return RetrieverSpec(corpus=self.corpus) if self.corpus else run
