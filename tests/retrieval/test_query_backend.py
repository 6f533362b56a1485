"""Query encoders under ONNX Runtime (``EncoderConfig.query_backend``, issue 26 item 7): the export is made once and
reused, queries stay close to torch's vectors, passages never change, and the setting reaches a loaded index, the
retriever spec and the server's command line."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from retrieval.encoders import INT8_WEIGHTS, EncoderConfig, config_fingerprint, onnx_file, quantization_target
from retrieval.index import IndexBuildConfig, build_index, load_searcher
from retrieval.open import RetrieverSpec

QUERIES = ["Were Scott Derrickson and Ed Wood of the same nationality?", "who directed the film Ed Wood",
           "When was the director of Doctor Strange born?", "rock band from Illinois", "food", "baby"]


def test_query_backend_is_not_part_of_the_fingerprint_and_is_checked() -> None:
    assert config_fingerprint(EncoderConfig(query_backend="onnx-int8")) == config_fingerprint(EncoderConfig())
    with pytest.raises(ValueError, match="query_backend"):
        EncoderConfig(query_backend="int4")
    with pytest.raises(ValueError, match="query_backend"):
        RetrieverSpec(index="some/dir", query_backend="tensorrt")
    assert onnx_file("onnx") == "onnx/model.onnx"
    target = quantization_target()
    assert target in ("avx512_vnni", "avx512", "avx2", "arm64")
    assert onnx_file("onnx-int8") == f"onnx/model_{INT8_WEIGHTS[target]}_{target}.onnx"


def test_int8_file_names_follow_optimums_weight_types() -> None:
    """The int8 file's name carries optimum's weight type for the target (unsigned on AVX2): a wrong name made
    every AVX2-only CPU re-export and fail to load (session 42)."""
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    for target, weights in INT8_WEIGHTS.items():
        config = getattr(AutoQuantizationConfig, target)(is_static=False)
        assert config.weights_dtype.name.lower() == weights, target


def test_unset_query_backend_leaves_dumps_and_keys_unchanged() -> None:
    """At their defaults the new fields are left out of dumps: index config hashes and run keys stay as they were."""
    from infra.config import load_config
    from training.rl.config import RLConfig

    assert "query_backend" not in EncoderConfig().model_dump()
    assert EncoderConfig(query_backend="onnx").model_dump()["query_backend"] == "onnx"
    assert "query_backend" not in RetrieverSpec(index="some/dir").model_dump()
    assert RetrieverSpec(index="d", query_backend="onnx-int8").model_dump()["query_backend"] == "onnx-int8"
    cfg = load_config(RLConfig, "research_hops_learn_cpu", [])
    assert "query_backend" not in cfg.model_dump(mode="json")["retrieval"]


def test_cli_refuses_an_unknown_query_backend() -> None:
    result = CliRunner().invoke(app, ["serve", "retriever", "--corpus", "data/corpus/mini.jsonl",
                                      "--query-backend", "tensorrt"], env={"COLUMNS": "200"})
    assert result.exit_code != 0
    assert "torch, torch-int8, onnx, onnx-int8" in result.output
    bm25 = CliRunner().invoke(app, ["serve", "retriever", "--corpus", "data/corpus/mini.jsonl",
                                    "--query-backend", "onnx-int8"], env={"COLUMNS": "200"})
    assert bm25.exit_code != 0 and "BM25 over --corpus has no query encoder" in bm25.output


@pytest.mark.slow
def test_onnx_query_encoders_export_once_and_stay_close_to_torch(tmp_path, monkeypatch) -> None:
    from infra.settings import get_settings
    from retrieval.encoders import SentenceTransformerEncoder

    monkeypatch.setenv("SEARCHLOOP_MODEL_CACHE", str(tmp_path / "cache"))
    get_settings.cache_clear()
    try:
        torch_enc = SentenceTransformerEncoder(EncoderConfig(dtype="float32"))
        ref_q, ref_p = torch_enc.encode(QUERIES, "query"), torch_enc.encode(QUERIES, "passage")
        fp32 = SentenceTransformerEncoder(EncoderConfig(dtype="float32", query_backend="onnx"))
        int8 = SentenceTransformerEncoder(EncoderConfig(dtype="float32", query_backend="onnx-int8"))
        (folder,) = (tmp_path / "cache" / "onnx").iterdir()  # one export folder holds both files
        exported = folder / onnx_file("onnx-int8")
        stamp = exported.stat().st_mtime_ns
        q32, q8 = fp32.encode(QUERIES, "query"), int8.encode(QUERIES, "query")
        assert q32.dtype == q8.dtype == np.float32 and q32.shape == q8.shape == ref_q.shape
        assert np.allclose(np.linalg.norm(q8, axis=1), 1.0, atol=1e-5)
        assert (q32 * ref_q).sum(1).min() > 0.9999  # the same fp32 weights under another runtime
        assert (q8 * ref_q).sum(1).min() > 0.95     # int8 weights: close, not equal (recall measured per setting)
        assert np.array_equal(int8.encode(QUERIES, "passage"), ref_p)  # passages always go through torch
        SentenceTransformerEncoder(EncoderConfig(query_backend="onnx-int8"))
        assert exported.stat().st_mtime_ns == stamp and len(list((tmp_path / "cache" / "onnx").iterdir())) == 1
    finally:
        get_settings.cache_clear()


@pytest.mark.slow
def test_a_loaded_index_takes_the_query_backend_and_keeps_its_manifest(mini_corpus_path, tmp_path,
                                                                        monkeypatch) -> None:
    from infra.settings import get_settings

    monkeypatch.setenv("SEARCHLOOP_MODEL_CACHE", str(tmp_path / "cache"))
    get_settings.cache_clear()
    try:
        ref = build_index(IndexBuildConfig(corpus=str(mini_corpus_path), backend="dense", limit=60, shard_size=32),
                          tmp_path / "index")
        manifest = (tmp_path / "index" / "manifest.json").read_bytes()
        base = load_searcher(ref.uri)
        quick = load_searcher(ref.uri, "onnx-int8")
        assert base.encoder.cfg.query_backend == "torch" and quick.encoder.cfg.query_backend == "onnx-int8"
        top = [h.id for h in base.search(QUERIES[:1], 5)[0]]
        got = [h.id for h in quick.search(QUERIES[:1], 5)[0]]
        assert {"mhw-1", "mhw-4"} & set(got) and got[0] == top[0]
        assert (tmp_path / "index" / "manifest.json").read_bytes() == manifest
    finally:
        get_settings.cache_clear()
