"""Fixtures for the rollout tests: the real SmolLM2 tokenizer, a real BM25 index over the mini corpus, and a
scripted generator (a unit-test fake shaped like a real backend: stop strings cut the output, EOS ends it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.generation import Completion, SamplingParams, cut_at_stop


class ScriptedGenerator:
    """Replays scripted model outputs. ``scripts[marker]`` is the list of raw outputs for the trajectory whose
    prompt contains ``marker`` (step i uses item i); each output is cut at the first stop string, like a model
    that stops there. An output ending in ``<EOS>`` finishes with reason ``eos``; otherwise ``length``."""

    eos_token = "<|im_end|>"

    def __init__(self, scripts: dict[str, list[str]], tokenizer=None) -> None:
        self.scripts = scripts
        self.tokenizer = tokenizer
        self.calls: dict[str, int] = {}
        self.batches: list[int] = []

    def _marker(self, prompt: str) -> str:
        hits = [m for m in self.scripts if m in prompt]
        if not hits:
            raise KeyError(f"no script for prompt ending {prompt[-80:]!r}")
        return max(hits, key=len)

    def generate(self, prompts: list[str], sampling: SamplingParams, max_tokens=None) -> list[Completion]:
        self.batches.append(len(prompts))
        out = []
        for p in prompts:
            key = self._marker(p)
            step = self.calls.get(key, 0)
            self.calls[key] = step + 1
            raw = self.scripts[key][min(step, len(self.scripts[key]) - 1)]
            eos = raw.endswith("<EOS>")
            raw = raw.removesuffix("<EOS>")
            text, stop = cut_at_stop(raw, sampling.stop)
            ids = list(range(max(1, len(text) // 4)))
            if stop is not None:
                out.append(Completion(text=text, token_ids=ids, finish_reason="stop", stop=stop))
            else:
                out.append(Completion(text=text, token_ids=ids, finish_reason="eos" if eos else "length"))
        return out


@pytest.fixture(scope="session")
def smol_path() -> Path:
    """The SmolLM2 HF folder (converted from the shipped GGUF once, cached)."""
    from training.models import resolve_model

    return resolve_model("smollm2")


@pytest.fixture(scope="session")
def smol_tokenizer(smol_path):
    """The real SmolLM2 tokenizer (EOS/pad fixed)."""
    from training.models import load_tokenizer

    return load_tokenizer(smol_path)


@pytest.fixture(scope="session")
def bm25(mini_corpus_path):
    """A real BM25 index over the shipped mini corpus."""
    from retrieval.bm25 import BM25Searcher
    from retrieval.corpus import iter_corpus

    return BM25Searcher.build(list(iter_corpus(mini_corpus_path)))
