"""Wire formats of the retriever server: request models and response shapes, one per seed/anchor client.

Each request model matches what that family of clients sends; each ``*_response`` function builds exactly what
their client code parses (checked against the upstream sources named in ``shared/notes/seeds.md``):

- FlashRAG / ReSearch / SmartSearch: ``POST /search`` and ``POST /batch_search``. Without scores a doc list
  (or list of doc lists); with scores the pair ``[docs, scores]`` (FastAPI serialises their tuple as a list).
- Search-R1 / verl search tool / ASearcher: ``POST /retrieve`` -> ``{"result": [[{"document", "score"}]]}`` with
  scores, ``{"result": [[doc]]}`` without (Search-R1 returns the bare corpus rows then).
- R1-Searcher: ``POST /queries`` -> ``{"queries", "answers": [[contents]]}``.
- ExSearch (ColBERT Flask server): ``GET /api/search?query&k`` -> ``{"query", "topk": [{"text": "title | passage",
  "pid", "rank", "score", "prob"}]}``; ``prob`` is a softmax over the returned scores, ranks start at 1.
- searchloop's own ``POST /v1/search`` (used by :class:`retrieval.client.RetrieverClient`): full hits.

A document is ``{"id", "contents"}`` with contents = ``"Title"\\ntext`` (:attr:`retrieval.types.Hit.contents`).
Types are strict (``"5"`` is not an int, ``1`` is not a string) so wrong types are rejected, not coerced.
Size and range limits (k cap, query count and length) are server configuration, checked in ``retrieval.server``.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from retrieval.types import Hit

Doc = dict[str, str]


class _Request(BaseModel):
    """Base of the request bodies: unknown keys are ignored (clients add their own), types are strict."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class SearchRequest(_Request):
    """FlashRAG/ReSearch/SmartSearch ``POST /search``."""

    query: StrictStr = Field(description="One query.")
    top_n: StrictInt = Field(default=10, description="Number of documents to return.")
    return_score: StrictBool = Field(default=False, description="Return ``[docs, scores]`` instead of ``docs``.")


class BatchSearchRequest(_Request):
    """FlashRAG/ReSearch ``POST /batch_search``."""

    query: list[StrictStr] = Field(description="The queries of the batch.")
    top_n: StrictInt = Field(default=10, description="Number of documents per query.")
    return_score: StrictBool = Field(default=False, description="Return ``[doc_lists, score_lists]``.")


class RetrieveRequest(_Request):
    """Search-R1 / verl search tool / ASearcher ``POST /retrieve``."""

    queries: list[StrictStr] = Field(description="The queries of the batch.")
    topk: StrictInt | None = Field(default=None, description="Documents per query; the server default when null.")
    return_scores: StrictBool = Field(default=False, description="Wrap each doc as ``{document, score}``.")


class QueriesRequest(_Request):
    """R1-Searcher ``POST /queries``."""

    queries: list[StrictStr] = Field(description="The queries of the batch.")
    k: StrictInt | None = Field(default=None, description="Documents per query; the server default when null.")


class V1SearchRequest(_Request):
    """searchloop ``POST /v1/search``: the richest format (ids, titles, texts, scores)."""

    queries: list[StrictStr] = Field(description="The queries of the batch.")
    k: StrictInt = Field(default=10, description="Hits per query.")


class HitOut(BaseModel):
    """One hit of ``/v1/search``."""

    id: str = Field(description="Passage id.")
    title: str = Field(description="Passage title.")
    text: str = Field(description="Passage text without the title.")
    score: float = Field(description="Backend score; higher is better.")


class V1SearchResponse(BaseModel):
    """Response of ``/v1/search``."""

    results: list[list[HitOut]] = Field(description="For each query, its hits by descending score.")


class DocOut(BaseModel):
    """A FlashRAG/Search-R1 document."""

    id: str = Field(description="Passage id.")
    contents: str = Field(description='``"Title"\\ntext``.')


class ScoredDocOut(BaseModel):
    """A Search-R1 scored document."""

    document: DocOut = Field(description="The document.")
    score: float = Field(description="Backend score.")


class RetrieveResponse(BaseModel):
    """Response of ``/retrieve`` (scored form; without scores each entry is a bare document)."""

    result: list[list[ScoredDocOut | DocOut]] = Field(description="For each query, its documents.")


class QueriesResponse(BaseModel):
    """Response of ``/queries``."""

    queries: list[str] = Field(description="The queries, echoed.")
    answers: list[list[str]] = Field(description="For each query, the contents of its documents.")


class ExSearchItem(BaseModel):
    """One ExSearch result."""

    text: str = Field(description="``title | passage``.")
    pid: str = Field(description="Passage id.")
    rank: int = Field(description="1-based rank.")
    score: float = Field(description="Backend score.")
    prob: float = Field(description="Softmax of the score over the returned hits.")


class ExSearchResponse(BaseModel):
    """Response of ``GET /api/search``."""

    query: str = Field(description="The query, echoed.")
    topk: list[ExSearchItem] = Field(description="Hits by descending score.")


def doc(hit: Hit) -> Doc:
    """FlashRAG/Search-R1 document of a hit."""
    return {"id": hit.id, "contents": hit.contents}


def search_response(hits: list[Hit], with_scores: bool) -> Any:
    """``/search`` body: ``docs`` or ``[docs, scores]``."""
    docs = [doc(h) for h in hits]
    return [docs, [h.score for h in hits]] if with_scores else docs


def batch_search_response(results: list[list[Hit]], with_scores: bool) -> Any:
    """``/batch_search`` body: ``doc_lists`` or ``[doc_lists, score_lists]``."""
    docs = [[doc(h) for h in hits] for hits in results]
    return [docs, [[h.score for h in hits] for hits in results]] if with_scores else docs


def retrieve_response(results: list[list[Hit]], with_scores: bool) -> dict[str, Any]:
    """``/retrieve`` body: ``{"result": [[{"document", "score"}]]}`` or ``{"result": [[doc]]}``."""
    if with_scores:
        return {"result": [[{"document": doc(h), "score": h.score} for h in hits] for hits in results]}
    return {"result": [[doc(h) for h in hits] for hits in results]}


def queries_response(queries: list[str], results: list[list[Hit]]) -> dict[str, Any]:
    """``/queries`` body: ``{"queries", "answers": [[contents]]}``."""
    return {"queries": queries, "answers": [[h.contents for h in hits] for hits in results]}


def softmax(scores: list[float]) -> list[float]:
    """Numerically stable softmax (empty in, empty out)."""
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def exsearch_response(query: str, hits: list[Hit]) -> dict[str, Any]:
    """``/api/search`` body with ExSearch's ``title | passage`` text and softmax ``prob``."""
    probs = softmax([h.score for h in hits])
    topk = [
        {"text": f"{h.title} | {h.text}", "pid": h.id, "rank": rank, "score": h.score, "prob": prob}
        for rank, (h, prob) in enumerate(zip(hits, probs, strict=True), 1)
    ]
    return {"query": query, "topk": topk}


def v1_response(results: list[list[Hit]]) -> dict[str, Any]:
    """``/v1/search`` body: full hits."""
    return {"results": [[h.model_dump() for h in hits] for hits in results]}
