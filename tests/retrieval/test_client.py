"""RetrieverClient: the Searcher protocol over a live server, retries on 5xx/connection errors, none on 4xx; CLI."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from typer.testing import CliRunner

from infra.http import serve_in_thread
from retrieval.bm25 import BM25Searcher
from retrieval.client import AsyncRetrieverClient, RetrieverClient, RetrieverError
from retrieval.corpus import read_corpus
from retrieval.server import ServerConfig, create_app
from retrieval.types import Hit, Searcher

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bm25(mini_corpus_path) -> BM25Searcher:
    return BM25Searcher.build(read_corpus(mini_corpus_path))


@pytest.fixture(scope="module")
def url(bm25):
    with serve_in_thread(create_app(bm25, ServerConfig(token="tok"))) as base:
        yield base


def _flaky_app(fail_times: int, status: int = 503) -> tuple[FastAPI, dict[str, int]]:
    """A tiny real server whose /v1/search fails ``fail_times`` times with ``status``, then answers."""
    app = FastAPI()
    seen = {"calls": 0}

    @app.post("/v1/search")
    async def search(request: Request) -> JSONResponse:
        seen["calls"] += 1
        if seen["calls"] <= fail_times:
            return JSONResponse({"error": f"planned failure {seen['calls']}"}, status_code=status)
        queries = (await request.json())["queries"]
        return JSONResponse({"results": [[{"id": q, "title": "T", "text": q, "score": 1.0}] for q in queries]})

    return app, seen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_is_a_searcher_matching_direct_search(url, bm25) -> None:
    queries = ["Eiffel Tower country", "rock band Illinois", "", "football academy London", "   "]
    with RetrieverClient(url, token="tok", batch_size=2) as client:
        assert isinstance(client, Searcher)
        before = client.health()["stats"]["requests"]
        got = client.search(queries, 4)
        after = client.health()["stats"]["requests"]
    expected = bm25.search([q for q in queries if q.strip()], 4)
    assert got[2] == [] and got[4] == []
    assert [got[0], got[1], got[3]] == expected
    assert after - before == 2, "3 non-blank queries in requests of 2"


def test_client_without_token_gets_401_immediately(url) -> None:
    with RetrieverClient(url, retries=3) as client, pytest.raises(RetrieverError, match="HTTP 401") as info:
        client.search(["film"], 3)
    assert info.value.status == 401


def test_client_4xx_is_not_retried() -> None:
    app, seen = _flaky_app(fail_times=10, status=422)
    with (
        serve_in_thread(app) as base,
        RetrieverClient(base, retries=4, backoff_s=0.01) as client,
        pytest.raises(RetrieverError, match="HTTP 422: planned failure 1") as info,
    ):
        client.search(["q"], 3)
    assert info.value.status == 422
    assert seen["calls"] == 1


@pytest.mark.parametrize("status", [503, 500, 429])
def test_client_retries_5xx_then_succeeds(status: int) -> None:
    app, seen = _flaky_app(fail_times=2, status=status)
    with serve_in_thread(app) as base, RetrieverClient(base, retries=3, backoff_s=0.01) as client:
        hits = client.search(["alpha", "beta"], 1)
    assert seen["calls"] == 3
    assert [[h.id for h in row] for row in hits] == [["alpha"], ["beta"]]


def test_client_gives_up_after_retries() -> None:
    app, seen = _flaky_app(fail_times=100, status=503)
    with (
        serve_in_thread(app) as base,
        RetrieverClient(base, retries=2, backoff_s=0.01) as client,
        pytest.raises(RetrieverError, match="still failing after 3 attempt") as info,
    ):
        client.search(["q"], 1)
    assert seen["calls"] == 3 and info.value.status == 503


def test_client_retries_connection_refused_until_server_starts(bm25) -> None:
    port = _free_port()
    stop = threading.Event()
    started = threading.Event()

    def late_server() -> None:
        time.sleep(0.8)
        with serve_in_thread(create_app(bm25, ServerConfig()), port=port):
            started.set()
            stop.wait(30)

    thread = threading.Thread(target=late_server, daemon=True)
    thread.start()
    try:
        with RetrieverClient(f"http://127.0.0.1:{port}", retries=8, backoff_s=0.1, timeout=5) as client:
            t0 = time.perf_counter()
            hits = client.search(["film director"], 2)
            waited = time.perf_counter() - t0
        # the answer can arrive before the server thread sets the event (it sets it once the server is up)
        assert started.wait(5) and len(hits[0]) == 2
        assert waited >= 0.5, "the first attempts must have been refused"
    finally:
        stop.set()
        thread.join(10)


def test_client_connection_refused_gives_up_with_hint() -> None:
    with (
        RetrieverClient(f"http://127.0.0.1:{_free_port()}", retries=1, backoff_s=0.01) as client,
        pytest.raises(RetrieverError, match="ConnectError.*searchloop serve retriever"),
    ):
        client.search(["q"], 1)


def test_async_client(url, bm25) -> None:
    async def main() -> list[list[list[Hit]]]:
        async with AsyncRetrieverClient(url, token="tok") as client:
            return await asyncio.gather(*(client.search([q], 3) for q in ["film", "river", "band"]))

    results = asyncio.run(main())
    assert [r[0] for r in results] == bm25.search(["film", "river", "band"], 3)


def test_cli_search_prints_a_table(url, bm25) -> None:
    from flows.cli import app

    result = CliRunner().invoke(
        app, ["search", "rock band Illinois", "--url", url, "-k", "2"], env={"SEARCHLOOP_RETRIEVER_TOKEN": "tok",
                                                                             "COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    top = bm25.search(["rock band Illinois"], 2)[0]
    assert top[0].id in result.output and top[1].id in result.output and "score" in result.output


def test_cli_serve_retriever_subprocess(tmp_path) -> None:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "flows.cli", "serve", "retriever", "--corpus", "data/corpus/mini.jsonl",
           "--port", str(port), "--max-k", "20"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with RetrieverClient(f"http://127.0.0.1:{port}", retries=0) as client:
            health = client.wait_until_ready(timeout_s=90)
            assert health["limits"]["max_k"] == 20 and health["index"]["passages"] == 1861
            assert len(client.search(["film"], 5)[0]) == 5
            with pytest.raises(RetrieverError, match="cap of 20"):
                client.search(["film"], 21)
    finally:
        proc.terminate()
        proc.wait(15)


def test_open_searcher_loads_index_dirs_and_corpora(tmp_path, mini_corpus_path) -> None:
    from flows.commands.serve import open_searcher
    from infra.errors import ArtifactError, ConfigError
    from retrieval.index import IndexBuildConfig, build_index

    ref = build_index(IndexBuildConfig(corpus=str(mini_corpus_path), backend="bm25"), tmp_path / "bm25")
    from_index = open_searcher(Path(ref.uri), None)
    from_corpus = open_searcher(None, mini_corpus_path)
    assert from_index.search(["rock band"], 3) == from_corpus.search(["rock band"], 3)
    with pytest.raises(ConfigError, match="exactly one"):
        open_searcher(None, None)
    with pytest.raises(ArtifactError):
        open_searcher(tmp_path / "missing", None)


def test_cli_serve_retriever_processes_share_one_port() -> None:
    """--processes 2: two uvicorn workers, each with its own copy of the index, behind one port and one token."""
    import psutil

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "SEARCHLOOP_RETRIEVER_TOKEN": "s3cret"}
    cmd = [sys.executable, "-m", "flows.cli", "serve", "retriever", "--corpus", "data/corpus/mini.jsonl",
           "--port", str(port), "--processes", "2", "--cache-mb", "0"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    workers: list = []
    try:
        with RetrieverClient(url, retries=0, token="s3cret") as client:
            client.wait_until_ready(timeout_s=120)
            deadline = time.monotonic() + 60
            while len(psutil.Process(proc.pid).children(recursive=True)) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
            workers = [c for c in psutil.Process(proc.pid).children(recursive=True) if "python" in c.name().lower()]
            assert len(workers) >= 2
            expected = BM25Searcher.build(read_corpus(REPO / "data" / "corpus" / "mini.jsonl")).search(
                ["rock band Illinois", "film director"], 3)
            for _ in range(4):  # several connections: the kernel hands them to either worker
                with RetrieverClient(url, retries=0, token="s3cret") as fresh:
                    got = fresh.search(["rock band Illinois", "film director"], 3)
                    assert [[h.id for h in hits] for hits in got] == [[h.id for h in hits] for hits in expected]
        with RetrieverClient(url, retries=0) as anonymous, pytest.raises(RetrieverError, match="401"):
            anonymous.search(["film"], 3)
    finally:
        proc.terminate()
        proc.wait(30)
    _, alive = psutil.wait_procs(workers, timeout=20)  # the supervisor takes its workers down with it
    assert not alive
