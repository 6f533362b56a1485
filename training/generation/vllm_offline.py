"""vLLM offline-engine generator. ``vllm`` is imported only when this backend is built.

Stop strings are kept in the output (``include_stop_str_in_output``); EOS is reported as finish reason ``eos``.
best-of-n is done here by sampling ``best_of`` candidates and keeping the most likely (vLLM V1 dropped
``best_of``), using the engine's cumulative log-probabilities. With a seed, prompt ``i`` gets
``derive_seed(seed, i)`` (vLLM seeds per request, so K copies of a question would otherwise sample alike).

vLLM lives in its own environment (``make vllm-env`` -> ``.venv-vllm``; it needs transformers>=5.16). The
``vllm`` backend name resolves to ``training.generation.vllm_worker.VLLMWorkerGenerator.from_model``: where
``vllm`` is importable that builds this class in-process; elsewhere (the main environment: flows, eval, the EM
loop) it starts the worker in ``.venv-vllm``, which runs this class and answers each ``generate`` call (the same
offline engine, batched the same way). On CPU: workers start by spawn (the worker's entry has the ``__main__`` guard),
``gpu_memory_utilization`` is a fraction of *host* memory (0.92 fails on 24 GiB; default here 0.1),
``VLLM_CPU_KVCACHE_SPACE`` sizes the KV cache (GiB, default 2), eager mode is the default, and the dtype is bf16
only where the CPU has native bf16 matmuls (else fp32: emulated bf16 ran ~19x slower on this AVX2 machine).
"""

from __future__ import annotations

from typing import Any

from training.generation.base import Completion, SamplingParams, cpu_dtype, derive_seed, regroup


def cpu_defaults(kwargs: dict[str, Any], on_cpu: bool) -> dict[str, Any]:
    """``vllm.LLM`` keyword defaults: small host-memory share, eager, and bf16 only with native bf16 matmuls (else
    fp32) on CPU; 0.6 of the GPU otherwise."""
    out = dict(kwargs)
    if out.get("gpu_memory_utilization") is None:
        out["gpu_memory_utilization"] = 0.1 if on_cpu else 0.6
    if on_cpu:
        out.setdefault("enforce_eager", True)
        if out.get("dtype") in (None, "auto"):
            out["dtype"] = cpu_dtype()
        # vLLM 0.32's CPU runner crashes when a seeded request's prefill is split across steps (it rewinds the
        # request's torch.Generator with set_offset, which CPU generators lack: "CPU Generator does not use
        # offset"); whole prefills avoid that path
        out.setdefault("enable_chunked_prefill", False)
        out.setdefault("max_num_batched_tokens", max(int(out.get("max_model_len") or 8192), 8192))
    return out


class VLLMGenerator:
    """Generator on ``vllm.LLM``.

    Args:
        llm: a ``vllm.LLM`` instance.
        tokenizer: its HF tokenizer (for chat templates and masks).
    """

    def __init__(self, llm: Any, tokenizer: Any) -> None:
        self.llm, self.tokenizer = llm, tokenizer
        self.eos_token: str | None = tokenizer.eos_token

    @classmethod
    def from_model(cls, model: str, gpu_memory_utilization: float | None = None, **kwargs: Any) -> VLLMGenerator:
        """Build the engine in this process for a model name, HF folder or GGUF (``kwargs``: ``vllm.LLM``'s)."""
        from training.generation.models import load_tokenizer, resolve_model

        path = str(resolve_model(model))
        from vllm import LLM
        from vllm.platforms import current_platform

        kwargs = cpu_defaults({"gpu_memory_utilization": gpu_memory_utilization, **kwargs}, current_platform.is_cpu())
        llm = LLM(model=path, trust_remote_code=False, **kwargs)
        return cls(llm, load_tokenizer(path))

    def generate(
        self, prompts: list[str], sampling: SamplingParams, max_tokens: list[int] | None = None
    ) -> list[Completion]:
        """Generate ``sampling.n`` completions per prompt (prompt-major)."""
        from vllm import SamplingParams as VSP

        if not prompts:
            return []
        want_lp, budgets = sampling.wants_logprobs, sampling.budgets(max_tokens, len(prompts))
        # one seed per prompt: identical prompts (K copies of a question) must not draw identical samples;
        # vLLM seeds the n samples of one prompt itself (seed + index)
        seeds = [None if sampling.seed is None else derive_seed(sampling.seed, i) for i in range(len(prompts))]
        params = [
            VSP(n=sampling.candidates, temperature=sampling.temperature, top_p=sampling.top_p, seed=seed, max_tokens=mt,
                stop=list(sampling.stop) or None, include_stop_str_in_output=True, logprobs=0 if want_lp else None)
            for mt, seed in zip(budgets, seeds, strict=True)
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        flat = [self._completion(o) for out in outputs for o in out.outputs]
        return regroup(flat, len(prompts), sampling)

    def _completion(self, o: Any) -> Completion:
        stop = o.stop_reason if isinstance(o.stop_reason, str) else None
        reason = "length" if o.finish_reason == "length" else ("stop" if stop is not None else "eos")
        text = o.text
        if self.eos_token and text.endswith(self.eos_token):
            text = text[: -len(self.eos_token)]
        ids = list(o.token_ids)
        if reason == "eos" and ids and ids[-1] == getattr(self.tokenizer, "eos_token_id", None):
            ids = ids[:-1]  # like the other backends: the EOS token is not part of the completion
        per_token = None
        if o.logprobs is not None:  # one {token id: Logprob} per generated token (the sampled one included)
            per_token = [float(step[t].logprob) for t, step in zip(ids, o.logprobs, strict=False) if t in step]
            per_token = per_token if len(per_token) == len(ids) else None
        return Completion(text=text, token_ids=ids, finish_reason=reason, stop=stop,
                          cumulative_logprob=o.cumulative_logprob, token_logprobs=per_token)
