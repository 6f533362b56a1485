"""The generator reference every config names: :class:`GeneratorSpec` (a leaf: pydantic and ``infra.config`` only).

Opening it is :func:`training.generation.spec.open_generator` / :func:`~training.generation.spec.generator_session`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_serializer, model_validator

from infra.config import StrictModel
from infra.lazy import load_object

Backend = Literal["auto", "transformers", "vllm", "openai", "vllm_served"]


class GeneratorSpec(StrictModel):
    """Which model generates, with which backend and engine settings."""

    model: str = Field(
        default="smollm2",
        description="'smollm2', an HF folder, a .gguf file, or the served name (openai). Loops that train a policy "
        "(EM, RL) set it to the current checkpoint.",
    )
    backend: Backend = Field(default="auto", description="auto | transformers | vllm | openai | vllm_served "
                             "(vLLM's server from .venv-vllm for one session: EM and evaluation stages); auto = the "
                             "engine measured faster on this machine (training.generation.choice), else transformers.")
    base_url: str | None = Field(default=None, description="OpenAI-compatible server URL (openai), e.g. "
                                                           "http://127.0.0.1:8001/v1.")
    tokenizer: str | None = Field(
        default=None,
        description="Tokenizer of a served model (openai: chat templates, loss masks, EOS); default: ``model`` when "
        "it names a local model ('smollm2', an HF folder, a .gguf), else none.",
    )
    batch_size: int = Field(default=64, ge=1, description="Prompts per forward batch (transformers).")
    dtype: str = Field(default="auto", description="Weights dtype (transformers, vllm): auto | bfloat16 | float16 | "
                                                   "float32; auto = bf16 where the hardware has it.")
    device: str = Field(default="auto", description="transformers: auto | cpu | cuda.")
    threads: int | None = Field(default=None, ge=1, description="transformers: torch CPU threads (None: torch's "
                                                                "default or SEARCHLOOP_TORCH_THREADS).")
    prefix_cache_tokens: int | None = Field(
        default=None, ge=1, description="transformers: memory bound of the prefix KV store in tokens (None: the "
        "engine's 65,536, ~1.5 GB of bf16 keys and values for SmolLM2-135M). 16,384 with eval.chunk 64 held a "
        "210-question evaluation at 2.86 GB instead of 4.73 (docs/results/engines/session29).")

    @model_serializer(mode="wrap")
    def _drop_unset_cache_bound(self, handler: Any) -> dict[str, Any]:
        """Unset, ``prefix_cache_tokens`` is left out of dumps, so the keys (run folders) of configs that embed a
        spec stay what they were before the field existed."""
        data = handler(self)
        if data.get("prefix_cache_tokens", 0) is None:
            del data["prefix_cache_tokens"]
        return data

    @model_validator(mode="after")
    def _url_for_openai(self) -> GeneratorSpec:
        if self.backend == "openai" and not self.base_url:
            raise ValueError("backend=openai needs base_url (e.g. http://127.0.0.1:8001/v1, from "
                             "`searchloop serve generator`)")
        return self

    def resolved(self, items: int | None = None) -> GeneratorSpec:
        """This spec with ``backend: auto`` replaced by the engine picked for this machine and a workload of
        ``items`` questions (``training.generation.choice.pick_backend``); any other backend as is."""
        if self.backend != "auto":
            return self
        pick = load_object("training.generation.choice:pick_backend")
        return self.model_copy(update={"backend": pick(items)})

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the backend's ``from_model`` (besides the model)."""
        if self.backend == "auto":
            return self.resolved().engine_kwargs()
        if self.backend == "transformers":
            extra = {} if self.prefix_cache_tokens is None else {"prefix_cache_tokens": self.prefix_cache_tokens}
            return {"batch_size": self.batch_size, "device": self.device, "threads": self.threads,
                    "dtype": self.dtype, **extra}
        if self.backend in ("vllm", "vllm_served"):
            return {} if self.dtype == "auto" else {"dtype": self.dtype}
        served_tokenizer = load_object("training.generation.spec:served_tokenizer")  # loads a tokenizer: not a leaf
        return {"base_url": self.base_url, "tokenizer": served_tokenizer(self.model, self.tokenizer)}
