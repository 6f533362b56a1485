"""Fixtures of the RL engine's tests: a tiny random Llama with SmolLM2's architecture and tokenizer."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama (SmolLM2's architecture and tokenizer) saved as an HF folder (read-only for tests)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    from training.generation.models import load_tokenizer, resolve_model

    smol = resolve_model("smollm2")
    cfg = AutoConfig.from_pretrained(str(smol))
    cfg.update({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 8, "tie_word_embeddings": True})
    torch.manual_seed(0)
    model_dir = tmp_path_factory.mktemp("tiny")
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(model_dir))
    load_tokenizer(smol).save_pretrained(str(model_dir))
    return model_dir
