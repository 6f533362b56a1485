"""BM25 backend on bm25s (sparse matrices, numpy scoring): build, save, load, batched search.

bm25s was chosen over pyserini: it is pure Python + numpy (pyserini needs a JVM), builds the 15.6k-passage
multi-hop corpus in about a second here and scores a batch of queries in one call.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from retrieval.types import Hit, Passage

STOPWORDS = "en"


def _tokenize(texts: list[str]) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(texts, stopwords=STOPWORDS, return_ids=False, show_progress=False)


class BM25Searcher:
    """A bm25s index plus the passage store. Scores are BM25 (k1=1.2, b=0.75 by default)."""

    name = "bm25"

    def __init__(self, retriever: object, passages: list[Passage]) -> None:
        self._retriever = retriever
        self.passages = passages

    @classmethod
    def build(cls, passages: list[Passage], k1: float = 1.2, b: float = 0.75) -> BM25Searcher:
        """Index ``passages`` (title + text)."""
        import bm25s

        if not passages:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        retriever = bm25s.BM25(k1=k1, b=b)
        retriever.index(_tokenize([p.contents for p in passages]), show_progress=False)
        return cls(retriever, passages)

    def save(self, directory: str | os.PathLike[str], write_passages: bool = True) -> None:
        """Save the index and passages into a local directory (caller writes the manifest).

        Args:
            directory: target directory.
            write_passages: also write ``passages.jsonl``; pass False when a passage store with the same rows
                (``retrieval.store``) is already there.
        """
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self._retriever.save(str(d / "bm25s"))
        if write_passages:
            (d / "passages.jsonl").write_bytes(b"".join(orjson.dumps(p.model_dump()) + b"\n" for p in self.passages))

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> BM25Searcher:
        """Load an index saved by :meth:`save`."""
        import bm25s

        d = Path(directory)
        retriever = bm25s.BM25.load(str(d / "bm25s"))
        passages = [Passage(**orjson.loads(line)) for line in (d / "passages.jsonl").read_bytes().splitlines()]
        return cls(retriever, passages)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Batched BM25 search; queries with no known token return no hits."""
        if not queries:
            return []
        k = max(1, min(k, len(self.passages)))
        tokens = _tokenize(queries)
        out: list[list[Hit]] = [[] for _ in queries]
        nonempty = [i for i, t in enumerate(tokens) if t]
        if not nonempty:
            return out
        docs, scores = self._retriever.retrieve(
            [tokens[i] for i in nonempty], k=k, show_progress=False, n_threads=0
        )
        for row, i in enumerate(nonempty):
            hits = []
            for idx, score in zip(docs[row], scores[row], strict=True):
                if score <= 0:
                    continue
                p = self.passages[int(idx)]
                hits.append(Hit(id=p.id, title=p.title, text=p.text, score=float(score)))
            out[i] = hits
        return out
