"""Generation backends behind one interface: ``Generator.generate(prompts, sampling) -> list[Completion]``.

Backends (named in ``GENERATORS`` as dotted strings, imported only when chosen):
- ``transformers``: batched HF generation on CPU or GPU with left padding and the KV cache; stop strings are
  honoured per row and the output is cut right after the stop string; seeds; per-prompt token budgets.
- ``vllm``: the vLLM offline engine (``vllm`` imported lazily; from an environment without vLLM it runs in
  ``.venv-vllm`` through ``training.generation.vllm_worker``).
- ``openai``: any OpenAI-compatible server (vLLM / SGLang serving) over HTTP with httpx, completions or chat.

Every backend returns, per prompt, ``sampling.n`` completions (prompt-major order). With a seed, engines that seed
per request (vLLM, OpenAI-compatible servers) give prompt ``i`` the seed ``derive_seed(sampling.seed, i)``, so
identical prompts in one call (the K copies of a question) draw different samples, reproducibly. ``best_of > n`` samples
``best_of`` candidates and keeps the ``n`` with the highest cumulative log-probability (ExSearch's per-step
best-of-n by likelihood).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import Field, model_validator

from infra.config import StrictModel

log = logging.getLogger(__name__)

GENERATORS: dict[str, str] = {
    "transformers": "training.generation.hf:TransformersGenerator",
    "vllm": "training.generation.vllm_worker:VLLMWorkerGenerator",  # in-process where vLLM imports
    "openai": "training.generation.openai_client:OpenAICompatibleGenerator",
}

FinishReason = Literal["stop", "length", "eos"]


class SamplingParams(StrictModel):
    """Sampling settings shared by every backend."""

    temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy decoding.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    n: int = Field(default=1, ge=1, description="Completions returned per prompt.")
    best_of: int | None = Field(
        default=None, ge=1, description="Candidates sampled per prompt; the n most likely are kept (None = n)."
    )
    seed: int | None = Field(default=None, description="Random seed (None = nondeterministic sampling).")
    max_tokens: int = Field(default=256, ge=1, description="New tokens per completion.")
    stop: list[str] = Field(default_factory=list, description="Stop strings; output is cut right after the first.")
    logprobs: bool = Field(default=False, description="Compute the cumulative log-probability of each completion.")

    @model_validator(mode="after")
    def _check_best_of(self) -> SamplingParams:
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must be >= n ({self.n})")
        return self

    @property
    def candidates(self) -> int:
        """Samples drawn per prompt."""
        return self.best_of or self.n

    @property
    def wants_logprobs(self) -> bool:
        """Whether completions need their log-probability: asked for, or to keep the best of the candidates."""
        return self.logprobs or self.best_of is not None

    def budgets(self, max_tokens: list[int] | None, n_prompts: int) -> list[int]:
        """New-token budget per prompt: ``max_tokens`` (one per prompt) when given, else ``self.max_tokens``."""
        return list(max_tokens) if max_tokens else [self.max_tokens] * n_prompts


@dataclass
class Completion:
    """One generated continuation.

    ``text`` ends right after the matched stop string (included) and never contains the EOS token.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason = "length"
    stop: str | None = None
    cumulative_logprob: float | None = None
    token_logprobs: list[float] | None = None  # per generated token, when the backend computed them


@runtime_checkable
class Generator(Protocol):
    """A text generator. ``eos_token``: the EOS text the model emits (None when unknown); ``tokenizer`` optional."""

    eos_token: str | None

    def generate(
        self, prompts: list[str], sampling: SamplingParams, max_tokens: list[int] | None = None
    ) -> list[Completion]:
        """Return ``sampling.n`` completions per prompt (prompt-major). ``max_tokens`` overrides per prompt."""
        ...


def cpu_native_bf16() -> bool:
    """Whether this CPU has native bf16 matmuls (``infra.machine.cpu_native_bf16``)."""
    from infra.machine import cpu_native_bf16 as native

    return native()


def cpu_dtype() -> str:
    """The dtype to run a model in on this CPU: ``bfloat16`` with native bf16 matmuls, else ``float32``."""
    return "bfloat16" if cpu_native_bf16() else "float32"


def derive_seed(base: int, *parts: int) -> int:
    """A reproducible 31-bit seed from ``base`` and ``parts`` (e.g. step, prompt index), well mixed: nearby
    inputs give unrelated seeds, so ``(seed, step + 1)`` never collides with ``(seed + 1, step)``."""
    import hashlib

    key = ",".join(str(int(x)) for x in (base, *parts)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") & 0x7FFFFFFF


def cut_at_stop(text: str, stops: list[str] | tuple[str, ...]) -> tuple[str, str | None]:
    """Cut ``text`` right after the earliest occurrence of any stop string: (text, matched stop or None)."""
    best: tuple[int, str] | None = None
    for s in stops:
        if not s:
            continue
        i = text.find(s)
        if i >= 0 and (best is None or i + len(s) < best[0] + len(best[1])):
            best = (i, s)
    if best is None:
        return text, None
    return text[: best[0] + len(best[1])], best[1]


def select_best(candidates: list[Completion], n: int) -> list[Completion]:
    """The ``n`` candidates with the highest cumulative log-probability (stable; None counts as -inf)."""
    order = sorted(
        range(len(candidates)),
        key=lambda i: -(candidates[i].cumulative_logprob if candidates[i].cumulative_logprob is not None else -1e30),
    )
    return [candidates[i] for i in order[:n]]


def regroup(candidates: list[Completion], n_prompts: int, sampling: SamplingParams) -> list[Completion]:
    """From prompt-major candidates (``sampling.candidates`` per prompt) keep ``n`` per prompt (best-of if needed)."""
    k = sampling.candidates
    out: list[Completion] = []
    for p in range(n_prompts):
        group = candidates[p * k : (p + 1) * k]
        out.extend(select_best(group, sampling.n) if sampling.best_of is not None else group)
    return out


def load_generator(backend: str, model: str, **kwargs: Any) -> Generator:
    """Build a generator by backend name (``transformers``, ``vllm``, ``openai``) for ``model``.

    Raises:
        ConfigError: naming the known backends.
    """
    from infra.lazy import pick

    return pick(GENERATORS, backend, "generation backend").from_model(model, **kwargs)
