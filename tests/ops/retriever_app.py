"""A minimal live retriever for the ops fault tests: a real BM25 index served over HTTP (Search-R1 ``/retrieve``).

Stand-in until the retriever server (``retrieval/server.py``, another branch) is merged; it speaks the same
``POST /retrieve`` and ``GET /health`` so the tests switch to ``searchloop serve retriever`` without other changes.
Run: ``python tests/ops/retriever_app.py INDEX_DIR PORT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from retrieval.bm25 import BM25Searcher  # noqa: E402


class RetrieveRequest(BaseModel):
    """Search-R1 request body."""

    queries: list[str]
    topk: int = 3
    return_scores: bool = True


def make_app(index_dir: str) -> FastAPI:
    """App serving one BM25 index directory."""
    searcher = BM25Searcher.load(index_dir)
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "passages": len(searcher.passages)}

    @app.post("/retrieve")
    def retrieve(req: RetrieveRequest) -> dict:
        rows = searcher.search(req.queries, min(max(req.topk, 1), 100))
        return {"result": [[{"document": {"id": h.id, "contents": h.contents}, "score": h.score} for h in hits]
                           for hits in rows]}

    return app


if __name__ == "__main__":
    uvicorn.run(make_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
