"""Reciprocal-rank fusion: exact scores on a hand-made case, and a real BM25+dense hybrid index."""

from __future__ import annotations

import pytest

from retrieval.hybrid import HybridConfig, HybridSearcher, rrf_fuse
from retrieval.index import IndexBuildConfig, build_index, load_searcher
from retrieval.types import Hit


def _hits(*ids: str) -> list[Hit]:
    return [Hit(id=i, text=i, score=10.0 - n) for n, i in enumerate(ids)]


class ListSearcher:
    name = "list"

    def __init__(self, ranking: list[str]) -> None:
        self.ranking = ranking
        self.calls: list[tuple[int, int]] = []

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.calls.append((len(queries), k))
        return [_hits(*self.ranking[:k]) for _ in queries]


def test_rrf_scores() -> None:
    fused = rrf_fuse([_hits("a", "b", "c"), _hits("c", "a")], k=3, rrf_k=60)
    assert [h.id for h in fused] == ["a", "c", "b"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62)
    assert fused[1].score == pytest.approx(1 / 63 + 1 / 61)
    assert fused[2].score == pytest.approx(1 / 62)
    assert [h.id for h in rrf_fuse([_hits("x"), _hits("y")], k=1, rrf_k=1)] == ["x"]  # tie -> by id


def test_hybrid_searcher_batches_each_backend_once() -> None:
    a, b = ListSearcher(["p1", "p2", "p3"]), ListSearcher(["p3", "p4"])
    out = HybridSearcher(a, b, rrf_k=60, candidates=10).search(["q1", "q2"], 2)
    assert a.calls == [(2, 10)] and b.calls == [(2, 10)]
    assert [h.id for h in out[0]] == ["p3", "p1"] and len(out) == 2
    with pytest.raises(ValueError):
        HybridSearcher(a, b, rrf_k=0)


def test_hybrid_index_over_bm25_and_dense(mini_corpus_path, tmp_path, hashing_encoder) -> None:
    cfg = IndexBuildConfig(corpus=str(mini_corpus_path), backend="hybrid", limit=300, shard_size=100,
                           hybrid=HybridConfig(first="bm25", second="dense", rrf_k=60, candidates=20))
    ref = build_index(cfg, tmp_path)
    assert ref.backend == "hybrid" and ref.params["parts"] == ["bm25", "dense"]
    assert (tmp_path / "bm25" / "manifest.json").exists() and (tmp_path / "dense" / "manifest.json").exists()
    searcher = load_searcher(tmp_path)
    assert isinstance(searcher, HybridSearcher)
    q = ["Were Scott Derrickson and Ed Wood of the same nationality?"]
    fused = searcher.search(q, 5)[0]
    bm25 = load_searcher(tmp_path / "bm25").search(q, 20)[0]
    dense = load_searcher(tmp_path / "dense").search(q, 20)[0]
    assert [h.id for h in fused] == [h.id for h in rrf_fuse([bm25, dense], 5, 60)]
