"""Model resolution and loading: names, HF folders, GGUF conversion (atomic, cached) with fixed special tokens."""

from __future__ import annotations

import os

import orjson
import pytest

from infra.errors import ConfigError
from training.generation import models


def test_unknown_model_names_the_fix(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not a known name"):
        models.resolve_model("gpt-17", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="not a known name"):
        models.resolve_model(tmp_path, cache_dir=tmp_path)  # a folder without config.json


def test_hf_folder_resolves_to_itself(smol_path) -> None:
    assert models.resolve_model(smol_path) == smol_path


def test_smollm2_tokens_are_fixed(smol_path, smol_tokenizer) -> None:
    assert models.resolve_model("smollm2") == smol_path
    assert smol_tokenizer.eos_token == "<|im_end|>" and smol_tokenizer.pad_token == "<|im_end|>"
    assert smol_tokenizer("hi")["input_ids"][0] != smol_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert smol_tokenizer.padding_side == "left"
    cfg = orjson.loads((smol_path / "generation_config.json").read_bytes())
    assert cfg["eos_token_id"] == smol_tokenizer.eos_token_id == 2


def test_gguf_special_tokens_are_read_from_the_file() -> None:
    special = models.gguf_special_tokens(models.smollm2_gguf())
    assert special == {"eos": 2, "pad": 2, "bos": 1, "add_bos": False}


def test_conversion_is_atomic(tmp_path, monkeypatch) -> None:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")

    def broken(src, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        models.resolve_model(gguf, cache_dir=tmp_path / "cache")
    assert os.listdir(tmp_path / "cache") == []  # no half-written folder, no temp left

    def ok(src, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "convert_gguf", ok)
    target = models.resolve_model(gguf, cache_dir=tmp_path / "cache")
    assert (target / "config.json").exists() and target.name.startswith("tiny-")
    assert models.resolve_model(gguf, cache_dir=tmp_path / "cache") == target  # cached, not converted again
    assert os.listdir(tmp_path / "cache") == [target.name]


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("SEARCHLOOP_TEST_GGUF_CONVERSION"),
    reason="converts the GGUF again (~40 s idle, ~2 min on the shared CI cores); set SEARCHLOOP_TEST_GGUF_CONVERSION=1",
)
def test_real_gguf_conversion(tmp_path) -> None:
    out = tmp_path / "smol"
    models.convert_gguf(models.smollm2_gguf(), out)
    tok = models.load_tokenizer(out)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>"
    assert tok("x")["input_ids"][0] != 1  # no BOS added
    assert orjson.loads((out / models.MARKER).read_bytes())["special_tokens"]["eos"] == 2
