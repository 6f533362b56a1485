"""Every wire format of the retriever server, over HTTP against a live uvicorn server on a BM25 mini index.

Each response is also parsed the way that seed's client parses it (paraphrased from the upstream code named in
shared/notes/seeds.md), so a shape change that would break a seed fails here.
"""

from __future__ import annotations

import math

import httpx
import pytest

from infra.http import serve_in_thread
from retrieval.bm25 import BM25Searcher
from retrieval.corpus import read_corpus
from retrieval.server import ServerConfig, create_app
from retrieval.types import Hit

pytestmark = pytest.mark.slow

QUERIES = ["Which country is the Eiffel Tower in?", "American rock band formed in Illinois", "football academy"]


@pytest.fixture(scope="module")
def bm25(mini_corpus_path) -> BM25Searcher:
    return BM25Searcher.build(read_corpus(mini_corpus_path))


@pytest.fixture(scope="module", params=[True, False], ids=["fast-path", "fastapi-routes"])
def http(request, bm25):
    app = create_app(bm25, ServerConfig(fast_path=request.param))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def _expected(bm25: BM25Searcher, queries: list[str], k: int) -> list[list[Hit]]:
    return bm25.search(queries, k)


def test_default_config_binds_loopback_and_caps_k() -> None:
    cfg = ServerConfig()
    assert cfg.host == "127.0.0.1"
    assert cfg.limits.max_k == 100
    assert cfg.token is None


def test_flashrag_search(http, bm25) -> None:
    expected = _expected(bm25, QUERIES[:1], 3)[0]
    docs = http.post("/search", json={"query": QUERIES[0], "top_n": 3}).json()
    assert docs == [{"id": h.id, "contents": f'"{h.title}"\n{h.text}'} for h in expected]
    docs2, scores = http.post("/search", json={"query": QUERIES[0], "top_n": 3, "return_score": True}).json()
    assert docs2 == docs
    assert scores == pytest.approx([h.score for h in expected])
    # SmartSearch's sandboxed wikipedia_search joins the contents with blank lines.
    assert "\n\n".join(d["contents"] for d in docs).startswith(f'"{expected[0].title}"')


def test_flashrag_search_default_top_n_is_10(http) -> None:
    assert len(http.post("/search", json={"query": QUERIES[1]}).json()) == 10


def test_flashrag_batch_search(http, bm25) -> None:
    expected = _expected(bm25, QUERIES, 2)
    lists = http.post("/batch_search", json={"query": QUERIES, "top_n": 2}).json()
    assert [[d["id"] for d in docs] for docs in lists] == [[h.id for h in hits] for hits in expected]
    doc_lists, score_lists = http.post(
        "/batch_search", json={"query": QUERIES, "top_n": 2, "return_score": True}
    ).json()
    assert doc_lists == lists
    assert score_lists == [pytest.approx([h.score for h in hits]) for hits in expected]
    # ReSearch's rollout: one <result> block per query, contents joined by blank lines.
    blocks = ["\n\n".join(d["contents"] for d in docs) for docs in lists]
    assert len(blocks) == len(QUERIES) and all(blocks)


def test_search_r1_retrieve(http, bm25) -> None:
    expected = _expected(bm25, QUERIES, 3)
    body = http.post("/retrieve", json={"queries": QUERIES, "topk": 3, "return_scores": True}).json()
    assert set(body) == {"result"}
    for hits, items in zip(expected, body["result"], strict=True):
        assert [it["document"]["id"] for it in items] == [h.id for h in hits]
        assert [it["score"] for it in items] == pytest.approx([h.score for h in hits])
    # verl search tool formatting: first line of contents is the title, the rest the text.
    first = body["result"][0][0]["document"]["contents"]
    title, text = first.split("\n", 1)
    assert title.strip('"') == expected[0][0].title and text == expected[0][0].text
    plain = http.post("/retrieve", json={"queries": QUERIES[:1], "topk": 3}).json()
    assert plain["result"][0] == [it["document"] for it in body["result"][0]]


def test_search_r1_retrieve_null_topk_uses_server_default(http) -> None:
    body = http.post("/retrieve", json={"queries": QUERIES[:1], "topk": None, "return_scores": True}).json()
    assert len(body["result"][0]) == ServerConfig().default_k


def test_r1_searcher_queries(http, bm25) -> None:
    expected = _expected(bm25, QUERIES, 3)
    body = http.post("/queries", json={"queries": QUERIES, "k": 3}).json()
    assert body["queries"] == QUERIES
    assert body["answers"] == [[h.contents for h in hits] for hits in expected]


def test_exsearch_api_search(http, bm25) -> None:
    expected = _expected(bm25, QUERIES[:1], 5)[0]
    body = http.get("/api/search", params={"query": QUERIES[0], "k": 5}).json()
    assert body["query"] == QUERIES[0]
    topk = body["topk"]
    assert [d["pid"] for d in topk] == [h.id for h in expected]
    assert [d["rank"] for d in topk] == [1, 2, 3, 4, 5]
    assert sum(d["prob"] for d in topk) == pytest.approx(1.0)
    denom = sum(math.exp(h.score) for h in expected)
    assert [d["prob"] for d in topk] == pytest.approx([math.exp(h.score) / denom for h in expected])
    # ExSearch's document_retrieval splits the text at the first '|' into title and content.
    text = topk[0]["text"]
    assert text[: text.index("|")].strip() == expected[0].title
    assert text[text.index("|") + 1 :].strip() == expected[0].text


def test_own_v1_search(http, bm25) -> None:
    expected = _expected(bm25, QUERIES, 4)
    body = http.post("/v1/search", json={"queries": QUERIES, "k": 4}).json()
    assert [[Hit(**h) for h in hits] for hits in body["results"]] == expected


def test_health_and_docs(http) -> None:
    health = http.get("/health").json()
    assert health["status"] == "healthy"
    assert health["retrievers"] == {"total": 1, "available": 1}
    assert health["index"] == {"name": "bm25", "passages": 1861}
    assert health["limits"]["max_k"] == 100 and health["batching"]["enabled"] is True
    assert http.get("/docs").status_code == 200
    paths = set(http.get("/openapi.json").json()["paths"])
    assert {"/search", "/batch_search", "/retrieve", "/queries", "/api/search", "/v1/search", "/health"} <= paths


def test_cache_hit_skips_the_searcher(http) -> None:
    body = {"queries": ["a query only this test sends"], "k": 3}
    first = http.post("/v1/search", json=body).json()
    before = http.get("/health").json()["stats"]
    second = http.post("/v1/search", json=body).json()
    after = http.get("/health").json()["stats"]
    assert second == first
    assert after["cache_hits"] == before["cache_hits"] + 1
    assert after["searcher_calls"] == before["searcher_calls"]
    # A different k is a different cache entry.
    http.post("/v1/search", json={**body, "k": 2})
    assert http.get("/health").json()["stats"]["searcher_calls"] == before["searcher_calls"] + 1


def test_startup_leaves_the_loaded_heap_out_of_later_collections(bm25) -> None:
    import gc

    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    with serve_in_thread(create_app(bm25)) as url, httpx.Client(base_url=url) as client:
        assert client.get("/health").status_code == 200
        assert gc.get_freeze_count() > 1000  # the index and everything imported so far


def test_bearer_token(bm25) -> None:
    app = create_app(bm25, ServerConfig(token="s3cret"))
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as client:
        body = {"query": "film", "top_n": 1}
        missing = client.post("/search", json=body)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in missing.json()["error"]
        assert client.post("/search", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert client.post("/search", json=body, headers={"Authorization": "Basic s3cret"}).status_code == 401
        assert client.get("/api/search", params={"query": "film"}).status_code == 401
        ok = client.post("/search", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and len(ok.json()) == 1
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["auth"] is True


def test_config_rejects_default_k_above_cap() -> None:
    from infra.config import build_config
    from infra.errors import ConfigError

    with pytest.raises(ConfigError, match="default_k=20 exceeds limits.max_k=5"):
        build_config(ServerConfig, {"default_k": 20, "limits": {"max_k": 5}})
    with pytest.raises(ConfigError, match="unknown key"):
        build_config(ServerConfig, {"limts": {}})


def test_serve_refuses_processes_without_an_index_path(bm25) -> None:
    from infra.errors import ConfigError
    from retrieval.server import serve

    with pytest.raises(ConfigError, match="serve_processes"):
        serve(bm25, ServerConfig(processes=2))
