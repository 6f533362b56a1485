"""The int8 query pass (``query_backend="torch-int8"``): each fused kernel against its PyTorch reference, and the
encoder's vectors against fp32 (close, and independent of the call a query comes in)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from retrieval.int8_bert import int8_supported

pytestmark = pytest.mark.skipif(not int8_supported(), reason="needs numba and torch._int_mm on this CPU")

TEXTS = ["who wrote it", "when was the director of the film Ed Wood born and where did he die", "food", "baby",
         "which river flows through the capital of the country where the 1998 world cup final was played",
         "what is the population of the town where the author of the hobbit was born", "x", "a b c d"]


def _reference_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    top = x.abs().amax(1).clamp_min(1e-8)
    return torch.round(x * (127 / top)[:, None]).to(torch.int8), top / 127


def _case(rows: int = 37, n: int = 48, seed: int = 0) -> dict[str, np.ndarray]:
    g = np.random.default_rng(seed)
    return {"y": g.integers(-2 ** 18, 2 ** 18, (rows, n)).astype(np.int32),
            "a": (g.random(rows) * 1e-4).astype(np.float32), "scale": g.random(n).astype(np.float32),
            "bias": g.standard_normal(n).astype(np.float32), "smooth": (g.random(n) + 0.5).astype(np.float32),
            "residual": g.standard_normal((rows, n)).astype(np.float32),
            "gamma": g.random(n).astype(np.float32), "beta": g.standard_normal(n).astype(np.float32)}


def _assert_quantized(q: np.ndarray, s: np.ndarray, x: torch.Tensor) -> None:
    ref_q, ref_s = _reference_quantize(x)
    assert np.allclose(s, ref_s.numpy(), rtol=1e-6)
    assert np.abs(q.astype(np.int32) - ref_q.numpy().astype(np.int32)).max() <= 1  # a rounding tie at most


def test_gelu_matches_torch() -> None:
    from retrieval.int8_kernels import gelu

    x = np.linspace(-8, 8, 20001, dtype=np.float32).reshape(1, -1)
    out = np.empty_like(x)
    gelu(x, out)
    assert np.abs(out - torch.nn.functional.gelu(torch.from_numpy(x).double()).numpy()).max() < 2e-6


def test_quantize_and_dequantize_rows() -> None:
    from retrieval.int8_kernels import dequantize_rows, quantize_rows

    c = _case()
    x = c["residual"].copy()
    x[3] = 0.0  # an all-zero row quantizes to zeros, not NaN
    q, s = np.empty(x.shape, np.int8), np.empty(x.shape[0], np.float32)
    quantize_rows(x, c["smooth"], q, s)
    _assert_quantized(q, s, torch.from_numpy(x * c["smooth"]))
    assert not q[3].any() and np.isfinite(s).all()
    out = np.empty(c["y"].shape, np.float32)
    dequantize_rows(c["y"], c["a"], c["scale"], c["bias"], out)
    want = c["y"].astype(np.float64) * c["a"][:, None] * c["scale"] + c["bias"]
    assert np.allclose(out, want, rtol=1e-5, atol=1e-5)


def test_gelu_and_norm_epilogues_match_torch() -> None:
    from retrieval.int8_kernels import dequantize_add_norm_quantize, dequantize_gelu_quantize

    c = _case()
    t = {k: torch.from_numpy(v) for k, v in c.items()}
    pre = t["y"].double() * t["a"][:, None] * t["scale"] + t["bias"]
    q, s = np.empty(c["y"].shape, np.int8), np.empty(c["y"].shape[0], np.float32)
    dequantize_gelu_quantize(c["y"], c["a"], c["scale"], c["bias"], c["smooth"], q, s)
    _assert_quantized(q, s, (torch.nn.functional.gelu(pre) * t["smooth"]).float())

    h = np.empty(c["y"].shape, np.float32)
    a = c["a"].copy()  # the kernel may write the new scales over its input scales
    dequantize_add_norm_quantize(c["y"], a, c["scale"], c["bias"], c["residual"], c["gamma"], c["beta"], 1e-12,
                                 c["smooth"], h, q, a, True)
    want = torch.nn.functional.layer_norm(pre + t["residual"], (pre.shape[1],), t["gamma"].double(),
                                          t["beta"].double(), 1e-12)
    assert np.allclose(h, want.numpy(), atol=2e-5)
    _assert_quantized(q, a, (want * t["smooth"]).float())


@pytest.fixture(scope="module")
def encoders():
    from retrieval.encoders import EncoderConfig, SentenceTransformerEncoder

    return (SentenceTransformerEncoder(EncoderConfig(query_backend="torch-int8", device="cpu")),
            SentenceTransformerEncoder(EncoderConfig(dtype="float32", device="cpu")))


@pytest.mark.slow
def test_int8_queries_close_to_fp32_and_independent_of_the_call(encoders, monkeypatch) -> None:
    from retrieval.int8_bert import Int8Bert

    int8, fp32 = encoders
    assert isinstance(int8._unpadded_query_model, Int8Bert) and int8.unpad_queries
    calls: list[int] = []
    monkeypatch.setattr(int8._query_model, "forward", lambda f: calls.append(1))  # the HF forward must not run
    got = int8.encode(TEXTS, "query")
    assert not calls and got.shape == (len(TEXTS), fp32.dim) and got.dtype == np.float32
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    reference = fp32.encode(TEXTS, "query")
    cos = (got * reference).sum(axis=1)
    # session 50: dev questions min 0.9984, mean 0.9992; one-word texts here go down to 0.994
    assert cos.min() > 0.99 and cos.mean() > 0.997
    # per-token activation scales: a query's vector is the same alone, reordered, or in a call of any size
    alone = np.concatenate([int8.encode([t], "query") for t in TEXTS])
    assert np.array_equal(alone, got)
    assert np.array_equal(int8.encode(TEXTS[::-1] * 5, "query")[:len(TEXTS)][::-1], got)
    # passages keep the full (bf16) model: the int8 pass is never called for them
    monkeypatch.setattr(int8._unpadded_query_model, "encode", lambda ids: pytest.fail("int8 pass ran for passages"))
    assert np.allclose(int8.encode(TEXTS[:2], "passage"), fp32.encode(TEXTS[:2], "passage"), atol=2e-2)


@pytest.mark.slow
def test_int8_refuses_what_it_cannot_run(monkeypatch) -> None:
    from infra.errors import ConfigError
    from retrieval import encoders as enc
    from retrieval.encoders import EncoderConfig, SentenceTransformerEncoder

    with pytest.raises(ConfigError, match="runs on the CPU"):
        SentenceTransformerEncoder(EncoderConfig(query_backend="torch-int8", device="cuda"))
    monkeypatch.setattr("retrieval.int8_bert.int8_supported", lambda: False)
    with pytest.raises(ConfigError, match="needs numba"):
        SentenceTransformerEncoder(EncoderConfig(query_backend="torch-int8", device="cpu"))
    assert enc.config_fingerprint(EncoderConfig(query_backend="torch-int8")) == enc.config_fingerprint(
        EncoderConfig())
