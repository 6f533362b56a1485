"""Grouped-query attention for KV-cached decode steps on CPU, registered with transformers' ``AttentionInterface``.

transformers' ``eager`` attention copies every key/value head out to its query heads (``repeat_kv``) at every
decode step and layer: for SmolLM2-135M (9 query heads over 3 key/value heads) that copies the whole KV cache three
times per step, the largest cost after the linear layers in a profile of a held-out evaluation (session 29:
``reshape`` 9.1 of 74 s). ``grouped_attention`` computes the same scores without the copy: the query heads that
share a key/value head become rows of one matrix product against that head's keys (heads ``h = kv * groups + g``,
the order ``repeat_kv`` gives them). Softmax runs in float32 as ``eager`` does. The result equals ``eager`` up to
the summation order of the matrix products (the check: ``tests/training/generation/test_attention.py`` in fp32, and
``benchmarks/decode_attention.py`` counts equal greedy streams in bf16).

:func:`grouped_on_cpu` switches a model that runs ``sdpa`` on CPU to it for a block: the GRPO loss's forward and
backward use it with ``TRLSearchConfig.loss_attention: grouped`` (PyTorch's CPU flash-attention backward was 18% of
a loss micro-batch in a session-36 profile, against 0.2 s of plain matrix products).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: the name under which ``register`` adds the function to transformers' attention registry
GROUPED = "searchloop_grouped"


def grouped_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float,
                      dropout: float = 0.0, **kwargs: Any) -> tuple[Any, Any]:
    """Attention of ``query`` (batch, heads, q_len, dim) over ``key``/``value`` (batch, kv_heads, k_len, dim) with
    the query heads grouped per key/value head instead of the keys copied; returns (batch, q_len, heads, dim) and
    the attention weights (batch, heads, q_len, k_len), as transformers' ``eager_attention_forward`` does."""
    import torch

    batch, heads, q_len, dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[-2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not group over {kv_heads} key/value heads")
    groups = heads // kv_heads
    q = query.reshape(batch, kv_heads, groups * q_len, dim)
    scores = torch.matmul(q, key.transpose(2, 3)) * scaling  # (batch, kv_heads, groups * q_len, k_len)
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :k_len]  # (batch, 1, q_len, k_len), additive
        scores = (scores.view(batch, kv_heads, groups, q_len, k_len) + mask[:, :, None]).view(
            batch, kv_heads, groups * q_len, k_len)
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout and getattr(module, "training", False):
        weights = torch.nn.functional.dropout(weights, p=dropout, training=True)
    out = torch.matmul(weights, value)  # (batch, kv_heads, groups * q_len, dim)
    out = out.view(batch, heads, q_len, dim).transpose(1, 2).contiguous()
    return out, weights.view(batch, heads, q_len, k_len)


def register() -> str:
    """Add ``grouped_attention`` to transformers' attention registry, with the ``eager`` mask (additive, 4-D) in the
    mask registry (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(GROUPED, grouped_attention)
    AttentionMaskInterface.register(GROUPED, eager_mask)
    return GROUPED


@contextlib.contextmanager
def cpu_sdpa_as(model: Any, implementation: str) -> Iterator[bool]:
    """``model`` runs attention ``implementation`` (a name in transformers' registry, e.g. ``register()``'s or
    ``"eager"``) inside the block when it runs ``sdpa`` on CPU: its config's ``_attn_implementation``, read by
    transformers at every forward, is set and restored to ``sdpa``. Yields whether it switched; elsewhere (CUDA,
    another implementation) nothing changes. The decode steps' and the GRPO loss's switch."""
    config = getattr(model, "config", None)
    if (getattr(config, "_attn_implementation", None) != "sdpa"
            or getattr(getattr(model, "device", None), "type", "") != "cpu"):
        yield False
        return
    config._attn_implementation = implementation
    try:
        yield True
    finally:
        config._attn_implementation = "sdpa"


@contextlib.contextmanager
def grouped_on_cpu(model: Any) -> Iterator[bool]:
    """``model`` runs :func:`grouped_attention` inside the block when it runs ``sdpa`` on CPU (:func:`cpu_sdpa_as`);
    yields whether it switched."""
    with cpu_sdpa_as(model, register()) as switched:
        yield switched
