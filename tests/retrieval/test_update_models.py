"""Incremental updates with the real models on small slices: MiniLM dense (encoder calls counted through a
wrapper around the real encoder) and ColBERT PyLate + Voyager (model.encode counted); both compared with a full
rebuild of the new corpus."""

from __future__ import annotations

from typing import Any

import pytest

from retrieval.encoders import EncoderConfig, get_encoder
from retrieval.index import IndexBuildConfig, build_index
from retrieval.update import update_index
from tests.retrieval.test_update import NEW_ROWS, edit, top_ids, write_slice

pytestmark = pytest.mark.slow


class CountingEncoder:
    """Wraps a real Encoder; counts passage texts and calls (queries are not counted)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.dim, self.fingerprint = inner, inner.dim, inner.fingerprint
        self.passage_texts: list[str] = []
        self.passage_calls = 0

    def encode(self, texts: list[str], kind: str):
        if kind == "passage":
            self.passage_calls += 1
            self.passage_texts.extend(texts)
        return self.inner.encode(texts, kind)


def test_minilm_update_encodes_only_changed_and_matches_full(mini_corpus_path, tmp_path, monkeypatch) -> None:
    counting = CountingEncoder(get_encoder(EncoderConfig()))
    monkeypatch.setattr("retrieval.dense.get_encoder", lambda cfg: counting)
    monkeypatch.setattr("retrieval.encoders.get_encoder", lambda cfg: counting)
    path = tmp_path / "corpus.jsonl"
    rows = write_slice(mini_corpus_path, path, 80)
    cfg = IndexBuildConfig(corpus=str(path), backend="dense", shard_size=32)
    build_index(cfg, tmp_path / "v1")
    assert len(counting.passage_texts) == 80
    edit(path, drop={rows[10]["id"]}, change={rows[20]["id"]}, add=NEW_ROWS)
    counting.passage_texts.clear()
    upd = update_index(cfg, tmp_path / "v1", tmp_path / "v2")
    assert sorted(t.split("\n")[0] for t in counting.passage_texts) == sorted(
        [f'"{rows[20]["title"]}"', *(f'"{r["title"]}"' for r in NEW_ROWS)])  # exactly the 3 fresh passages
    assert upd.counts.encoded == 3 and upd.counts.reused == 78 and "in place" in upd.how
    build_index(cfg, tmp_path / "full", force=True)
    queries = [r["title"] for r in rows[:60:4]] + ["lighthouse keepers", "quokka festival in June", "glacier tram"]
    got = top_ids(tmp_path / "v2", queries)
    assert got == top_ids(tmp_path / "full", queries)
    assert got[-2][0] == "new-1" and got[-1][0] == "new-2" and got[-3][0] == rows[20]["id"]
    assert rows[10]["id"] not in {i for ids in top_ids(tmp_path / "v2", queries, 50) for i in ids}


def test_colbert_update_in_place_matches_full(mini_corpus_path, tmp_path, monkeypatch) -> None:
    import retrieval.update_backends as ub

    encoded: list[str] = []
    real_load = ub._load_pylate

    def counting_load(path: str, cfg: Any) -> Any:
        model = real_load(path, cfg)
        inner = model.encode

        def encode(texts, **kw):
            encoded.extend(texts)
            return inner(texts, **kw)

        model.encode = encode
        return model

    monkeypatch.setattr(ub, "_load_pylate", counting_load)
    path = tmp_path / "corpus.jsonl"
    rows = write_slice(mini_corpus_path, path, 60)
    cfg = IndexBuildConfig(corpus=str(path), backend="colbert")
    build_index(cfg, tmp_path / "v1")
    edit(path, drop={rows[5]["id"]}, change={rows[6]["id"]}, add=NEW_ROWS)
    upd = update_index(cfg, tmp_path / "v1", tmp_path / "v2")
    assert len(encoded) == 3 and upd.counts.encoded == 3 and upd.counts.reused == 58
    assert "colbert voyager: in place" in upd.how
    build_index(cfg, tmp_path / "full", force=True)
    queries = [r["title"] for r in rows[:40:4]] + ["Zanzibar Quokka Festival", "Borealis Tram"]
    got, want = top_ids(tmp_path / "v2", queries), top_ids(tmp_path / "full", queries)
    assert got == want
    assert got[-2][0] == "new-1" and got[-1][0] == "new-2"
    assert rows[5]["id"] not in {i for ids in top_ids(tmp_path / "v2", queries, 20) for i in ids}
