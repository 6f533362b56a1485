"""Incremental index updates (retrieval.update): only new/changed passages are encoded, results equal a full
rebuild of the new corpus, deleted passages are never returned, a crashed update leaves the old index readable
and resumes. Dense tests use the counting HashingEncoder fake (tests/retrieval/conftest.py); the MiniLM and
ColBERT tests use the real models on small slices."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from infra.artifacts import read_manifest
from infra.errors import ArtifactError, ConfigError
from retrieval.index import IndexBuildConfig, build_index, load_searcher
from retrieval.store import PassageStore
from retrieval.update import update_index


def write_slice(src: Path, dst: Path, n: int) -> list[dict]:
    """First ``n`` rows of ``src`` as a corpus file at ``dst``; returns the rows."""
    rows = [orjson.loads(line) for line in src.read_bytes().splitlines()[:n]]
    dst.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return rows


def edit(path: Path, drop: set[str] = frozenset(), change: set[str] = frozenset(), add: list[dict] = ()) -> None:
    """Rewrite a corpus: drop ids, rewrite the text of ids, append rows."""
    rows = []
    for line in path.read_bytes().splitlines():
        row = orjson.loads(line)
        if row["id"] in drop:
            continue
        if row["id"] in change:
            row["text"] = f"Revised passage about lighthouse keepers number {row['id']}."
        rows.append(row)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in [*rows, *add]))


NEW_ROWS = [
    {"id": "new-1", "title": "Zanzibar Quokka Festival", "text": "The Zanzibar Quokka Festival is held every June."},
    {"id": "new-2", "title": "Borealis Tram", "text": "The Borealis Tram climbs the glacier valley at night."},
]


def top_ids(index_dir, queries: list[str], k: int = 5) -> list[list[str]]:
    return [[h.id for h in hits] for hits in load_searcher(index_dir).search(queries, k)]


@pytest.fixture
def corpus(mini_corpus_path, tmp_path) -> tuple[Path, list[dict]]:
    path = tmp_path / "corpus.jsonl"
    return path, write_slice(mini_corpus_path, path, 300)


def _queries(rows: list[dict]) -> list[str]:
    return [r["title"] for r in rows[:40:3]] + ["lighthouse keepers", "Zanzibar Quokka Festival", "Borealis Tram"]


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
def test_dense_update_encodes_only_new_and_changed(kind, corpus, tmp_path, hashing_encoder) -> None:
    path, rows = corpus
    faiss = {"type": kind, "pq_m": 8, "nlist": 4, "ef_search": 512}  # HNSW exhaustive on 300 vectors
    cfg = IndexBuildConfig(corpus=str(path), backend="dense", shard_size=128, faiss=faiss)
    build_index(cfg, tmp_path / "v1")
    dropped, changed = {rows[5]["id"], rows[150]["id"]}, {rows[7]["id"], rows[290]["id"]}
    edit(path, drop=dropped, change=changed, add=NEW_ROWS)
    before = hashing_encoder.texts
    upd = update_index(cfg, tmp_path / "v1", tmp_path / "v2")
    assert hashing_encoder.texts - before == 4  # 2 changed + 2 added; 296 vectors reused
    c = upd.counts
    assert (c.added, c.changed, c.deleted, c.unchanged, c.reused, c.encoded, c.total) == (2, 2, 2, 296, 296, 4, 300)
    assert upd.method == "incremental" and read_manifest(tmp_path / "v2")["update"]["counts"]["encoded"] == 4
    expected = {"flat": "in place", "hnsw": "rebuilt from stored vectors", "ivfpq": "rebuilt from stored vectors"}
    assert expected[kind] in upd.how
    full = build_index(cfg, tmp_path / "full", force=True)
    assert full.n_passages == upd.ref.n_passages == 300
    queries = _queries(rows)
    got, want = top_ids(tmp_path / "v2", queries), top_ids(tmp_path / "full", queries)
    if kind == "ivfpq":  # PQ codes retrained on 300 vectors are coarse: two full builds differ too
        assert "new-1" in got[-2] and load_searcher(tmp_path / "v2").index.ntotal == 300
    else:
        assert got == want
    assert not dropped & {i for ids in top_ids(tmp_path / "v2", queries, 50) for i in ids}
    store = PassageStore(tmp_path / "v2")
    assert {store[i].id for i in range(len(store))} == {r["id"] for r in rows} - dropped | {"new-1", "new-2"}


def test_hnsw_additions_only_are_added_in_place(corpus, tmp_path, hashing_encoder) -> None:
    path, _ = corpus
    cfg = IndexBuildConfig(corpus=str(path), backend="dense", faiss={"type": "hnsw"})
    build_index(cfg, tmp_path / "v1")
    edit(path, add=NEW_ROWS)
    upd = update_index(cfg, tmp_path / "v1", tmp_path / "v2")
    assert "in place" in upd.how and upd.counts.encoded == 2
    assert top_ids(tmp_path / "v2", ["Borealis Tram glacier"], 1) == [["new-2"]]


def test_chained_updates_and_rerun_reuses(corpus, tmp_path, hashing_encoder) -> None:
    path, rows = corpus
    cfg = IndexBuildConfig(corpus=str(path), backend="dense", shard_size=100)
    build_index(cfg, tmp_path / "v1")
    edit(path, add=NEW_ROWS[:1])
    update_index(cfg, tmp_path / "v1", tmp_path / "v2")
    edit(path, drop={"new-1", rows[0]["id"]}, add=NEW_ROWS[1:])
    before = hashing_encoder.texts
    upd = update_index(cfg, tmp_path / "v2", tmp_path / "v3")  # an updated index is itself updatable
    assert hashing_encoder.texts - before == 1 and (upd.counts.deleted, upd.counts.added) == (2, 1)
    assert top_ids(tmp_path / "v3", ["Borealis Tram glacier"], 1) == [["new-2"]]
    assert "new-1" not in {i for ids in top_ids(tmp_path / "v3", ["Zanzibar Quokka Festival"], 300) for i in ids}
    before = hashing_encoder.texts
    again = update_index(cfg, tmp_path / "v2", tmp_path / "v3")  # finished: reused, nothing encoded
    assert hashing_encoder.texts == before and again.counts == upd.counts


def test_crashed_update_leaves_old_index_readable_and_resumes(corpus, tmp_path, hashing_encoder, monkeypatch):
    path, rows = corpus
    cfg = IndexBuildConfig(corpus=str(path), backend="dense", shard_size=100)
    build_index(cfg, tmp_path / "v1")
    queries = _queries(rows)
    old_results = top_ids(tmp_path / "v1", queries)
    edit(path, change={rows[3]["id"]}, add=NEW_ROWS)

    def crash(*_a, **_k):
        raise RuntimeError("simulated crash while writing the faiss index")

    monkeypatch.setattr("retrieval.update_backends.update_faiss", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        update_index(cfg, tmp_path / "v1", tmp_path / "v2")
    assert top_ids(tmp_path / "v1", queries) == old_results  # the old index is untouched and still serves
    with pytest.raises(ArtifactError):
        load_searcher(tmp_path / "v2")  # no manifest: incomplete, never loaded
    monkeypatch.undo()
    monkeypatch.setattr("retrieval.dense.get_encoder", lambda cfg: hashing_encoder)
    monkeypatch.setattr("retrieval.encoders.get_encoder", lambda cfg: hashing_encoder)
    before = hashing_encoder.texts
    upd = update_index(cfg, tmp_path / "v1", tmp_path / "v2")
    assert hashing_encoder.texts == before  # resumed: the shards written before the crash are reused
    assert upd.ref.shards_reused == len(read_manifest(tmp_path / "v2")["shards"]) and upd.counts.changed == 1
    assert top_ids(tmp_path / "v2", ["Zanzibar Quokka Festival"], 1) == [["new-1"]]


def test_encoder_crash_mid_update_keeps_old_index(corpus, tmp_path, monkeypatch) -> None:
    from tests.retrieval.conftest import HashingEncoder

    path, rows = corpus
    cfg = IndexBuildConfig(corpus=str(path), backend="dense", shard_size=100)
    good = HashingEncoder()
    monkeypatch.setattr("retrieval.dense.get_encoder", lambda cfg: good)
    build_index(cfg, tmp_path / "v1")
    monkeypatch.setattr("retrieval.encoders.get_encoder", lambda cfg: good)
    old_results = top_ids(tmp_path / "v1", _queries(rows))
    edit(path, change={rows[3]["id"]})
    with pytest.raises(RuntimeError, match="simulated crash"):
        update_index(cfg, tmp_path / "v1", tmp_path / "v2", encoder=HashingEncoder(fail_on_call=1))
    assert read_manifest(tmp_path / "v2") is None and read_manifest(tmp_path / "v1") is not None
    assert top_ids(tmp_path / "v1", _queries(rows)) == old_results


def test_bm25_update_is_a_rebuild_equal_to_full(corpus, tmp_path) -> None:
    path, rows = corpus
    cfg = IndexBuildConfig(corpus=str(path), backend="bm25")
    build_index(cfg, tmp_path / "v1")
    edit(path, drop={rows[1]["id"]}, change={rows[2]["id"]}, add=NEW_ROWS)
    upd = update_index(cfg, tmp_path / "v1", tmp_path / "v2")
    assert "rebuilt" in upd.how and upd.counts.encoded == 0
    assert (upd.counts.added, upd.counts.changed, upd.counts.deleted) == (2, 1, 1)
    build_index(cfg, tmp_path / "full", force=True)
    queries = _queries(rows)
    got, want = load_searcher(tmp_path / "v2").search(queries, 5), load_searcher(tmp_path / "full").search(queries, 5)
    for g, w in zip(got, want, strict=True):  # same scores; same ids above the k-th score (ties may swap)
        assert [round(h.score, 4) for h in g] == [round(h.score, 4) for h in w]
        assert {h.id for h in g if h.score > g[-1].score + 1e-6} == {h.id for h in w if h.score > w[-1].score + 1e-6}
    assert "new-1" in [h.id for h in got[-2]] and rows[1]["id"] not in {h.id for r in got for h in r}


def test_changed_build_parameters_fall_back_to_full(corpus, tmp_path, hashing_encoder) -> None:
    path, _ = corpus
    cfg = IndexBuildConfig(corpus=str(path), backend="dense")
    build_index(cfg, tmp_path / "v1")
    edit(path, add=NEW_ROWS)
    hnsw = cfg.model_copy(update={"faiss": cfg.faiss.model_copy(update={"type": "hnsw"})})
    upd = update_index(hnsw, tmp_path / "v1", tmp_path / "v2")  # new faiss type: vectors reused, faiss rebuilt
    assert upd.method == "incremental" and "faiss build parameters changed; rebuilt" in upd.how
    assert upd.counts.encoded == 2 and load_searcher(tmp_path / "v2").index.ntotal == 302
    longer = cfg.model_copy(update={"encoder": cfg.encoder.model_copy(update={"max_length": 128})})
    upd = update_index(longer, tmp_path / "v1", tmp_path / "v2b")  # other encoder outputs: everything re-encoded
    assert upd.method == "full" and "encoder changed" in upd.reason
    assert upd.counts.encoded == 302 and upd.counts.added == 2
    assert read_manifest(tmp_path / "v2b")["update"]["method"] == "full"
    missing = update_index(cfg, tmp_path / "nothing", tmp_path / "v3")
    assert missing.method == "full" and "no finished index" in missing.reason
    with pytest.raises(ConfigError, match="previous index"):
        update_index(cfg, tmp_path / "v1", tmp_path / "v1")


def test_hybrid_update_updates_both_parts(corpus, tmp_path, hashing_encoder) -> None:
    path, rows = corpus
    cfg = IndexBuildConfig(corpus=str(path), backend="hybrid")
    build_index(cfg, tmp_path / "v1")
    edit(path, drop={rows[0]["id"]}, add=NEW_ROWS)
    before = hashing_encoder.texts
    upd = update_index(cfg, tmp_path / "v1", tmp_path / "v2")
    assert upd.method == "incremental" and hashing_encoder.texts - before == 2 and upd.counts.encoded == 2
    assert "faiss flat: in place" in upd.how and "bm25: rebuilt" in upd.how
    assert top_ids(tmp_path / "v2", ["Zanzibar Quokka Festival"], 1) == [["new-1"]]
