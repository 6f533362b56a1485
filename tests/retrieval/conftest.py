"""Fixtures for the index tests: a deterministic hashing encoder (a fake shaped like the real Encoder)."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest


class HashingEncoder:
    """Bag-of-words feature hashing into ``dim`` buckets, L2-normalized; counts calls and encoded texts."""

    def __init__(self, dim: int = 64, fail_on_call: int | None = None) -> None:
        self.dim = dim
        self.fingerprint = f"hashing-{dim}"
        self.calls = 0
        self.texts = 0
        self.fail_on_call = fail_on_call

    def encode(self, texts: list[str], kind: str) -> np.ndarray:
        self.calls += 1
        if self.fail_on_call is not None and self.calls == self.fail_on_call:
            raise RuntimeError(f"simulated crash on encoder call {self.calls}")
        self.texts += len(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for tok in re.findall(r"\w+", text.lower()):
                out[i, int(hashlib.md5(tok.encode()).hexdigest()[:8], 16) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-9)


@pytest.fixture
def hashing_encoder(monkeypatch) -> HashingEncoder:
    """A HashingEncoder that ``retrieval.dense``/``retrieval.index`` get instead of loading a real model."""
    enc = HashingEncoder()
    monkeypatch.setattr("retrieval.dense.get_encoder", lambda cfg: enc)
    monkeypatch.setattr("retrieval.encoders.get_encoder", lambda cfg: enc)
    return enc
