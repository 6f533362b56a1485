"""Batched decoding that drops finished rows: the transformers backend's generation loop.

``model.generate`` keeps every row of a batch in every forward pass until the longest row ends, so a batch whose
rows stop at different times (a search call after 10 tokens, an answer after 200) pays for the longest one on
every row. ``decode`` runs prefill then one forward per step over the *unfinished* rows only: a row leaves the
batch (and its keys/values leave the cache, ``DynamicCache.batch_select_indices``) as soon as it emits EOS, a stop
string or exhausts its own budget. Before it leaves, its cache columns are handed to ``on_finish`` so a prefix
store can keep them (``training.generation.kv_prefix``).

Sampling matches the generate path's settings: greedy when ``temperature == 0``, else temperature + nucleus
(``top_p``) sampling from torch's global RNG (seeded by the caller).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any


def _pick(logits: Any, temperature: float, top_p: float) -> Any:
    import torch

    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p  # keep the smallest set reaching top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return sample_rows(probs) if SAMPLER == "inverse_cdf" else torch.multinomial(probs, 1).squeeze(-1)


#: how sampled decode steps draw a token: ``inverse_cdf`` (:func:`sample_rows`, the default from session 35) or
#: ``multinomial`` (``torch.multinomial``, before). A switch for benchmarks (``benchmarks/grpo_step.py`` variant
#: ``old_steps``); the two draw from the same distribution with different random streams.
SAMPLER = "inverse_cdf"


def sample_rows(probs: Any) -> Any:
    """One token per row of ``probs`` (``[B, V]``, non-negative, any positive row sum), drawn by inverting the row's
    cumulative distribution at one uniform number from torch's global RNG.

    The same distribution as ``torch.multinomial(probs, 1)``, which on a 2-core CPU took 28 ms for 16 rows of
    SmolLM2's 49,152-token vocabulary against 4.9 ms here, most of it the float64 cumulative sums
    (``benchmarks/decode_step_parts.py``, session 35). A token of zero probability is never drawn: the search takes the
    first index whose cumulative mass exceeds the draw (``right=True``), and a draw rounded up to the row's total
    falls back to the row's most probable token.
    """
    import torch

    cum = probs.double().cumsum(dim=-1)
    draw = torch.rand(probs.shape[0], 1, dtype=torch.float64, device=probs.device) * cum[:, -1:]
    tokens = torch.searchsorted(cum, draw, right=True).squeeze(-1)
    over = tokens >= probs.shape[-1]
    if bool(over.any()):
        tokens = torch.where(over, probs.argmax(dim=-1), tokens)
    return tokens


class StopCheck:
    """Per-row end test: EOS, a stop string in the decoded tail of the new tokens, or the row's budget.

    Decoding the tail of every row at every step costs more than a small model's forward on a GPU (a tokenizer call
    per row per step). A stop string can only be completed by a token whose own text holds the string's last
    character, so the tail is decoded only after such a token (``could_end``, one vocabulary pass per tokenizer
    and stop set, cached). A stop string whose last character is whitespace or not ASCII (byte-level tokens of a
    multi-byte character decode to U+FFFD alone, and decoding may clean up spaces) is checked at every step.
    """

    def __init__(self, tokenizer: Any, stops: list[str], eos_id: int | None) -> None:
        self.tokenizer, self.stops, self.eos_id = tokenizer, [s for s in stops if s], eos_id
        self.tail = max([len(tokenizer.encode(s, add_special_tokens=False)) for s in self.stops] or [0]) + 3
        self.could_end = _end_filter(tokenizer, tuple(self.stops)) if self.stops else None

    def done(self, new: list[int], budget: int) -> bool:
        """True when ``new`` (the row's generated ids so far) ends the row."""
        if new and new[-1] == self.eos_id:
            return True
        if len(new) >= budget:
            return True
        if self.stops and (self.could_end is None or not new or may_end(self.could_end, new[-1])):
            text = self.tokenizer.decode(new[-self.tail:], skip_special_tokens=False)
            return any(s in text for s in self.stops)
        return False


def may_end(could_end: Any, token: int) -> bool:
    """Whether ``token`` may complete a stop string under the filter ``could_end`` (``StopCheck.could_end``)."""
    return token >= len(could_end) or bool(could_end[token])


_END_FILTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {stops: filter}


def _end_filter(tokenizer: Any, stops: tuple[str, ...]) -> Any:
    """Boolean array over the vocabulary: True where a token's text holds the last character of a stop string;
    None when some stop string must be checked at every step (see ``StopCheck``)."""
    import numpy as np

    try:
        per_tokenizer = _END_FILTERS.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: no cache, check every step
        return None
    if stops not in per_tokenizer:
        lasts = {s[-1] for s in stops}
        if any(not c.isascii() or c.isspace() for c in lasts):
            per_tokenizer[stops] = None
        else:
            size = len(tokenizer)
            pieces = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False)
            per_tokenizer[stops] = np.fromiter((any(c in p for c in lasts) for p in pieces), dtype=bool, count=size)
    return per_tokenizer[stops]


def decode(
    model: Any, input_ids: Any, attention_mask: Any, cache: Any, budgets: list[int], tokenizer: Any,
    stops: list[str], temperature: float = 0.0, top_p: float = 1.0,
    on_finish: Callable[[int, list[tuple[Any, Any]], list[int]], None] | None = None,
) -> list[list[int]]:
    """Generate for every row until it ends; returns each row's new token ids (EOS included when emitted).

    Args:
        model: a causal LM.
        input_ids: ``[B, L]`` left-padded rows; when ``cache`` holds the first ``Lc`` columns only the rest is fed.
        attention_mask: ``[B, L]`` (0 on padding, which may also sit between cached and new columns).
        cache: a ``DynamicCache`` covering the first ``Lc`` columns, or None.
        budgets: new-token limit per row.
        tokenizer: decodes tails for the stop strings.
        stops: stop strings.
        temperature: 0 = greedy.
        top_p: nucleus mass when sampling.
        on_finish: ``(row, per-layer (keys, values) of the row's real columns, new ids fed)`` when a row ends.
    """
    import torch
    from transformers import DynamicCache

    cache = cache if cache is not None else DynamicCache()
    lc = cache.get_seq_length()
    mask = attention_mask
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    check = StopCheck(tokenizer, stops, tokenizer.eos_token_id)
    new: list[list[int]] = [[] for _ in range(input_ids.shape[0])]
    alive = list(range(input_ids.shape[0]))
    with torch.inference_mode():
        out = model(input_ids=input_ids[:, lc:], attention_mask=mask, position_ids=positions[:, lc:],
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        last = positions[:, -1]
        dtype = getattr(model, "dtype", torch.float32)  # the mask's dtype: the embeddings', as eager_mask takes it
        with step_attention(model) as additive:  # every forward below is a one-token decode step
            while alive:
                tokens = _pick(out.logits[:, -1, :], temperature, top_p)
                keep = []
                for j, (row, token) in enumerate(zip(alive, tokens.tolist(), strict=True)):  # one host sync per step
                    new[row].append(token)
                    if check.done(new[row], budgets[row]):
                        if on_finish is not None:
                            _hand_over(on_finish, row, j, cache, mask, new[row][:-1])
                    else:
                        keep.append(j)
                if not keep:
                    break
                if len(keep) < len(alive):
                    index = torch.tensor(keep, device=mask.device)
                    cache.batch_select_indices(index)
                    mask, tokens, last = mask[index], tokens[index], last[index]
                    alive = [alive[j] for j in keep]
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
                last = last + 1
                step_mask = additive_mask(mask, dtype) if additive and STEP_MASK == "additive" else mask
                out = model(input_ids=tokens[:, None], attention_mask=step_mask, position_ids=last[:, None],
                            past_key_values=cache, use_cache=True)
    return new


#: attention of decode steps on CPU: ``grouped`` (``training.generation.attention``, the default), ``eager``
#: (transformers' eager, the default from session 15 to 30) or ``sdpa`` (no switch: as before session 15). A switch for
#: benchmarks (``benchmarks/heldout_eval.py`` variants ``eager_steps``, ``sdpa_steps``) and parity tests.
DECODE_STEP_ATTENTION = "grouped"


#: the mask of decode steps under ``grouped``/``eager`` attention: ``additive`` (:func:`additive_mask`, the default from
#: session 35) or ``transformers`` (the 2-D mask, from which transformers builds the same 4-D one each step, before).
#: A switch for benchmarks (``benchmarks/grpo_step.py`` variant ``old_steps``); the outputs are identical.
STEP_MASK = "additive"


def additive_mask(mask: Any, dtype: Any) -> Any:
    """The 4-D additive mask ``(batch, 1, 1, k_len)`` of a one-token decode step over ``mask`` (``[B, k_len]``, 0 on
    padding): 0 where a key is attended, the dtype's minimum where not.

    What transformers' ``eager_mask`` builds for such a step (a query attends to every cached key and itself, so the
    causal part is all true) without its ``vmap`` over the mask function: 4.5 ms a call against 0.04 ms on a 2-core
    CPU for 16 rows of 400 keys (``benchmarks/decode_step_parts.py``, session 35); transformers passes a 4-D mask
    through unchanged."""
    import torch

    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask.bool(), zero, torch.finfo(dtype).min)[:, None, None, :]


@contextlib.contextmanager
def step_attention(model: Any) -> Iterator[bool]:
    """Decode steps on CPU run ``grouped_attention`` (the query heads that share a key/value head as one matrix
    product, no copy of the cache) instead of ``sdpa``; prefill keeps ``sdpa`` (``decode`` enters this once, after
    its prefill, around its step loop). Yields True when the steps run ``grouped`` or ``eager`` attention, whose mask
    is additive and 4-D (``decode`` then passes :func:`additive_mask`), else False (the 2-D mask as before).

    Measured on a 2-core AVX512-BF16 CPU (SmolLM2-135M, bf16, 600-token prompts, KV cache;
    ``benchmarks/decode_attention.py``, docs/results/engines/decode_attention.md): sdpa decode steps were the
    slowest (batch 16: 240 ms against 144 ms for eager in session 15), and grouped steps are 1.5-1.8x faster than
    eager ones at batch 16 and 64 and equal at batch 1 (session 30, docs/results/engines/session30/decode_attention.md:
    104 and 89 against 159 and 163 ms at batch 16, 183 against 290 ms at batch 64), while a 16 x 600-token prefill
    takes 9.7 s with sdpa and 17.0 s with eager. Elsewhere (CUDA, or a model loaded with another implementation)
    nothing changes.
    """
    from training.generation.attention import cpu_sdpa_as, register

    if DECODE_STEP_ATTENTION == "sdpa":
        yield False
        return
    if DECODE_STEP_ATTENTION not in ("grouped", "eager"):
        raise ValueError(f"DECODE_STEP_ATTENTION is {DECODE_STEP_ATTENTION!r}; use 'grouped', 'eager' or 'sdpa'")
    with cpu_sdpa_as(model, register() if DECODE_STEP_ATTENTION == "grouped" else "eager") as switched:
        yield switched


def _hand_over(on_finish: Callable, row: int, j: int, cache: Any, mask: Any, fed: list[int]) -> None:
    """The real (mask 1) cache columns of batch row ``j``: its prompt tokens then the new tokens fed so far."""
    from training.generation.kv_prefix import cache_layers

    cols = mask[j].nonzero().squeeze(-1)
    # index_select allocates a new tensor: the row's columns outlive the batch cache without a second copy
    layers = [(k[j].index_select(1, cols), v[j].index_select(1, cols)) for k, v in cache_layers(cache)]
    on_finish(row, layers, fed)
