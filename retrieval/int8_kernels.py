"""Fused row kernels (numba) around the int8 products of :mod:`retrieval.int8_bert`.

An int8 product (``torch._int_mm``) runs at twice a Zen 4 core's bf16 rate, but what surrounds it in eager PyTorch
(int32 to float, two scales, bias, GELU, residual add, layer norm, the next product's per-token quantization) is
five to ten passes over the activations, and those passes ate most of the gain (docs/results/engines/session50).
Each kernel here does one product's whole epilogue in one pass per row, with the row in cache: dequantize, add, GELU
or layer norm, smooth, find the row's absolute maximum and quantize it. They are single-threaded and release the
GIL, so concurrent searches run them in parallel.

Vectorization notes (measured on Zen 4): ``error_model="numpy"`` lets LLVM vectorize loops with a float division
(Python's error model adds a zero-division branch); a float max reduction does not vectorize, so the row maximum is
taken over the float bits as integers (for non-negative floats the order is the same); GELU's erf is the rational
approximation used by Eigen and XLA (max error ~1e-6 here, tests/retrieval/test_int8_bert.py), which needs no exp.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# erf(x) ~ x * P(x^2) / Q(x^2) on [-4, 4] (clamped outside): the rational approximation of Eigen / XLA's float erf
_P = tuple(np.float32(v) for v in (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                                   -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                                   -1.60960333262415e-02))
_Q = tuple(np.float32(v) for v in (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                                   -7.37332916720468e-03, -1.42647390514189e-02))
P0, P1, P2, P3, P4, P5, P6 = _P
Q0, Q1, Q2, Q3, Q4 = _Q
#: the float bits of 1e-8 (an all-zero row gets this maximum, not a division by zero)
_TINY_BITS = np.int32(np.array([1e-8], np.float32).view(np.int32)[0])
_ABS_BITS = np.int32(0x7FFFFFFF)
_SQRT_HALF = np.float32(0.7071067811865476)
_OPTS = {"fastmath": True, "error_model": "numpy", "nogil": True, "cache": True}


@njit(fastmath=True, error_model="numpy", inline="always", cache=True)
def erf32(x: float) -> float:
    """float32 erf (rational approximation, clamped to [-4, 4])."""
    x = min(max(x, np.float32(-4.0)), np.float32(4.0))
    x2 = x * x
    p = P0
    p = p * x2 + P1
    p = p * x2 + P2
    p = p * x2 + P3
    p = p * x2 + P4
    p = p * x2 + P5
    p = p * x2 + P6
    q = Q0
    q = q * x2 + Q1
    q = q * x2 + Q2
    q = q * x2 + Q3
    q = q * x2 + Q4
    return x * p / q


@njit(**_OPTS)
def gelu(x: np.ndarray, out: np.ndarray) -> None:
    """out = GELU(x) (erf form) for a 2-D float32 array."""
    for t in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[t, j]
            out[t, j] = np.float32(0.5) * v * (np.float32(1.0) + erf32(v * _SQRT_HALF))


@njit(**_OPTS)
def _row_scratch(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A float32 row of ``n`` and its int32 view, and a 1-element int32 box with its float32 view: what
    :func:`_quantize_row` works in."""
    g = np.empty(n, np.float32)
    box = np.empty(1, np.int32)
    return g, g.view(np.int32), box, box.view(np.float32)


@njit(**_OPTS)
def _quantize_row(g: np.ndarray, gi: np.ndarray, box: np.ndarray, boxf: np.ndarray, q: np.ndarray,
                  s: np.ndarray, t: int) -> None:
    """q[t] = round(g * 127 / max|g|), s[t] = max|g| / 127 (g: one row, gi its int32 view; box/boxf: 1-element
    int32 array and its float view, to turn the maximum's bits back into a float)."""
    m = np.int32(0)
    for j in range(gi.shape[0]):
        m = max(m, gi[j] & _ABS_BITS)
    box[0] = max(m, _TINY_BITS)
    top = boxf[0]
    s[t] = top / np.float32(127.0)
    r = np.float32(127.0) / top
    for j in range(g.shape[0]):
        q[t, j] = np.int8(np.int32(np.rint(g[j] * r)))


@njit(**_OPTS)
def quantize_rows(x: np.ndarray, smooth: np.ndarray, q: np.ndarray, s: np.ndarray) -> None:
    """Per-row symmetric int8 of ``x * smooth`` (``smooth``: per-column factors): q int8, s the row scales."""
    n = x.shape[1]
    g, gi, box, boxf = _row_scratch(n)
    for t in range(x.shape[0]):
        for j in range(n):
            g[j] = x[t, j] * smooth[j]
        _quantize_row(g, gi, box, boxf, q, s, t)


@njit(**_OPTS)
def dequantize_rows(y: np.ndarray, a: np.ndarray, scale: np.ndarray, bias: np.ndarray, out: np.ndarray) -> None:
    """out = y * a[row] * scale[col] + bias (y: the int32 product, a: its rows' activation scales)."""
    for t in range(y.shape[0]):
        at = a[t]
        for j in range(y.shape[1]):
            out[t, j] = np.float32(y[t, j]) * (at * scale[j]) + bias[j]


@njit(**_OPTS)
def dequantize_gelu_quantize(y: np.ndarray, a: np.ndarray, scale: np.ndarray, bias: np.ndarray,
                             smooth: np.ndarray, q: np.ndarray, s: np.ndarray) -> None:
    """The FFN's up-projection epilogue: g = GELU(y * a * scale + bias) * smooth, quantized per row into q, s."""
    n = y.shape[1]
    g, gi, box, boxf = _row_scratch(n)
    for t in range(y.shape[0]):
        at = a[t]
        for j in range(n):
            v = np.float32(y[t, j]) * (at * scale[j]) + bias[j]
            g[j] = np.float32(0.5) * v * (np.float32(1.0) + erf32(v * _SQRT_HALF)) * smooth[j]
        _quantize_row(g, gi, box, boxf, q, s, t)


@njit(**_OPTS)
def dequantize_add_norm_quantize(y: np.ndarray, a: np.ndarray, scale: np.ndarray, bias: np.ndarray,
                                 residual: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float,
                                 smooth: np.ndarray, h: np.ndarray, q: np.ndarray, s: np.ndarray,
                                 quantize: bool) -> None:
    """A residual block's epilogue: h = LayerNorm(y * a * scale + bias + residual); when ``quantize``, h * smooth
    quantized per row into q, s (the next product's input)."""
    n = y.shape[1]
    g, gi, box, boxf = _row_scratch(n)
    inv_n = np.float32(1.0) / np.float32(n)
    for t in range(y.shape[0]):
        at = a[t]
        total = np.float32(0.0)
        for j in range(n):
            v = np.float32(y[t, j]) * (at * scale[j]) + bias[j] + residual[t, j]
            g[j] = v
            total += v
        mean = total * inv_n
        var = np.float32(0.0)
        for j in range(n):
            d = g[j] - mean
            var += d * d
        rstd = np.float32(1.0) / np.sqrt(var * inv_n + np.float32(eps))
        for j in range(n):
            v = (g[j] - mean) * rstd * gamma[j] + beta[j]
            h[t, j] = v
            g[j] = v * smooth[j]
        if quantize:
            _quantize_row(g, gi, box, boxf, q, s, t)
