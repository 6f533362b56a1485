"""Hybrid retrieval: reciprocal-rank fusion (Cormack et al., 2009) of any two Searchers.

score(d) = sum over the two rankings of 1 / (rrf_k + rank(d)), ranks from 1; a passage missing from a ranking adds
nothing. Each backend is asked for ``max(k, candidates)`` hits, in one batched call per backend.
"""

from __future__ import annotations

from pydantic import Field

from infra.config import StrictModel
from retrieval.types import Hit, Searcher


class HybridConfig(StrictModel):
    """Which two backends to fuse and how."""

    first: str = Field(default="bm25", description="First backend (bm25, dense or colbert).")
    second: str = Field(default="dense", description="Second backend (bm25, dense or colbert).")
    rrf_k: int = Field(default=60, ge=1, description="RRF constant k in 1/(k + rank).")
    candidates: int = Field(default=50, ge=1, description="Hits fetched from each backend before fusion.")


def rrf_fuse(rankings: list[list[Hit]], k: int, rrf_k: int = 60) -> list[Hit]:
    """Fuse several rankings of one query; returns the top ``k`` hits with the fused score."""
    scores: dict[str, float] = {}
    first_seen: dict[str, Hit] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, 1):
            scores[hit.id] = scores.get(hit.id, 0.0) + 1.0 / (rrf_k + rank)
            first_seen.setdefault(hit.id, hit)
    order = sorted(scores, key=lambda pid: (-scores[pid], pid))[:k]
    return [first_seen[pid].model_copy(update={"score": scores[pid]}) for pid in order]


class HybridSearcher:
    """Reciprocal-rank fusion of two Searchers."""

    name = "hybrid"

    def __init__(self, first: Searcher, second: Searcher, rrf_k: int = 60, candidates: int = 50) -> None:
        if rrf_k < 1:
            raise ValueError(f"rrf_k must be >= 1, got {rrf_k}")
        self.first, self.second, self.rrf_k, self.candidates = first, second, rrf_k, candidates

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` fused hits per query."""
        if not queries:
            return []
        depth = max(k, self.candidates)
        a = self.first.search(queries, depth)
        b = self.second.search(queries, depth)
        return [rrf_fuse([ra, rb], k, self.rrf_k) for ra, rb in zip(a, b, strict=True)]
