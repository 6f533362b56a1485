"""Retriever backends behind one interface: how each index type is built, opened and updated.

``retrieval.index`` (build, load), ``retrieval.update`` (incremental updates) and the ``build-index`` flow ask the
backend named in the config, never ``if backend == ...``. A backend is an :class:`IndexBackend` subclass named in
``retrieval.index_config.INDEX_BACKENDS``; engines are imported inside its methods, so naming a backend costs
nothing until it is used. What a subclass provides:

- ``build(cfg, out, shards)``: write the backend's files into ``out`` (the passage store is already there) and
  return its effective parameters; ``embeds_shards = True`` makes the build embed dense shards first
  (``plan_index`` -> ``embed_shard`` per shard -> ``finalize_index``), passed in as ``shards``;
- ``open(d, cfg, parts)``: the :class:`~retrieval.types.Searcher` of a finished directory;
- ``parts(cfg)``: the sub-backends of a composite index (hybrid), each built into ``<out>/<part>``;
- ``incompatibility`` / ``prepare_update`` / ``update``: incremental updates; the default rebuilds the backend's
  files from the updated passage store (what BM25 needs: its statistics are corpus-wide).

docs/extending.md shows a toy backend registered from a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from infra.errors import ConfigError
from retrieval.dense import ShardRef
from retrieval.index_config import INDEX_BACKENDS, IndexBuildConfig
from retrieval.store import StoreInfo
from retrieval.types import Searcher

COLBERT_SEARCH_TIME = {"ef_search", "k_token", "batch_size", "chunk_size"}
FAISS_SEARCH_TIME = {"ef_search", "nprobe", "use_gpu"}


class FullRebuild(Exception):  # noqa: N818 - a signal, not an error: the update falls back to a full build
    """Raised by :meth:`IndexBackend.prepare_update` when the previous index cannot be updated (the reason)."""


@dataclass
class UpdateInput:
    """What a backend's incremental update gets: the new store is written, ordered kept rows then fresh rows."""

    cfg: IndexBuildConfig
    previous_cfg: IndexBuildConfig
    previous: Path
    out: Path
    store: StoreInfo
    kept_rows: list[int]
    removed: list[int]
    state: Any = None
    encoder: Any = None


@dataclass
class BackendUpdate:
    """What a backend's incremental update did."""

    params: dict[str, Any]
    how: str
    encoded: int = 0
    reused: int = 0
    shards: list[ShardRef] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


class IndexBackend:
    """One index type. Subclass it, override what the type needs, and name the class in ``INDEX_BACKENDS``."""

    embeds_shards: ClassVar[bool] = False

    def parts(self, cfg: IndexBuildConfig) -> list[str]:
        """Sub-backends of a composite index, each a complete index in ``<out>/<part>`` ([] for a single index)."""
        return []

    def build(self, cfg: IndexBuildConfig, out: Path, shards: list[ShardRef]) -> dict[str, Any]:
        """Write the backend's files into ``out`` (its passage store is written); return the effective params."""
        raise NotImplementedError(f"{type(self).__name__} must define build()")

    def open(self, d: Path, cfg: IndexBuildConfig, parts: list[Searcher]) -> Searcher:
        """The Searcher of the finished index in ``d`` (``parts``: the opened sub-indexes of a composite)."""
        raise NotImplementedError(f"{type(self).__name__} must define open()")

    def incompatibility(self, previous: IndexBuildConfig, cfg: IndexBuildConfig) -> str:
        """Why an index built with ``previous`` cannot be updated into ``cfg`` ('' when it can)."""
        return ""

    def prepare_update(self, cfg: IndexBuildConfig, previous: Path) -> tuple[str, Any]:
        """(content-key fingerprint of the passage diff, state handed to :meth:`update`).

        Raises:
            FullRebuild: when the previous index lacks what an incremental update needs.
        """
        return cfg.backend, None

    def update(self, job: UpdateInput) -> BackendUpdate:
        """Bring ``job.out`` up to date from ``job.previous``; by default rebuild from the updated store."""
        params = self.build(job.cfg, job.out, [])
        return BackendUpdate(params=params, how=f"{job.cfg.backend}: rebuilt from the store")

    def encoded_by_full_build(self, out: Path, manifest: dict[str, Any]) -> int:
        """Passages the full build that wrote ``manifest`` in ``out`` had to encode (0 for lexical backends)."""
        return 0


@cache
def _instance(target: str) -> IndexBackend:
    from infra.lazy import load_object

    backend = load_object(target)()
    if not isinstance(backend, IndexBackend):
        raise ConfigError(f"index backend {target!r} is a {type(backend).__name__}, not an IndexBackend subclass")
    return backend


def get_backend(name: str) -> IndexBackend:
    """The backend named ``name`` in ``INDEX_BACKENDS`` (imported on first use).

    Raises:
        ConfigError: for an unknown name (listing the known ones) or a target that is not an IndexBackend.
    """
    from infra.lazy import unknown_name

    target = INDEX_BACKENDS.get(name)
    if target is None:
        raise ConfigError(unknown_name("index backend", name, INDEX_BACKENDS))
    return _instance(target)


class BM25Backend(IndexBackend):
    """BM25 on bm25s; an update rebuilds it (bm25s statistics are corpus-wide; cheap, benchmarks/index_update.py)."""

    def build(self, cfg: IndexBuildConfig, out: Path, shards: list[ShardRef]) -> dict[str, Any]:
        from retrieval.bm25 import BM25Searcher
        from retrieval.store import PassageStore

        BM25Searcher.build(list(PassageStore(out)), k1=cfg.bm25.k1, b=cfg.bm25.b).save(out, write_passages=False)
        return {"k1": cfg.bm25.k1, "b": cfg.bm25.b}

    def open(self, d: Path, cfg: IndexBuildConfig, parts: list[Searcher]) -> Searcher:
        from retrieval.bm25 import BM25Searcher

        return BM25Searcher.load(d)

    def update(self, job: UpdateInput) -> BackendUpdate:
        params = self.build(job.cfg, job.out, [])
        return BackendUpdate(params=params, how="bm25: rebuilt from the store (bm25s statistics are corpus-wide)")


class DenseBackend(IndexBackend):
    """faiss over encoder shards; an update reuses every stored vector and encodes only fresh passages."""

    embeds_shards = True

    def build(self, cfg: IndexBuildConfig, out: Path, shards: list[ShardRef]) -> dict[str, Any]:
        from retrieval.dense import INDEX_FILE, build_faiss_index

        return build_faiss_index(shards, cfg.faiss, out / INDEX_FILE)

    def open(self, d: Path, cfg: IndexBuildConfig, parts: list[Searcher]) -> Searcher:
        from retrieval.dense import DenseSearcher
        from retrieval.encoders import get_encoder

        return DenseSearcher.load(d, cfg.faiss, get_encoder(cfg.encoder))

    def incompatibility(self, previous: IndexBuildConfig, cfg: IndexBuildConfig) -> str:
        from retrieval.encoders import config_fingerprint

        if config_fingerprint(previous.encoder) != config_fingerprint(cfg.encoder):
            return "encoder changed (model, prefixes, normalization or max length)"
        return ""

    def prepare_update(self, cfg: IndexBuildConfig, previous: Path) -> tuple[str, Any]:
        from retrieval.vectors import VectorStore

        vectors, why = VectorStore.open(previous)
        if vectors is None:
            raise FullRebuild(why)
        return vectors.fingerprint, vectors

    def update(self, job: UpdateInput) -> BackendUpdate:
        import time

        from retrieval.update_backends import assemble_shards, update_faiss

        t0 = time.perf_counter()
        shards, encoded = assemble_shards(job.cfg, job.out, job.store, job.kept_rows, job.state, job.encoder)
        embed_s, t1 = time.perf_counter() - t0, time.perf_counter()
        same = (job.previous_cfg.faiss.model_dump(exclude=FAISS_SEARCH_TIME)
                == job.cfg.faiss.model_dump(exclude=FAISS_SEARCH_TIME))
        params, how = update_faiss(job.cfg.faiss, job.previous, job.out, job.removed, shards, len(job.kept_rows),
                                   rebuild=not same)
        return BackendUpdate(params=params, how=how, encoded=encoded, reused=len(job.kept_rows), shards=shards,
                             timings={"embed_s": embed_s, "faiss_s": time.perf_counter() - t1})

    def encoded_by_full_build(self, out: Path, manifest: dict[str, Any]) -> int:
        return sum(s["n"] for s in manifest.get("shards", []) if not s.get("cached"))


class ColbertBackend(IndexBackend):
    """Late interaction (PyLate + Voyager, or RAGatouille/PLAID); Voyager updates in place."""

    def build(self, cfg: IndexBuildConfig, out: Path, shards: list[ShardRef]) -> dict[str, Any]:
        from retrieval.colbert import build_colbert_index

        return build_colbert_index(out, cfg.colbert)

    def open(self, d: Path, cfg: IndexBuildConfig, parts: list[Searcher]) -> Searcher:
        from retrieval.colbert import ColbertSearcher

        return ColbertSearcher.load(d, cfg.colbert)

    def incompatibility(self, previous: IndexBuildConfig, cfg: IndexBuildConfig) -> str:
        if cfg.colbert.engine != "pylate-voyager":
            return f"colbert engine {cfg.colbert.engine} has no in-place update; rebuilt"
        if previous.colbert.model_dump(exclude=COLBERT_SEARCH_TIME) != cfg.colbert.model_dump(
                exclude=COLBERT_SEARCH_TIME):
            return "colbert model or index parameters changed"
        return ""

    def update(self, job: UpdateInput) -> BackendUpdate:
        from retrieval.update_backends import update_colbert

        params, how, encoded = update_colbert(job.cfg.colbert, job.previous, job.out, job.kept_rows, job.removed)
        return BackendUpdate(params=params, how=how, encoded=encoded, reused=len(job.kept_rows))

    def encoded_by_full_build(self, out: Path, manifest: dict[str, Any]) -> int:
        return int((manifest.get("ref") or {}).get("n_passages", 0))


class HybridBackend(IndexBackend):
    """Reciprocal-rank fusion of two complete sub-indexes (``hybrid.first``, ``hybrid.second``)."""

    def parts(self, cfg: IndexBuildConfig) -> list[str]:
        return [cfg.hybrid.first, cfg.hybrid.second]

    def build(self, cfg: IndexBuildConfig, out: Path, shards: list[ShardRef]) -> dict[str, Any]:
        return {"rrf_k": cfg.hybrid.rrf_k, "candidates": cfg.hybrid.candidates}

    def open(self, d: Path, cfg: IndexBuildConfig, parts: list[Searcher]) -> Searcher:
        from retrieval.hybrid import HybridSearcher

        first, second = parts
        return HybridSearcher(first, second, cfg.hybrid.rrf_k, cfg.hybrid.candidates)

    def incompatibility(self, previous: IndexBuildConfig, cfg: IndexBuildConfig) -> str:
        return "hybrid parts changed" if self.parts(previous) != self.parts(cfg) else ""

    def encoded_by_full_build(self, out: Path, manifest: dict[str, Any]) -> int:
        from infra.artifacts import read_manifest

        total = 0
        for part in manifest.get("parts", []):
            m = read_manifest(out / part) or {}
            total += get_backend(part).encoded_by_full_build(out / part, m) if m else 0
        return total
