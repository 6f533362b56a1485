"""One tokenizer for every engine: the converted SmolLM2 folder encodes and decodes a fixed text to the same ids in
the main environment (transformers 4.57), in ``.venv-vllm`` through vLLM's own tokenizer loader (transformers
5.19) and in ``.venv-verl`` (transformers 5.10). Before the conversion fix transformers 5.x loaded the slow
sentencepiece ``LlamaTokenizer`` and dropped every space. Each engine case skips when its environment is absent."""

from __future__ import annotations

import json
import subprocess

import pytest

from infra.engine_envs import engine_env, engine_python

TEXT = ("You're right, I'm not sure.\nNew line  two  spaces\t tab é 日本 "
        "<search> q </search>\n<|im_start|>user\nhi<|im_end|>\n")

LOADERS = {
    "vllm": "from vllm.tokenizers import get_tokenizer\ntok = get_tokenizer(path)\n",
    "verl": "from transformers import AutoTokenizer\ntok = AutoTokenizer.from_pretrained(path)\n",
}


def test_conversion_writes_a_fast_byte_level_tokenizer(smol_path, smol_tokenizer) -> None:
    cfg = json.loads((smol_path / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and not (smol_path / "tokenizer.model").exists()
    assert json.loads((smol_path / "tokenizer.json").read_text())["decoder"]["type"] == "ByteLevel"
    ids = smol_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert smol_tokenizer.decode(ids) == TEXT


@pytest.mark.parametrize("engine", [pytest.param("vllm", marks=pytest.mark.vllm),
                                    pytest.param("verl", marks=pytest.mark.verl)])
def test_engine_environments_read_the_same_ids(engine, smol_path, smol_tokenizer) -> None:
    exe = engine_python(engine)
    if exe is None:
        pytest.skip(f".venv-{engine} not built (make {engine}-env)")
    code = ("import json, sys\npath, text = sys.argv[1], sys.argv[2]\n" + LOADERS[engine]
            + "ids = tok.encode(text, add_special_tokens=False)\n"
            "print(json.dumps({'cls': type(tok).__name__, 'ids': ids, 'text': tok.decode(ids)}))\n")
    out = subprocess.run([str(exe), "-c", code, str(smol_path), TEXT], env=engine_env(), capture_output=True,
                         text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ids"] == smol_tokenizer(TEXT, add_special_tokens=False)["input_ids"], got["cls"]
    assert got["text"] == TEXT
