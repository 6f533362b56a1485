"""Adding a retriever backend is one class plus one table line: a toy word-overlap backend registered from this test.

Nothing in the library names it: the table line is added with ``monkeypatch.setitem`` (in the library it is one
line in ``retrieval/index_config.py``). It is then built, opened, updated, and fused into a hybrid index by the
same code that serves bm25/dense/colbert (docs/extending.md walks through it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from infra.artifacts import read_manifest
from retrieval.backends import IndexBackend
from retrieval.dense import ShardRef
from retrieval.index import IndexBuildConfig, build_index, load_searcher
from retrieval.index_config import INDEX_BACKENDS
from retrieval.store import PassageStore
from retrieval.types import Hit, Searcher
from retrieval.update import update_index

ROWS = [
    {"id": "a", "title": "Lighthouse", "text": "The lighthouse keeper lit the lamp at dusk."},
    {"id": "b", "title": "Glacier", "text": "A glacier carved the valley over ten thousand years."},
    {"id": "c", "title": "Tram", "text": "The night tram climbs the glacier valley."},
]


class OverlapSearcher:
    """Ranks passages by how many query words they contain."""

    name = "overlap"

    def __init__(self, store: PassageStore, words: list[list[str]]) -> None:
        self.store, self.words = store, [set(w) for w in words]

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        out = []
        for q in queries:
            qw = set(q.lower().split())
            scored = sorted(((len(qw & w), i) for i, w in enumerate(self.words)), key=lambda s: (-s[0], s[1]))[:k]
            out.append([Hit(id=(p := self.store[i]).id, title=p.title, text=p.text, score=float(s))
                        for s, i in scored])
        return out


class OverlapBackend(IndexBackend):
    """The whole backend: build writes one file next to the passage store, open reads it back."""

    def build(self, cfg: IndexBuildConfig, out: Path, shards: list[ShardRef]) -> dict[str, Any]:
        words = [sorted(set(p.contents.lower().replace(".", "").split())) for p in PassageStore(out)]
        (out / "overlap.json").write_text(json.dumps(words))
        return {"vocabulary": len({w for ws in words for w in ws})}

    def open(self, d: Path, cfg: IndexBuildConfig, parts: list[Searcher]) -> Searcher:
        return OverlapSearcher(PassageStore(d), json.loads((d / "overlap.json").read_text()))


@pytest.fixture
def overlap(monkeypatch) -> str:
    monkeypatch.setitem(INDEX_BACKENDS, "overlap", f"{__name__}:OverlapBackend")
    return "overlap"


def _corpus(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_unregistered_backend_is_a_config_error_listing_the_table() -> None:
    with pytest.raises(ValidationError, match="unknown index backend 'overlap'.*bm25"):
        IndexBuildConfig(corpus="x.jsonl", backend="overlap")


def test_toy_backend_builds_opens_and_updates(overlap, tmp_path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl", ROWS)
    cfg = IndexBuildConfig(corpus=str(corpus), backend=overlap)
    ref = build_index(cfg, tmp_path / "v1")
    assert ref.backend == "overlap" and ref.n_passages == 3 and ref.params["vocabulary"] > 10
    assert read_manifest(tmp_path / "v1")["backend"] == "overlap"
    hits = load_searcher(tmp_path / "v1").search(["lighthouse lamp"], 2)
    assert hits[0][0].id == "a"

    _corpus(corpus, [*ROWS[1:], {"id": "d", "title": "Quokka", "text": "Quokka festival in June."}])
    upd = update_index(cfg, tmp_path / "v1", tmp_path / "v2")  # the default update: rebuild from the new store
    c = upd.counts
    assert upd.method == "incremental" and (c.added, c.deleted, c.unchanged) == (1, 1, 2)
    assert upd.how == "overlap: rebuilt from the store"
    assert load_searcher(tmp_path / "v2").search(["quokka festival"], 1)[0][0].id == "d"


def test_toy_backend_is_a_hybrid_part(overlap, tmp_path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl", ROWS)
    cfg = IndexBuildConfig(corpus=str(corpus), backend="hybrid", hybrid={"first": "bm25", "second": overlap})
    ref = build_index(cfg, tmp_path / "h")
    assert ref.params["parts"] == ["bm25", "overlap"] and (tmp_path / "h" / "overlap" / "overlap.json").exists()
    assert load_searcher(tmp_path / "h").search(["glacier valley tram"], 1)[0][0].id == "c"
