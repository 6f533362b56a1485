"""Unpadded bf16 BERT query passes: vectors as close to the fp32 model as the padded bf16 path's, for mean and CLS
pooling, whatever the order and size of the call; anything that is not a bf16 BERT keeps the padded path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from retrieval.packed_linear import packing_supported

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not packing_supported(), reason="no packed bf16 linears on this CPU/torch (needs oneDNN with AVX-512 or AMX): "
    "the encoder keeps its padded passes there")]

TEXTS = ["who wrote it", "when was the director of the film Ed Wood born and where did he die", "food", "baby",
         "which river flows through the capital of the country where the 1998 world cup final was played",
         "what is the population of the town where the author of the hobbit was born", "x", "a b c d"]


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def encoders():
    from retrieval.encoders import EncoderConfig, SentenceTransformerEncoder

    return (SentenceTransformerEncoder(EncoderConfig(dtype="bfloat16", device="cpu")),
            SentenceTransformerEncoder(EncoderConfig(dtype="float32", device="cpu")))


def test_bf16_bert_queries_run_unpadded_close_to_fp32(encoders, monkeypatch) -> None:
    bf16, fp32 = encoders
    assert bf16.unpad_queries and not fp32.unpad_queries  # fp32 keeps the padded passes
    calls: list[int] = []
    monkeypatch.setattr(bf16._query_model, "forward", lambda f: calls.append(1))  # the HF forward must not run
    reference = fp32.encode(TEXTS, "query")
    unpadded = bf16.encode(TEXTS, "query")
    assert not calls and unpadded.shape == reference.shape and unpadded.dtype == np.float32
    assert np.allclose(np.linalg.norm(unpadded, axis=1), 1.0, atol=1e-5)
    monkeypatch.undo()
    bf16.unpad_queries = False
    try:
        padded = bf16.encode(TEXTS, "query")
    finally:
        bf16.unpad_queries = True
    # within bf16 rounding of fp32, and no further from it than the padded bf16 passes
    assert _cos(unpadded, reference).min() > 0.9995
    assert _cos(unpadded, reference).mean() >= _cos(padded, reference).mean() - 1e-5
    # a text's vector does not depend on its neighbours in the call (up to bf16 rounding of other matrix shapes)
    alone = np.concatenate([bf16.encode([t], "query") for t in TEXTS])
    reordered = bf16.encode(TEXTS[::-1], "query")[::-1]
    assert _cos(alone, unpadded).min() > 0.9999 and _cos(reordered, unpadded).min() > 0.9999


def test_cls_pooling_and_what_stays_padded(encoders) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling

    from retrieval.unpadded_bert import ROW_MULTIPLE, unpadded_bert

    bf16, fp32 = encoders
    transformer = bf16._query_model[0]
    cls_model = SentenceTransformer(modules=[transformer, Pooling(384, pooling_mode="cls")], device="cpu")
    fast = unpadded_bert(cls_model)
    assert fast is not None and fast.pooling == "cls"
    lengths = cls_model.tokenize(TEXTS)["attention_mask"].sum(dim=1).tolist()
    assert sum(lengths) % ROW_MULTIPLE  # the call is padded to whole row blocks inside
    got = fast.encode_texts(cls_model.tokenizer, TEXTS, cls_model.max_seq_length)
    fp32_cls = SentenceTransformer(modules=[fp32._query_model[0], Pooling(384, pooling_mode="cls")], device="cpu")
    with torch.inference_mode():
        want = fp32_cls.forward(fp32_cls.tokenize(TEXTS))["sentence_embedding"].numpy()
    assert _cos(got, want).min() > 0.999
    # not covered: max pooling, an fp32 model, a module list that is not Transformer + Pooling (+ Normalize)
    assert unpadded_bert(SentenceTransformer(modules=[transformer, Pooling(384, pooling_mode="max")],
                                             device="cpu")) is None
    assert unpadded_bert(fp32._query_model) is None
    assert unpadded_bert(SentenceTransformer(modules=[transformer, Pooling(384), Normalize(), Normalize()],
                                             device="cpu")) is None
