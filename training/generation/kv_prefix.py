"""Prefix KV reuse for the transformers backend: automatic prefix caching, as vLLM does it, for multi-turn rollouts.

A search agent's prompt at turn t+1 is its prompt at turn t + what it generated + the inserted documents. Without
reuse every turn re-runs the whole prefix through the model (prefill), which dominates rollout time on a CPU.
``PrefixKVStore`` keeps, per finished generation row, the key/value tensors of the tokens it has already seen
(prompt + kept generated tokens); the next call looks up the longest stored token prefix of each new prompt and
prefills only the rest. The shared part of a batch's prompts (the protocol's template) is prefilled once and stored
too, so a batch of new questions pays for the template once instead of once per row.

Batched layout handed to ``model.generate`` (rows of different cached lengths ``c_i`` and suffix lengths ``s_i``)::

    [ pad .. cached_i (c_i) | pad .. suffix_i (s_i) ]   attention mask 0 on pads, 1 elsewhere

with ``past_key_values`` covering the first ``Lc = max c_i`` columns. Position ids come from the mask's cumsum, so
every real token keeps the position it had when its keys were computed (keys are stored after RoPE).

Matching is by token ids, not text: when re-tokenizing ``text + documents`` merges differently at a boundary the
match is simply shorter. Memory is bounded by ``max_tokens`` (least recently used entries go first).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(eq=False)  # identity: entries hold arrays, and eviction removes one specific entry
class _Entry:
    ids: np.ndarray  # token ids whose keys/values are stored, shape [n]
    kv: list[tuple[Any, Any]]  # per layer (keys, values), each [kv_heads, n, head_dim]
    shared: bool = False  # a batch's common prefix (kept when a row extends it)
    stamp: int = 0


@dataclass
class Lookup:
    """One prompt's match: reuse the first ``length`` tokens of ``entry`` (0 = no reuse)."""

    ids: list[int]
    length: int = 0
    entry: _Entry | None = None


@dataclass
class PrefixKVStore:
    """LRU store of per-sequence KV caches, looked up by longest common token prefix.

    Args:
        max_tokens: total tokens kept over all entries (memory bound; SmolLM2-135M: ~23 KB/token in bf16).
        min_shared: a batch's common prompt prefix is prefilled once when it is at least this many tokens.
    """

    max_tokens: int = 65_536
    min_shared: int = 16
    entries: list[_Entry] = field(default_factory=list)
    hits: int = 0  # tokens served from the store
    misses: int = 0  # prompt tokens prefilled
    _clock: itertools.count = field(default_factory=itertools.count)

    def lookup(self, ids: list[int]) -> Lookup:
        """Longest stored prefix of ``ids``, leaving at least one token to feed the model."""
        arr = np.asarray(ids, dtype=np.int64)
        best, best_len = None, 0
        for e in self.entries:
            n = min(len(e.ids), len(arr) - 1)
            if n <= best_len:
                continue
            diff = np.flatnonzero(e.ids[:n] != arr[:n])
            common = int(diff[0]) if diff.size else n
            if common > best_len:
                best, best_len = e, common
        if best is not None:
            best.stamp = next(self._clock)
        return Lookup(ids=list(ids), length=best_len, entry=best)

    def add(self, ids: list[int], kv: list[tuple[Any, Any]], shared: bool = False) -> None:
        """Store ``kv`` (per layer ``[kv_heads, len(ids), head_dim]``); drops non-shared entries it extends."""
        arr = np.asarray(ids, dtype=np.int64)
        self.entries = [e for e in self.entries
                        if e.shared or len(e.ids) > len(arr) or not np.array_equal(e.ids, arr[: len(e.ids)])]
        self.entries.append(_Entry(ids=arr, kv=kv, shared=shared, stamp=next(self._clock)))
        total = sum(len(e.ids) for e in self.entries)
        for e in sorted(self.entries, key=lambda e: e.stamp):
            if total <= self.max_tokens:
                break
            self.entries.remove(e)
            total -= len(e.ids)

    def clear(self) -> None:
        """Forget every entry (call when the model's weights change)."""
        self.entries.clear()

    def share_common_prefix(self, model: Any, rows: list[list[int]]) -> None:
        """Prefill the common token prefix of ``rows`` once (batch of 1) and store it, unless already covered."""
        if len(rows) < 2:
            return
        first = np.asarray(rows[0], dtype=np.int64)
        common = min(len(r) for r in rows) - 1
        for r in rows[1:]:
            n = min(common, len(r))
            diff = np.flatnonzero(first[:n] != np.asarray(r[:n], dtype=np.int64))
            common = int(diff[0]) if diff.size else n
        if common < self.min_shared or self.lookup(rows[0]).length >= common:
            return
        import torch

        ids = torch.tensor([rows[0][:common]], device=model.device)
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)  # only the KV is kept
        self.misses += common
        self.add(rows[0][:common], [(k[0], v[0]) for k, v in cache_layers(out.past_key_values)], shared=True)


def cache_layers(cache: Any) -> list[tuple[Any, Any]]:
    """(keys, values) per layer from a transformers cache object or a legacy tuple."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "to_legacy_cache"):
        return list(cache.to_legacy_cache())
    return list(cache)


def assemble(lookups: list[Lookup], pad_id: int, device: Any) -> tuple[Any, Any, Any, int]:
    """Batched (input_ids, attention_mask, past_key_values or None, cached width Lc) for ``lookups``."""
    import torch
    from transformers import DynamicCache

    lc = max(lk.length for lk in lookups)
    suffixes = [lk.ids[lk.length:] for lk in lookups]
    ls = max(len(s) for s in suffixes)
    b = len(lookups)
    input_ids = torch.full((b, lc + ls), pad_id, dtype=torch.long)
    mask = torch.zeros((b, lc + ls), dtype=torch.long)
    for r, (lk, suf) in enumerate(zip(lookups, suffixes, strict=True)):
        if lk.length:
            input_ids[r, lc - lk.length: lc] = torch.tensor(lk.ids[: lk.length])
            mask[r, lc - lk.length: lc] = 1
        input_ids[r, lc + ls - len(suf):] = torch.tensor(suf)
        mask[r, lc + ls - len(suf):] = 1
    if lc == 0:
        return input_ids.to(device), mask.to(device), None, 0
    ref = next(lk.entry for lk in lookups if lk.entry is not None).kv
    layers = []
    for layer, (k0, v0) in enumerate(ref):
        keys = k0.new_zeros((b, k0.shape[0], lc, k0.shape[2]))
        values = v0.new_zeros((b, v0.shape[0], lc, v0.shape[2]))
        for r, lk in enumerate(lookups):
            if lk.length and lk.entry is not None:
                k, v = lk.entry.kv[layer]
                keys[r, :, lc - lk.length:] = k[:, : lk.length]
                values[r, :, lc - lk.length:] = v[:, : lk.length]
        layers.append((keys, values))
    return input_ids.to(device), mask.to(device), DynamicCache(layers), lc
