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


def test_additive_step_mask_is_transformers_eager_mask_and_decodes_the_same_tokens(tiny_lm, smol_tokenizer,
                                                                                     monkeypatch) -> None:
    """``additive_mask`` is the mask transformers builds for a one-token step (values equal), and decoding with it
    gives the tokens of decoding with transformers' own, greedy and seeded."""
    import torch
    from transformers.masking_utils import eager_mask

    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 0, 1, 1]])
    for dtype in (torch.float32, torch.bfloat16):
        ours = dec.additive_mask(mask, dtype)
        theirs = eager_mask(batch_size=3, cache_position=torch.tensor([4]), kv_length=5, attention_mask=mask.bool(),
                            dtype=dtype)
        assert ours.shape == theirs.shape == (3, 1, 1, 5) and ours.dtype == dtype and torch.equal(ours, theirs)
    prompts = ["Question: who wrote Hamlet?", "Question: which river flows through the city of Vienna, Austria?"]
    smol_tokenizer.padding_side = "left"
    enc = smol_tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    runs = {}
    for step_mask in ("additive", "transformers"):
        monkeypatch.setattr(dec, "STEP_MASK", step_mask)
        for temperature in (0.0, 1.0):
            torch.manual_seed(0)
            runs[step_mask, temperature] = dec.decode(tiny_lm, enc["input_ids"], enc["attention_mask"], None,
                                                      [24, 24], smol_tokenizer, stops=[], temperature=temperature)
    assert runs["additive", 0.0] == runs["transformers", 0.0]
    assert runs["additive", 1.0] == runs["transformers", 1.0]


def test_sample_rows_draws_the_rows_distribution_and_never_a_zero_probability_token(monkeypatch) -> None:
    import torch

    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 0.0, 2.0], [0.25, 0.25, 0.0, 0.5]])  # any row sum
    torch.manual_seed(0)
    draws = torch.stack([dec.sample_rows(probs) for _ in range(4000)])  # (4000, 3)
    assert not bool((probs.gather(1, draws.T) == 0).any())  # no zero-probability token, ever
    assert bool((draws[:, 1] == 3).all())
    for row, p in ((0, [0.1, 0.0, 0.6, 0.3]), (2, [0.25, 0.25, 0.0, 0.5])):
        freq = torch.bincount(draws[:, row], minlength=4).double() / len(draws)
        assert torch.allclose(freq, torch.tensor(p, dtype=torch.float64), atol=0.03)
    torch.manual_seed(1)
    a = dec.sample_rows(probs)
    torch.manual_seed(1)
    assert torch.equal(a, dec.sample_rows(probs))  # torch's global RNG: a seed gives the same tokens
    # a draw rounded up to the row's total falls back to the most probable token
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.ones(*shape, dtype=torch.float64))
    assert dec.sample_rows(probs).tolist() == [2, 3, 3]
    monkeypatch.setattr(dec, "SAMPLER", "multinomial")  # the switch of the benchmarks: torch.multinomial
    assert dec._pick(torch.log(probs[1:2] + 1e-30), 1.0, 1.0).tolist() == [3]
