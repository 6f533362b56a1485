"""``training.generation.attention.grouped_attention`` equals transformers' eager attention (fp32) for decode steps
and prefill, with and without an additive padding mask, and refuses heads that do not group."""

from __future__ import annotations

import pytest


def _inputs(batch: int, heads: int, kv_heads: int, q_len: int, k_len: int, pad: bool):
    import torch

    gen = torch.Generator().manual_seed(batch * 100 + q_len)
    query = torch.randn(batch, heads, q_len, 16, generator=gen)
    key = torch.randn(batch, kv_heads, k_len, 16, generator=gen)
    value = torch.randn(batch, kv_heads, k_len, 16, generator=gen)
    mask = None
    if pad:  # additive 4-D mask as transformers' eager mask gives it: the first columns of row 0 are padding
        mask = torch.zeros(batch, 1, q_len, k_len)
        mask[0, :, :, : k_len // 3] = torch.finfo(torch.float32).min
    return query, key, value, mask


@pytest.mark.parametrize(("batch", "q_len", "k_len", "pad"), [(3, 1, 40, True), (2, 7, 7, True), (1, 1, 5, False)])
def test_grouped_attention_equals_eager_in_fp32(batch: int, q_len: int, k_len: int, pad: bool) -> None:
    import torch
    from transformers.models.llama.modeling_llama import eager_attention_forward

    from training.generation.attention import grouped_attention

    module = torch.nn.Module()
    module.num_key_value_groups = 3
    module.eval()
    query, key, value, mask = _inputs(batch, 9, 3, q_len, k_len, pad)
    want_out, want_w = eager_attention_forward(module, query, key, value, mask, scaling=0.25)
    got_out, got_w = grouped_attention(module, query, key, value, mask, scaling=0.25)
    assert got_out.shape == want_out.shape == (batch, q_len, 9, 16)
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)


def test_heads_that_do_not_group_are_refused() -> None:
    import torch

    from training.generation.attention import grouped_attention

    query, key, value, _ = _inputs(1, 4, 3, 1, 5, False)
    with pytest.raises(ValueError, match="4 query heads do not group over 3"):
        grouped_attention(torch.nn.Module(), query, key, value, None, scaling=0.25)


def test_register_adds_the_attention_and_its_mask_once() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from training.generation.attention import GROUPED, grouped_attention, register

    assert register() == register() == GROUPED
    assert AttentionInterface._global_mapping[GROUPED] is grouped_attention
    assert GROUPED in AttentionMaskInterface._global_mapping
