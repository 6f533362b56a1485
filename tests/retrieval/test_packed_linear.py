"""Packed bf16 linear layers: the same numbers as nn.Linear, every bf16 Linear swapped in a copy, the original
untouched; the CPU bf16 query encoder runs its passes on such a copy with the same vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from retrieval.packed_linear import packed_copy, packed_linear_class, packing_supported

pytestmark = pytest.mark.skipif(not packing_supported(), reason="no packed bf16 linears on this CPU/torch (needs "
                                "oneDNN with AVX-512 or AMX): the encoder keeps its plain layers there")


def test_packed_linear_equals_linear_for_any_leading_shape() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 40).to(torch.bfloat16).eval()
    packed = packed_linear_class()(linear)
    with torch.inference_mode():
        for shape in ((3, 24), (2, 5, 24), (1, 24)):
            x = torch.randn(*shape).to(torch.bfloat16)
            assert torch.equal(packed(x), linear(x))


def test_packed_copy_swaps_bf16_linears_and_leaves_the_original() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                torch.nn.Sequential(torch.nn.Linear(16, 4))).to(torch.bfloat16).eval()
    clone = packed_copy(model)
    assert clone is not None
    assert [type(m).__name__ for m in clone.modules()].count("PackedLinear") == 2
    assert [type(m) for m in model.modules()].count(torch.nn.Linear) == 2
    x = torch.randn(6, 8).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(clone(x), model(x))
    assert packed_copy(torch.nn.Sequential(torch.nn.Linear(8, 4))) is None  # fp32: nothing to pack


@pytest.mark.slow
def test_bf16_cpu_query_encoder_packs_its_copy_with_the_same_vectors(monkeypatch) -> None:
    from retrieval.encoders import EncoderConfig, SentenceTransformerEncoder

    enc = SentenceTransformerEncoder(EncoderConfig(dtype="bfloat16", device="cpu"))
    enc.unpad_queries = False  # a BERT model runs unpadded by default (retrieval.unpadded_bert); the padded path here
    packed_model = enc.packed_query_model()
    assert enc.pack_queries and packed_model is not None and enc.packed_query_model() is packed_model  # made once
    packed_type = packed_linear_class()
    assert not any(isinstance(m, packed_type) for m in enc._query_model.modules())  # passages keep the plain model
    passes: list[int] = []
    forward = packed_model.forward
    monkeypatch.setattr(packed_model, "forward", lambda f: passes.append(len(f["input_ids"])) or forward(f))
    texts = ["who wrote it", "when was the director of the film Ed Wood born and where did he die", "food", "baby"]
    packed = enc.encode(texts, "query")
    assert sum(passes) == len(texts)  # every query went through the packed copy
    enc.pack_queries = False
    assert np.array_equal(packed, enc.encode(texts, "query"))
