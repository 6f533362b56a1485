"""Decode steps on CPU run grouped attention, prefill sdpa (``training.generation.decode.step_attention``): the switch
is scoped to the step and restored, and in fp32 the tokens are those of sdpa and eager steps."""

from __future__ import annotations

import pytest

from training.generation import decode as dec


@pytest.fixture(scope="module")
def tiny_lm(smol_tokenizer):
    """A 2-layer Llama with SmolLM2's tokenizer and random weights, fp32, sdpa attention."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=smol_tokenizer.eos_token_id, pad_token_id=smol_tokenizer.pad_token_id,
                      initializer_range=0.2)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


def test_switch_is_scoped_to_the_step(tiny_lm) -> None:
    assert tiny_lm.config._attn_implementation == "sdpa"
    from training.generation.attention import GROUPED

    with dec.step_attention(tiny_lm):
        assert tiny_lm.config._attn_implementation == GROUPED
    assert tiny_lm.config._attn_implementation == "sdpa"
    tiny_lm.config._attn_implementation = "eager"  # a model loaded with another implementation is left alone
    try:
        with dec.step_attention(tiny_lm):
            assert tiny_lm.config._attn_implementation == "eager"
        assert tiny_lm.config._attn_implementation == "eager"
    finally:
        tiny_lm.config._attn_implementation = "sdpa"


def test_an_unknown_step_attention_is_refused_and_the_model_left_alone(tiny_lm, monkeypatch) -> None:
    monkeypatch.setattr(dec, "DECODE_STEP_ATTENTION", "flash")
    with pytest.raises(ValueError, match="'grouped', 'eager' or 'sdpa'"), dec.step_attention(tiny_lm):
        pass
    assert tiny_lm.config._attn_implementation == "sdpa"


def test_grouped_and_eager_steps_decode_the_same_tokens_as_sdpa_in_fp32(tiny_lm, smol_tokenizer,
                                                                        monkeypatch) -> None:
    import torch

    prompts = ["Question: who wrote Hamlet?", "Question: which river flows through the city of Vienna, Austria?"]
    smol_tokenizer.padding_side = "left"
    enc = smol_tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    runs = {}
    for impl in ("grouped", "eager", "sdpa"):
        monkeypatch.setattr(dec, "DECODE_STEP_ATTENTION", impl)
        torch.manual_seed(0)
        runs[impl] = dec.decode(tiny_lm, enc["input_ids"], enc["attention_mask"], None, [24, 24], smol_tokenizer,
                                stops=["</answer>"])
    assert runs["grouped"] == runs["sdpa"] == runs["eager"]
    assert all(len(row) == 24 for row in runs["grouped"])
    assert tiny_lm.config._attn_implementation == "sdpa"
