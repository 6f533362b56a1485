"""ColBERT late interaction: a real PyLate+Voyager index over 200 mini passages (CPU), PLAID on GPU workers."""

from __future__ import annotations

import os

import pytest

from infra.errors import ConfigError
from retrieval.colbert import ColbertConfig, ColbertSearcher
from retrieval.index import IndexBuildConfig, build_index, load_searcher


@pytest.fixture(scope="module")
def colbert_index(tmp_path_factory, mini_corpus_path):
    out = tmp_path_factory.mktemp("colbert")
    cfg = IndexBuildConfig(corpus=str(mini_corpus_path), backend="colbert", limit=200)
    return build_index(cfg, out)


@pytest.mark.slow
def test_colbert_builds_and_searches(colbert_index) -> None:
    assert colbert_index.backend == "colbert" and colbert_index.n_passages == 200
    assert colbert_index.params["engine"] == "pylate-voyager" and colbert_index.params["n_token_vectors"] > 200 * 10
    searcher = load_searcher(colbert_index.uri)
    assert isinstance(searcher, ColbertSearcher)
    queries = ["Scott Derrickson horror film director", "Shirley Temple Chief of Protocol", "zzz"]
    results = searcher.search(queries, 5)
    assert [len(r) for r in results] == [5, 5, 5]
    assert all(r[i].score >= r[i + 1].score for r in results for i in range(4))
    ids = {p for r in results for p in (h.id for h in r)}
    assert all(p.startswith("mhw-") for p in ids)
    # the saved (randomly initialised) projection makes a reloaded searcher rank exactly like the first one
    again = load_searcher(colbert_index.uri).search(queries[:1], 5)
    assert [h.id for h in again[0]] == [h.id for h in results[0]]
    assert searcher.search([], 5) == []


@pytest.mark.slow
def test_colbert_ranks_exact_title_match_high(colbert_index) -> None:
    searcher = load_searcher(colbert_index.uri)
    hits = searcher.search(["Scott Derrickson"], 10)[0]
    assert "mhw-1" in [h.id for h in hits]  # the "Scott Derrickson" passage


def test_plaid_refuses_untrained_checkpoint(mini_corpus_path, tmp_path) -> None:
    cfg = IndexBuildConfig(corpus=str(mini_corpus_path), backend="colbert", limit=20,
                           colbert=ColbertConfig(engine="colbert-plaid"))
    with pytest.raises(ConfigError, match="trained ColBERT checkpoint"):
        build_index(cfg, tmp_path)


@pytest.mark.gpu
def test_plaid_on_gpu(mini_corpus_path, tmp_path) -> None:
    checkpoint = os.environ.get("SEARCHLOOP_COLBERT_CHECKPOINT")
    if not checkpoint:
        pytest.skip("set SEARCHLOOP_COLBERT_CHECKPOINT to a trained ColBERT checkpoint (e.g. colbertv2.0)")
    cfg = IndexBuildConfig(corpus=str(mini_corpus_path), backend="colbert", limit=200,
                           colbert=ColbertConfig(engine="colbert-plaid", model=checkpoint))
    ref = build_index(cfg, tmp_path)
    hits = load_searcher(ref.uri).search(["Were Scott Derrickson and Ed Wood of the same nationality?"], 5)[0]
    assert {"mhw-1", "mhw-4"} & {h.id for h in hits}
