"""Dense backend: encoder prefixes, sharded embedding with crash/resume, faiss Flat/HNSW/IVF-PQ, real MiniLM."""

from __future__ import annotations

import numpy as np
import pytest

from infra.errors import ConfigError
from retrieval.dense import SHARDS_DIR, DenseIndexConfig, DenseSearcher, build_faiss_index, embed_shard
from retrieval.encoders import BGE_QUERY_INSTRUCTION, EncoderConfig, default_prefixes
from retrieval.index import IndexBuildConfig, build_index, finalize_index, load_searcher, plan_index
from retrieval.store import PassageStore


def test_prefixes_per_model_family() -> None:
    assert default_prefixes("intfloat/e5-base-v2") == ("query: ", "passage: ")
    assert default_prefixes("/models/multilingual-e5-small/") == ("query: ", "passage: ")
    assert default_prefixes("BAAI/bge-small-en-v1.5") == (BGE_QUERY_INSTRUCTION, "")
    assert default_prefixes("minilm") == ("", "")


def test_store_shards_hash_contents(mini_corpus_path, tmp_path) -> None:
    from retrieval.store import write_store

    a = write_store(mini_corpus_path, tmp_path / "a", shard_size=100, limit=250)
    b = write_store(mini_corpus_path, tmp_path / "b", shard_size=100, limit=250)
    assert [(s.start, s.stop) for s in a.shards] == [(0, 100), (100, 200), (200, 250)]
    assert [s.content_hash for s in a.shards] == [s.content_hash for s in b.shards]
    assert len({s.content_hash for s in a.shards}) == 3
    store = PassageStore(tmp_path / "a")
    assert len(store) == 250 and store[0].id == "mhw-0" and store.rows(248, 999)[-1].id == store[249].id


def test_crashed_build_resumes_from_last_finished_shard(mini_corpus_path, tmp_path, hashing_encoder) -> None:
    cfg = IndexBuildConfig(corpus=str(mini_corpus_path), backend="dense", limit=500, shard_size=100)
    out = tmp_path / "idx"
    hashing_encoder.fail_on_call = 4  # crash while embedding the 4th of 5 shards
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_index(cfg, out)
    assert not (out / "manifest.json").exists()
    finished = sorted(p.name for p in (out / SHARDS_DIR).iterdir())
    assert len(finished) == 3 and all(name.endswith(".npy") for name in finished)  # no temp files left behind

    hashing_encoder.fail_on_call, hashing_encoder.calls, hashing_encoder.texts = None, 0, 0
    ref = build_index(cfg, out)
    assert hashing_encoder.calls == 2 and hashing_encoder.texts == 200  # only shards 4 and 5 were embedded
    assert ref.shards_reused == 3 and ref.n_passages == 500

    fresh = build_index(cfg, tmp_path / "fresh")
    q = ["Scott Derrickson director", "Ed Wood film"]
    assert [[h.id for h in r] for r in load_searcher(out).search(q, 5)] == [
        [h.id for h in r] for r in load_searcher(fresh.uri).search(q, 5)
    ]


def test_complete_index_is_reused(mini_corpus_path, tmp_path, hashing_encoder) -> None:
    cfg = IndexBuildConfig(corpus=str(mini_corpus_path), backend="dense", limit=120, shard_size=50)
    build_index(cfg, tmp_path / "i")
    calls = hashing_encoder.calls
    again = build_index(cfg, tmp_path / "i")
    assert again.reused and hashing_encoder.calls == calls


def test_rebuild_with_new_plan_prunes_old_shards(mini_corpus_path, tmp_path, hashing_encoder) -> None:
    base = IndexBuildConfig(corpus=str(mini_corpus_path), backend="dense", limit=120, shard_size=50)
    build_index(base, tmp_path)
    assert len(list((tmp_path / SHARDS_DIR).iterdir())) == 3
    ref = build_index(base.model_copy(update={"shard_size": 60}), tmp_path)
    assert len(list((tmp_path / SHARDS_DIR).iterdir())) == 2 and ref.shards_reused == 0


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
def test_faiss_index_types(kind, mini_corpus_path, tmp_path, hashing_encoder) -> None:
    cfg = IndexBuildConfig(corpus=str(mini_corpus_path), backend="dense", limit=1200, shard_size=400,
                           faiss=DenseIndexConfig(type=kind, pq_m=16, nlist=16, nprobe=16))
    plan = plan_index(cfg, tmp_path)
    shards = [embed_shard(tmp_path, s, tmp_path / SHARDS_DIR, hashing_encoder) for s in plan.store.shards]
    ref = finalize_index(cfg, plan, shards)
    assert ref.params["type"] == kind and ref.params["ntotal"] == 1200
    searcher = load_searcher(tmp_path)
    assert isinstance(searcher, DenseSearcher)
    store = PassageStore(tmp_path)
    rows = list(range(0, 1200, 60))
    results = searcher.search([store[i].contents for i in rows], 3)
    self_hits = sum(store[i].id in [h.id for h in r] for i, r in zip(rows, results, strict=True)) / len(rows)
    assert self_hits >= (0.95 if kind != "ivfpq" else 0.7)
    assert all(r[0].score >= r[-1].score for r in results)
    assert searcher.search([], 3) == []


def test_pq_m_must_divide_dim(mini_corpus_path, tmp_path, hashing_encoder) -> None:
    cfg = IndexBuildConfig(corpus=str(mini_corpus_path), backend="dense", limit=100,
                           faiss=DenseIndexConfig(type="ivfpq", pq_m=10))
    with pytest.raises(ConfigError, match="pq_m=10 does not divide"):
        build_index(cfg, tmp_path)


@pytest.mark.slow
def test_minilm_dense_on_mini_slice(mini_corpus_path, tmp_path) -> None:
    from retrieval.encoders import get_encoder

    enc = get_encoder(EncoderConfig())
    vecs = enc.encode(["food", "bread", "baby"], "passage")
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]
    ref = build_index(IndexBuildConfig(corpus=str(mini_corpus_path), backend="dense", limit=60, shard_size=32),
                      tmp_path)
    hits = load_searcher(ref.uri).search(["Were Scott Derrickson and Ed Wood of the same nationality?"], 5)[0]
    assert {"mhw-1", "mhw-4"} & {h.id for h in hits}


@pytest.mark.gpu
def test_faiss_gpu_build(mini_corpus_path, tmp_path, hashing_encoder) -> None:
    from retrieval.dense import gpu_available

    if not gpu_available():
        pytest.skip("faiss was installed without GPU support (install faiss-gpu on GPU workers)")
    plan = plan_index(IndexBuildConfig(corpus=str(mini_corpus_path), backend="dense", limit=500), tmp_path)
    shards = [embed_shard(tmp_path, s, tmp_path / SHARDS_DIR, hashing_encoder) for s in plan.store.shards]
    params = build_faiss_index(shards, DenseIndexConfig(type="flat", use_gpu="always"), tmp_path / "index.faiss")
    assert params["built_on_gpu"] and params["ntotal"] == 500


def test_unknown_encoder_is_a_config_error() -> None:
    from retrieval.encoders import SentenceTransformerEncoder

    with pytest.raises(ConfigError, match="encoder.model='/nonexistent/model'"):
        SentenceTransformerEncoder(EncoderConfig(model="/nonexistent/model"))


def test_query_batch_size_is_not_part_of_the_fingerprint() -> None:
    from retrieval.encoders import QUERY_BATCH_SIZE, config_fingerprint, query_batch

    assert query_batch(EncoderConfig(), "cpu") == QUERY_BATCH_SIZE  # measured on CPU only
    assert query_batch(EncoderConfig(batch_size=128), "cuda") == 128
    assert query_batch(EncoderConfig(query_batch_size=3), "cuda") == 3
    assert config_fingerprint(EncoderConfig(query_batch_size=3)) == config_fingerprint(EncoderConfig())


@pytest.mark.slow
def test_queries_encode_in_small_sorted_batches_with_the_same_vectors(monkeypatch) -> None:
    """Queries go through the encoder ``query_batch_size`` at a time (passages ``batch_size``); in fp32 the vectors
    equal one padded batch of all of them."""
    from retrieval.encoders import SentenceTransformerEncoder

    enc = SentenceTransformerEncoder(EncoderConfig(dtype="float32", query_batch_size=2, batch_size=64))
    seen: list[int] = []
    encode = enc._model.encode
    monkeypatch.setattr(enc._model, "encode", lambda texts, **kw: seen.append(kw["batch_size"]) or encode(texts, **kw))
    texts = ["who wrote it", "when was the director of the film Ed Wood born and where did he die", "food", "baby"]
    small = enc.encode(texts, "query")
    whole = SentenceTransformerEncoder(EncoderConfig(dtype="float32", query_batch_size=64)).encode(texts, "query")
    enc.encode(texts, "passage")
    assert seen == [2, 64]
    assert np.allclose(small, whole, atol=1e-5)


def test_length_groups_cover_every_text_once_and_cut_where_padding_costs_more() -> None:
    from retrieval.encoders import length_groups

    assert length_groups([]) == []
    assert length_groups([7]) == [[0]]
    groups = length_groups([10, 40, 11, 12, 41, 10], overhead=16)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert [sorted(g) for g in groups] == [[0, 2, 3, 5], [1, 4]]  # short and long apart: 16 + 4 x 12 + 16 + 2 x 41
    assert length_groups([10, 40, 11, 12, 41, 10], overhead=1000) == [[0, 5, 2, 3, 1, 4]]  # one pass when passes cost
    assert all(len(g) <= 3 for g in length_groups([9] * 10, overhead=1000, max_group=3))


@pytest.mark.slow
def test_cpu_queries_encode_in_length_groups_with_the_same_vectors(monkeypatch) -> None:
    """With no query_batch_size on CPU, queries are tokenized once and run in length groups, one forward pass each;
    in fp32 the vectors equal sentence-transformers' own encode of all of them."""
    from retrieval.encoders import SentenceTransformerEncoder

    enc = SentenceTransformerEncoder(EncoderConfig(dtype="float32", device="cpu"))
    assert enc.group_queries
    widths: list[int] = []
    forward = enc._query_model.forward
    monkeypatch.setattr(enc._query_model, "forward",
                        lambda features: widths.append(features["input_ids"].shape[1]) or forward(features))
    texts = ["who wrote it", "when was the director of the film Ed Wood born and where did he die", "food", "baby"]
    grouped = enc.encode(texts, "query")
    assert len(widths) >= 2 and min(widths) < max(widths)  # the short queries did not pad to the long one
    whole = SentenceTransformerEncoder(EncoderConfig(dtype="float32", query_batch_size=64)).encode(texts, "query")
    assert np.allclose(grouped, whole, atol=1e-5)
