"""A query encoder distilled into a dense index's space (``retrieval.distill``, ``EncoderConfig.query_model``, issue 26
item 7): it keeps every other layer, trains on training questions only, is written whole or not at all, is refused
for another encoder, and reaches a loaded index, the retriever spec and the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from flows.cli import app
from infra.errors import ArtifactError, ConfigError
from retrieval.encoders import EncoderConfig, config_fingerprint
from retrieval.open import RetrieverSpec

QUERIES = ["Were Scott Derrickson and Ed Wood of the same nationality?", "who directed the film Ed Wood",
           "When was the director of Doctor Strange born?", "rock band from Illinois", "food", "baby"]


def test_query_model_is_not_part_of_the_fingerprint_nor_of_unset_dumps() -> None:
    assert config_fingerprint(EncoderConfig(query_model="some/dir")) == config_fingerprint(EncoderConfig())
    assert "query_model" not in EncoderConfig().model_dump()
    assert "query_model" not in RetrieverSpec(index="d").model_dump()
    assert RetrieverSpec(index="d", query_model="s").model_dump()["query_model"] == "s"


def test_training_queries_read_questions_and_titles_and_refuse_missing_files(tmp_path) -> None:
    from retrieval.distill import training_queries

    qs = tmp_path / "q.jsonl"
    qs.write_text('{"question": "who  directed Ed Wood"}\n{"question": "who directed Ed Wood"}\n{"question": ""}\n')
    titles = tmp_path / "c.jsonl"
    titles.write_text('{"title": "Ed Wood", "text": "x"}\n')
    assert training_queries([str(qs)], [str(titles)]) == ["who directed Ed Wood", "Ed Wood"]
    assert training_queries([str(qs)], [str(titles)], limit=1) == ["who directed Ed Wood"]
    with pytest.raises(ConfigError, match="does not exist"):
        training_queries([str(tmp_path / "none.jsonl")], [])


def test_cli_refuses_query_model_without_a_dense_index(tmp_path) -> None:
    runner = CliRunner()
    bm25 = runner.invoke(app, ["serve", "retriever", "--corpus", "data/corpus/mini.jsonl", "--query-model",
                               str(tmp_path)], env={"COLUMNS": "200"})
    assert bm25.exit_code != 0 and "BM25 over --corpus has no query encoder" in bm25.output
    missing = runner.invoke(app, ["index", "distill-queries", "--index", str(tmp_path / "none"), "--out",
                                  str(tmp_path / "s")], env={"COLUMNS": "200"})
    assert missing.exit_code != 0 and "missing or incomplete" in str(missing.exception)  # the CLI's main: exit 2


@pytest.mark.slow
def test_distilled_query_encoder_trains_loads_and_is_refused_for_another_encoder(tmp_path, mini_corpus_path) -> None:
    from retrieval.distill import distill_query_encoder
    from retrieval.encoders import SentenceTransformerEncoder
    from retrieval.index import IndexBuildConfig, build_index, load_searcher

    out = tmp_path / "student"
    teacher = EncoderConfig(dtype="float32")
    manifest = distill_query_encoder(teacher, out, epochs=2, limit=400, heldout=64, batch_size=32)
    assert manifest["kind"] == "distilled-query-encoder" and manifest["layers"] == [0, 2, 4]
    assert manifest["teacher_fingerprint"] == config_fingerprint(teacher) and manifest["n_train"] == 336
    assert json.loads((out / "manifest.json").read_text())["files"]  # written last, listing the model's files
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]  # the temporary folder was renamed
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3
    assert 0 < manifest["heldout_cosine_min"] <= manifest["heldout_cosine_mean"] <= 1.0
    assert manifest["heldout_cosine_mean"] > 0.6  # two short epochs here; the declared run trains ~940 steps
    with pytest.raises(ConfigError, match="exists"):
        distill_query_encoder(teacher, out, epochs=1, limit=400)
    with pytest.raises(ConfigError, match="layers"):
        distill_query_encoder(teacher, tmp_path / "bad", layers=[0, 9], epochs=1, limit=400, heldout=64)
    assert not (tmp_path / "bad").exists()

    full = SentenceTransformerEncoder(teacher)
    small = SentenceTransformerEncoder(teacher.model_copy(update={"query_model": str(out)}))
    q, ref = small.encode(QUERIES, "query"), full.encode(QUERIES, "query")
    assert q.shape == ref.shape and np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert (q * ref).sum(1).mean() > 0.5  # trained towards the teacher (one short epoch here)
    assert np.array_equal(small.encode(QUERIES, "passage"), full.encode(QUERIES, "passage"))  # passages: the teacher
    with pytest.raises(ConfigError, match="distilled from"):
        SentenceTransformerEncoder(EncoderConfig(dtype="float32", max_length=64, query_model=str(out)))
    with pytest.raises(ArtifactError, match="searchloop index distill-queries"):
        SentenceTransformerEncoder(teacher.model_copy(update={"query_model": str(tmp_path / "none")}))

    ref_index = build_index(IndexBuildConfig(corpus=str(mini_corpus_path), backend="dense", limit=60),
                            tmp_path / "dense")
    searcher = load_searcher(ref_index.uri, None, str(out))
    assert searcher.encoder._query_model is not searcher.encoder._model
    assert len(searcher.search(QUERIES[:2], 3)[0]) == 3
    result = CliRunner().invoke(app, ["index", "eval", ref_index.uri, "--query-model", str(out), "--ks", "1"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
