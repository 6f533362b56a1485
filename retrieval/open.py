"""One retriever reference and one way to open it: :class:`RetrieverSpec` and :func:`open_searcher`.

Every consumer names its retriever with the same model (the evaluation agent, the EM loop, RL rollouts, warm-up
data, ``searchloop ask``, ``searchloop serve retriever``) and opens it here:

- ``url``: a running retriever server (searchloop's, or any FlashRAG/Search-R1-compatible one) through
  :class:`retrieval.client.RetrieverClient`;
- ``index``: a directory built by ``searchloop index build``, of any backend (bm25, dense, colbert, hybrid),
  loaded in process (``retrieval.index.load_searcher``);
- ``corpus``: one or more corpus jsonl files, indexed with BM25 in memory (cached per process).

Exactly one of the three is set. A preset override that sets one of them (``retrieval.index=<dir>``) replaces
whichever the preset had (``infra.config.apply_overrides`` honours :attr:`RetrieverSpec.one_of`). Paths go through
``infra.paths.resolve_path`` (``shared:``, repo-relative, absolute, ``s3://``).
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from infra.config import secret_value
from infra.paths import is_uri, resolve_path
from retrieval.config import TOKEN_ENV, RetrieverSpec
from retrieval.types import Searcher


def open_searcher(spec: RetrieverSpec) -> Searcher:
    """Open the retriever named by ``spec``.

    Raises:
        ArtifactError: ``index`` is not a finished index directory.
        DataError: a corpus file is missing or malformed.
        RetrieverError: ``wait_s`` > 0 and the server did not become healthy in time.
    """
    if spec.url:
        from retrieval.client import RetrieverClient

        client = RetrieverClient(spec.url, timeout=spec.timeout_s, token=secret_value(spec.token, TOKEN_ENV))
        if spec.wait_s > 0:
            client.wait_until_ready(spec.wait_s)
        return client
    if spec.index:
        from retrieval.index import load_searcher

        return load_searcher(resolve_path(spec.index), spec.query_backend, spec.query_model)
    return bm25_over(tuple(_canonical(c) for c in spec.corpus or ()))


def _canonical(ref: str) -> str:
    path = resolve_path(ref)
    return path if is_uri(path) else os.path.abspath(path)


@lru_cache(maxsize=4)
def bm25_over(corpora: tuple[str, ...]) -> Searcher:
    """BM25 (bm25s) over the passages of ``corpora`` in memory; cached per process by the tuple of paths."""
    from retrieval.bm25 import BM25Searcher
    from retrieval.corpus import read_corpus

    return BM25Searcher.build([p for c in corpora for p in read_corpus(c)])


def passages_of(spec: RetrieverSpec) -> dict[str, Any]:
    """Passages by id of an in-process retriever (``corpus`` files or a built ``index``); ``{}`` for a ``url``.

    Warm-up data uses them to look gold passages up by id.
    """
    if spec.corpus:
        from retrieval.corpus import read_corpus

        return {p.id: p for c in spec.corpus for p in read_corpus(resolve_path(c))}
    if spec.index:
        from infra.artifacts import local_path, require_manifest
        from retrieval.store import PassageStore

        manifest = require_manifest(resolve_path(spec.index), kind="index")
        d = local_path(resolve_path(spec.index))
        if manifest.get("parts"):  # a composite (hybrid) index: every part holds the same passage store
            d = d / manifest["parts"][0]
        return {p.id: p for p in PassageStore(d)}
    return {}
