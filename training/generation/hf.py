"""The ``transformers`` generation backend: batched HF generation on CPU or GPU with left padding, the KV cache,
per-row stop strings and budgets, and a token-prefix KV cache across calls (``training.generation.kv_prefix``)."""

from __future__ import annotations

import logging
from typing import Any, Literal

from infra.memory import trim_on_growth
from training.generation.base import Completion, SamplingParams, cpu_native_bf16, cut_at_stop, regroup

log = logging.getLogger(__name__)


def _auto_dtype(device: str) -> str | None:
    """bf16 on CUDA and on CPUs with native bf16 matmuls (AMX or AVX512-BF16), else None (fp32 on CPU)."""
    import torch

    if device != "cpu" and (device.startswith("cuda") or torch.cuda.is_available()):
        return "bfloat16"
    return "bfloat16" if cpu_native_bf16() else None


def length_buckets(lengths: list[int], batch_size: int, ratio: float | None) -> list[list[int]]:
    """Indices grouped into batches of increasing length: at most ``batch_size`` each and, when ``ratio`` is set,
    no member longer than ``ratio`` x the batch's shortest."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    buckets: list[list[int]] = []
    for i in order:
        cur = buckets[-1] if buckets else None
        if cur is None or len(cur) >= batch_size or (ratio and lengths[i] > ratio * max(1, lengths[cur[0]])):
            buckets.append([i])
        else:
            cur.append(i)
    return buckets


class _StopCriteria:
    """HF ``generate`` stopping criterion: per row, ``training.generation.decode.StopCheck`` on the new tokens.

    Reads the batch's last column once per step (one host sync) and keeps every row's new tokens on the host, so a
    row whose last token could end it is checked without another device read (on a GPU a per-row read of the new
    tokens cost one synchronisation per such row per step: 0.86x ``generate`` at decode batch 64 on an H200, session
    19); EOS is handled by ``generate`` itself; a row once done stays done.
    """

    def __init__(self, tokenizer: Any, prompt_len: int, stops: list[str], budgets: list[int]) -> None:
        from training.generation.decode import StopCheck

        self.prompt_len, self.budgets = prompt_len, budgets
        self.check = StopCheck(tokenizer, stops, None)
        self.done = [False] * len(budgets)
        self.new: list[list[int]] = [[] for _ in budgets]  # each row's generated ids so far, on the host

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        from training.generation.decode import may_end

        n_new = input_ids.shape[1] - self.prompt_len
        if n_new != (len(self.new[0]) if self.new else 0) + 1:  # a step was skipped: read the new columns again
            tails = input_ids[:, self.prompt_len:].tolist()
            self.new = [t[:-1] for t in tails]
            last = [t[-1] for t in tails]
        else:
            last = input_ids[:, -1].tolist()
        could_end = self.check.could_end
        for row, token in enumerate(last):
            self.new[row].append(token)
            if self.done[row]:
                continue
            if n_new >= self.budgets[row]:
                self.done[row] = True
            elif self.check.stops and (could_end is None or may_end(could_end, token)):
                self.done[row] = self.check.done(self.new[row], self.budgets[row])
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)


class TransformersGenerator:
    """Batched HF transformers generation (left padding, KV cache, per-row stop strings and budgets).

    Args:
        model: a causal LM (``AutoModelForCausalLM``).
        tokenizer: its tokenizer (EOS/pad fixed, see ``training.generation.models``).
        batch_size: rows per forward batch.
        bucket_ratio: rows are sorted by length and a batch is closed when the next prompt is longer than
            ``bucket_ratio`` x its shortest (less left padding to prefill; on CPU prefill dominates after document
            insertion). None = fixed batches (better on GPU, where decode steps dominate). With the prefix cache
            the lengths compared are those of the parts left to prefill.
        prefix_cache: reuse the keys/values of already-seen token prefixes across calls
        (``training.generation.kv_prefix``):
            a continuation after a document insertion prefills only the new tokens, and a batch's shared template
            is prefilled once. ``reset_prefix_cache()`` forgets them (``run_rollouts`` clears them at start and
            end through ``set_multi_turn``, so a cache never outlives the weights it was computed with).
            ``"auto"`` (default) uses it only where it was measured to win (:meth:`uses_prefix_cache`: on CPU with
            >= 2 rows per forward batch, on CUDA in multi-turn rollouts); True / False force it on / off.
        prefix_cache_tokens: memory bound of that cache, in tokens.
    """

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 16, bucket_ratio: float | None = 1.5,
                 prefix_cache: bool | Literal["auto"] = "auto", prefix_cache_tokens: int = 65_536) -> None:
        from training.generation.kv_prefix import PrefixKVStore

        if prefix_cache not in (True, False, "auto"):
            raise ValueError(f"prefix_cache must be True, False or 'auto', got {prefix_cache!r}")
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.bucket_ratio = bucket_ratio
        self.cache_mode = prefix_cache
        self.multi_turn = False  # set by run_rollouts (set_multi_turn); the "auto" rule reads it on CUDA
        self.prefix_cache = PrefixKVStore(max_tokens=prefix_cache_tokens) if prefix_cache else None
        self.eos_token: str | None = tokenizer.eos_token
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def from_model(
        cls, model: str, device: str = "auto", batch_size: int = 16, threads: int | None = None, **kwargs: Any
    ) -> TransformersGenerator:
        """Load ``model`` (name, HF folder or GGUF; see ``training.generation.models.resolve_model``).

        ``prefix_cache_tokens`` bounds the prefix KV store (default 65,536 tokens, ~1.5 GB for SmolLM2-135M in bf16).
        ``threads`` sets torch's intra-op threads (process-wide; default: ``SEARCHLOOP_TORCH_THREADS`` when set).
        On an oversubscribed CPU 1 thread was measured ~10x faster than 2. ``dtype="auto"`` (default) loads bf16 on
        CUDA and on CPUs with native bf16 matmuls (AMX / AVX512-BF16: prefill measured 4.3x faster than fp32 for
        SmolLM2-135M), fp32 elsewhere; pass ``dtype="float32"`` to force full precision.
        """
        import os

        from training.generation.models import load_model

        cache_tokens = kwargs.pop("prefix_cache_tokens", None)
        threads = threads or int(os.environ.get("SEARCHLOOP_TORCH_THREADS", "0") or 0) or None
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        if kwargs.get("dtype", "auto") == "auto":
            kwargs["dtype"] = _auto_dtype(device)
        lm, tok = load_model(model, device=device, **kwargs)
        on_cpu = next(lm.parameters()).device.type == "cpu"
        extra = {} if cache_tokens is None else {"prefix_cache_tokens": cache_tokens}
        return cls(lm, tok, batch_size=batch_size, bucket_ratio=1.5 if on_cpu else None, **extra)

    def uses_prefix_cache(self, rows: int) -> bool:
        """Whether a call generating ``rows`` rows takes the prefix-cache path.

        ``prefix_cache="auto"`` is the rule measured for issue 26 item 1 (``benchmarks/gpu_check.py``; numbers in
        ``docs/results/engines/``). On CPU, where prefill dominates, the cache path ran 1.5x / 2.1x plain
        ``generate`` at batch 16 / 64 (a forward batch's shared template is prefilled once) but 0.91-0.93x at batch
        1, where a forward batch has nothing to share: so CPU uses it only with at least two rows per forward
        batch. On CUDA (H200, three runs in sessions 16 and 18) single-shot calls gained nothing from it: cache /
        no cache 0.79-1.13x, median 0.97 over batch 1/16/64 and both workload shapes; multi-turn rollouts, whose
        continuations reuse the stored prefixes, ran 1.11x and 1.13x with it. So CUDA uses it only between
        ``set_multi_turn(True)`` and ``set_multi_turn(False)`` (``run_rollouts`` brackets its turns so).
        """
        if self.prefix_cache is None or rows == 0:
            return False
        if self.cache_mode is True:
            return True
        if self.device.type == "cpu":
            return min(self.batch_size, rows) >= 2
        return self.multi_turn

    def set_multi_turn(self, on: bool) -> None:
        """Mark the calls that follow as turns of multi-turn rollouts (``on=True``: prompts will be continued after
        a document insertion, where the prefix cache wins on CUDA) or not; forgets every cached prefix either way."""
        self.multi_turn = on
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (the weights may have changed since)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    @property
    def context_limit(self) -> int | None:
        """Longest sequence (prompt + new tokens) the model accepts (``max_position_embeddings``), if known."""
        return getattr(self.model.config, "max_position_embeddings", None)

    @property
    def device(self) -> Any:
        """The model's device."""
        return next(self.model.parameters()).device

    def generate(
        self, prompts: list[str], sampling: SamplingParams, max_tokens: list[int] | None = None
    ) -> list[Completion]:
        """Generate ``sampling.n`` completions per prompt; see the module docstring."""
        import torch

        if not prompts:
            return []
        k = sampling.candidates
        rows = [p for p in prompts for _ in range(k)]
        budgets = [b for b in sampling.budgets(max_tokens, len(prompts)) for _ in range(k)]
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        out: list[Completion | None] = [None] * len(rows)
        limit = self.context_limit
        if limit:
            lengths = [len(x) for x in self.tokenizer(rows, add_special_tokens=False)["input_ids"]]
            for i, n in enumerate(lengths):
                budgets[i] = min(budgets[i], limit - n)
                if budgets[i] <= 0:  # the context is full: nothing can be generated
                    out[i] = Completion(text="", finish_reason="length")
        todo = [i for i in range(len(rows)) if out[i] is None]
        if self.uses_prefix_cache(len(todo)):
            self._generate_cached([rows[i] for i in todo], [budgets[i] for i in todo], sampling, todo, out)
        else:
            for bucket in length_buckets([len(rows[i]) for i in todo], self.batch_size, self.bucket_ratio):
                idx = [todo[j] for j in bucket]
                batch = self._generate_batch([rows[i] for i in idx], [budgets[i] for i in idx], sampling)
                for i, comp in zip(idx, batch, strict=True):
                    out[i] = comp
                trim_on_growth()  # free chunks left by this batch's caches go back to the OS (infra.memory)
        done = [c for c in out if c is not None]
        if sampling.wants_logprobs:
            self._score(rows, done)
        return regroup(done, len(prompts), sampling)

    def _generate_cached(self, prompts: list[str], budgets: list[int], sampling: SamplingParams, idx: list[int],
                         out: list[Completion | None]) -> None:
        """Generate with prefix reuse: shared template once, then per bucket only the uncached suffixes."""
        from training.generation.decode import decode
        from training.generation.kv_prefix import assemble

        store, tok = self.prefix_cache, self.tokenizer
        if store is None:
            raise RuntimeError("_generate_cached needs the prefix cache (prefix_cache=True)")
        ids = tok(prompts, add_special_tokens=False)["input_ids"]
        store.share_common_prefix(self.model, ids)
        lookups = [store.lookup(x) for x in ids]
        todo = [len(lk.ids) - lk.length for lk in lookups]
        for bucket in length_buckets(todo, self.batch_size, self.bucket_ratio):
            group = [lookups[j] for j in bucket]
            input_ids, mask, cache, _ = assemble(group, tok.pad_token_id, self.device)
            group_budgets = [budgets[j] for j in bucket]
            finished: dict[int, tuple[list, list[int]]] = {}
            new_ids = decode(
                self.model, input_ids, mask, cache, group_budgets, tok, list(sampling.stop), sampling.temperature,
                sampling.top_p, on_finish=lambda row, kv, fed, keep=finished: keep.__setitem__(row, (kv, fed)),
            )
            comps = [self._finish(new_ids[r], group_budgets[r], sampling.stop) for r in range(len(group))]
            for r, (lk, comp) in enumerate(zip(group, comps, strict=True)):
                kv, fed = finished[r]
                n = len(lk.ids) + min(len(fed), len(comp.token_ids))
                store.add(lk.ids + comp.token_ids[: n - len(lk.ids)], [(k[:, :n], v[:, :n]) for k, v in kv])
            store.hits += sum(lk.length for lk in group)
            store.misses += sum(len(lk.ids) - lk.length for lk in group)
            for j, comp in zip(bucket, comps, strict=True):
                out[idx[j]] = comp
            trim_on_growth()  # free chunks left by this bucket's caches go back to the OS (infra.memory)

    @staticmethod
    def _sampling_kwargs(sampling: SamplingParams) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"do_sample": sampling.temperature > 0}
        if sampling.temperature > 0:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        return kwargs

    def _generate_batch(self, prompts: list[str], budgets: list[int], sampling: SamplingParams) -> list[Completion]:
        import torch

        tok = self.tokenizer
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        plen = enc["input_ids"].shape[1]
        criteria = _StopCriteria(tok, plen, list(sampling.stop), budgets)
        with torch.inference_mode():
            seqs = self.model.generate(
                input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],  # no token_type_ids
                max_new_tokens=max(budgets), stopping_criteria=[criteria], pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id, **self._sampling_kwargs(sampling),
            )
        return [self._finish(seqs[r, plen:].tolist(), budgets[r], sampling.stop) for r in range(len(prompts))]

    def _finish(self, new: list[int], budget: int, stops: list[str]) -> Completion:
        tok = self.tokenizer
        eos = tok.eos_token_id
        end = new.index(eos) if eos in new else len(new)
        ids = new[:end][:budget]
        text = tok.decode(ids, skip_special_tokens=False)
        cut, stop = cut_at_stop(text, stops)
        if stop is not None:
            n = len(ids)
            while n > 1 and stop in tok.decode(ids[: n - 1], skip_special_tokens=False):
                n -= 1
            return Completion(text=cut, token_ids=ids[:n], finish_reason="stop", stop=stop)
        if end < len(new) and end < budget:
            return Completion(text=text, token_ids=ids, finish_reason="eos")
        return Completion(text=text, token_ids=ids, finish_reason="length")

    def _score(self, prompts: list[str], completions: list[Completion]) -> None:
        """Fill ``cumulative_logprob`` (sum of token log-probs under the model) with one forward pass per batch."""
        import torch

        tok = self.tokenizer
        for start in range(0, len(prompts), self.batch_size):
            chunk = list(range(start, min(start + self.batch_size, len(prompts))))
            p_ids = [tok(prompts[i], add_special_tokens=False)["input_ids"] for i in chunk]
            c_ids = [completions[i].token_ids for i in chunk]
            width = max(len(p) + len(c) for p, c in zip(p_ids, c_ids, strict=True))
            ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
            att = torch.zeros_like(ids)
            for r, (p, c) in enumerate(zip(p_ids, c_ids, strict=True)):
                seq = p + c
                ids[r, width - len(seq):] = torch.tensor(seq)
                att[r, width - len(seq):] = 1
            with torch.inference_mode():
                logits = self.model(input_ids=ids.to(self.device), attention_mask=att.to(self.device)).logits
            logp = torch.log_softmax(logits.float(), dim=-1)
            for r, i in enumerate(chunk):
                n = len(c_ids[r])
                if n == 0:
                    completions[i].cumulative_logprob, completions[i].token_logprobs = 0.0, []
                    continue
                pos = torch.arange(width - n - 1, width - 1)
                target = ids[r, width - n:].to(logp.device)
                values = logp[r, pos, target]
                completions[i].cumulative_logprob = float(values.sum())
                completions[i].token_logprobs = [float(x) for x in values.tolist()]
