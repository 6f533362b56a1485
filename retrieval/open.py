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
from typing import Any, ClassVar

from pydantic import Field, SecretStr, field_validator, model_validator

from infra.config import StrictModel, secret_value
from infra.paths import is_uri, resolve_path
from retrieval.client import TOKEN_ENV
from retrieval.types import Searcher

_LEGACY = {"kind": "the kind follows from which of url/index/corpus is set",
           "backend": "the backend follows from which of url/index/corpus is set"}


class RetrieverSpec(StrictModel):
    """Where searches go: a server (``url``), a built index directory (``index``) or corpus files (``corpus``)."""

    one_of: ClassVar[tuple[str, ...]] = ("url", "index", "corpus")

    url: str | None = Field(default=None, description="Base URL of a searchloop/FlashRAG-compatible retriever server.")
    index: str | None = Field(
        default=None, description="Directory built by `searchloop index build` (bm25, dense, colbert or hybrid).")
    corpus: list[str] | None = Field(
        default=None, description="Corpus jsonl file(s) to index with BM25 in memory (a single path is accepted).")
    token: SecretStr | None = Field(
        default=None, description=f"Bearer token for the server (recorded as '**********'; unset: ${TOKEN_ENV}).")
    timeout_s: float = Field(default=30.0, gt=0, description="HTTP timeout per retriever call (url).")
    wait_s: float = Field(default=0.0, ge=0, description="url: wait up to this long for the server to be healthy.")

    @model_validator(mode="before")
    @classmethod
    def _no_legacy_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, why in _LEGACY.items():
                if key in data:
                    raise ValueError(f"`{key}` is gone ({why}): set exactly one of url / index / corpus")
        return data

    @field_validator("corpus", mode="before")
    @classmethod
    def _one_path_is_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _exactly_one(self) -> RetrieverSpec:
        given = [k for k in self.one_of if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"set exactly one of url / index / corpus (got {given or 'none'}), e.g. "
                             "index=.searchloop/runs/indexes/<dir> or corpus=data/corpus/mini.jsonl")
        return self

    @property
    def kind(self) -> str:
        """``url``, ``index`` or ``corpus``: which one is set."""
        return next(k for k in self.one_of if getattr(self, k))

    def describe(self) -> str:
        """A short human/MLflow-safe description (no token)."""
        if self.url:
            return f"url:{self.url}"
        if self.index:
            return f"index:{self.index}"
        return "bm25:" + ",".join(self.corpus or [])


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

        return load_searcher(resolve_path(spec.index))
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
