"""Index builds and loading: one config, one ``build_index`` for every backend, one ``load_searcher`` for all.

A build writes a directory: the passage store, the backend's files, and ``manifest.json`` last (backend, full
config, config hash, corpus hash, counts, sizes, timings). ``load_searcher(dir)`` reads the manifest and returns the
right Searcher; what differs per backend lives in ``retrieval.backends`` (named in
``retrieval.index_config.INDEX_BACKENDS``). A hybrid index is a manifest over two complete sub-index directories.
The build runs in stages (``plan_index`` -> ``embed_shard`` per dense shard -> ``finalize_index``) so the Prefect
flow can retry and cache each stage; ``build_index`` runs the same stages in-process.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra.artifacts import MANIFEST, local_path, read_manifest, require_manifest, write_manifest
from infra.config import config_hash
from infra.errors import ArtifactError, ConfigError
from infra.paths import resolve_path
from infra.settings import get_settings
from retrieval.backends import get_backend
from retrieval.dense import SHARDS_DIR, ShardRef
from retrieval.index_config import INDEX_BACKENDS, BM25Config, IndexBuildConfig
from retrieval.store import StoreInfo
from retrieval.types import Searcher

log = logging.getLogger(__name__)
__all__ = ["INDEX_BACKENDS", "BM25Config", "IndexBuildConfig", "IndexPlan", "IndexRef", "build_index", "finalize_index",
           "load_searcher", "plan_index"]

class IndexRef(BaseModel):
    """A finished index directory and its headline facts (what tasks pass around)."""

    model_config = ConfigDict(frozen=True)

    uri: str = Field(description="Index directory.")
    backend: str = Field(description="Backend name.")
    n_passages: int = Field(description="Indexed passages (after splitting).")
    n_source_rows: int = Field(description="Corpus rows the passages came from.")
    size_bytes: int = Field(description="Bytes on disk, excluding embedding shards.")
    shards_bytes: int = Field(default=0, description="Bytes of dense embedding shards kept for rebuilds.")
    shards_reused: int = Field(default=0, description="Dense shards found finished on disk (resumed build).")
    timings: dict[str, float] = Field(default_factory=dict, description="Stage wall times in seconds.")
    config_hash: str = Field(description="Hash of the IndexBuildConfig.")
    corpus_sha256: str = Field(description="SHA-256 of the corpus file.")
    params: dict[str, Any] = Field(default_factory=dict, description="Effective backend parameters.")
    reused: bool = Field(default=False, description="True when a complete identical index was found and kept.")


class IndexPlan(BaseModel):
    """Result of the first build stage: the passage store is written and dense shards are planned."""

    model_config = ConfigDict(frozen=True)

    out_dir: str = Field(description="Index directory being built.")
    corpus: str = Field(description="Resolved corpus path.")
    corpus_sha256: str = Field(description="SHA-256 of the corpus file.")
    store: StoreInfo = Field(description="Passage store facts and shard plan.")
    seconds: float = Field(description="Time spent validating the corpus and writing the store.")


def _dir_bytes(d: Path, exclude: str | None = None) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not (exclude and exclude in p.parts))


def existing_index(cfg: IndexBuildConfig, out_dir: str | os.PathLike[str]) -> IndexRef | None:
    """The complete index in ``out_dir`` when it was built from the same config and corpus bytes, else None."""
    from retrieval.corpus import corpus_fingerprint

    m = read_manifest(out_dir)
    if not m or m.get("config_hash") != config_hash(cfg) or "ref" not in m:
        return None
    corpus = resolve_path(cfg.corpus)
    if ("://" in corpus or Path(corpus).exists()) and m.get("corpus_sha256") == corpus_fingerprint(corpus):
        return IndexRef.model_validate({**m["ref"], "reused": True})
    return None


def plan_index(cfg: IndexBuildConfig, out_dir: str | os.PathLike[str]) -> IndexPlan:
    """Stage 1: validate the corpus while streaming it into the passage store; plan embedding shards.

    The old manifest (if any) is removed first so a crash leaves the directory marked incomplete; finished
    shards in ``shards/`` are kept for resumption.
    """
    from retrieval.corpus import corpus_fingerprint
    from retrieval.store import write_store

    if get_backend(cfg.backend).parts(cfg):
        raise ConfigError(f"plan_index builds one backend; a {cfg.backend} index (of parts) is built by build_index")
    out = local_path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    corpus = resolve_path(cfg.corpus)
    t0 = time.perf_counter()
    sha = corpus_fingerprint(corpus) if "://" in corpus or Path(corpus).exists() else ""
    store = write_store(corpus, out, cfg.shard_size, cfg.split_words, cfg.limit)
    if store.n_passages == 0:
        raise ConfigError(f"corpus {corpus} yielded no passages; check the file and 'limit'")
    return IndexPlan(out_dir=str(out), corpus=corpus, corpus_sha256=sha, store=store,
                     seconds=time.perf_counter() - t0)


def finalize_index(cfg: IndexBuildConfig, plan: IndexPlan, shards: list[ShardRef] | None = None) -> IndexRef:
    """Stage 3: build the backend's index from the store (and dense shards) and write the manifest last."""
    out = Path(plan.out_dir)
    shards = list(shards or [])
    backend = get_backend(cfg.backend)
    if backend.embeds_shards and len(shards) != len(plan.store.shards):
        raise ArtifactError(f"{cfg.backend} build of {out} has {len(shards)} of {len(plan.store.shards)} shards; "
                            "rerun it")
    if missing := [s.path for s in shards if not Path(s.path).exists()]:
        raise ArtifactError(f"embedding shard(s) {missing[:3]} are gone (deleted after a cached run); rebuild with "
                            "force=true, which refreshes the task cache")
    t0 = time.perf_counter()
    params = backend.build(cfg, out, shards)
    keep = {Path(s.path).name for s in shards}
    for stale in (out / SHARDS_DIR).glob("*") if (out / SHARDS_DIR).exists() else []:
        if stale.name not in keep:  # shards of an older plan (other shard size, encoder or corpus)
            stale.unlink()
    timings = {"store_s": plan.seconds, "index_s": time.perf_counter() - t0, "embed_s": sum(s.seconds for s in shards)}
    ref = IndexRef(
        uri=str(out), backend=cfg.backend, n_passages=plan.store.n_passages, n_source_rows=plan.store.n_source_rows,
        size_bytes=_dir_bytes(out, exclude=SHARDS_DIR), shards_bytes=_dir_bytes(out / SHARDS_DIR)
        if (out / SHARDS_DIR).exists() else 0, timings=timings, config_hash=config_hash(cfg),
        corpus_sha256=plan.corpus_sha256, params=params, shards_reused=sum(s.cached for s in shards),
    )
    write_manifest(out, kind="index", backend=cfg.backend, config=cfg.model_dump(mode="json"),
                   config_hash=ref.config_hash, corpus=plan.corpus, corpus_sha256=plan.corpus_sha256,
                   shards=[s.model_dump() for s in shards], ref=ref.model_dump())
    return ref


def index_parts(cfg: IndexBuildConfig) -> list[str]:
    """The sub-backends of a composite index (hybrid: its two parts), [] for a single index."""
    return get_backend(cfg.backend).parts(cfg)


def part_config(cfg: IndexBuildConfig, part: str) -> IndexBuildConfig:
    """The config of one sub-index of a composite (hybrid) index.

    Raises:
        ConfigError: when ``part`` is unknown or itself composite.
    """
    if part not in INDEX_BACKENDS or get_backend(part).parts(cfg.model_copy(update={"backend": part})):
        singles = [n for n in INDEX_BACKENDS if not get_backend(n).parts(cfg.model_copy(update={"backend": n}))]
        raise ConfigError(f"{cfg.backend} part {part!r} must be one of {', '.join(singles)}")
    return cfg.model_copy(update={"backend": part})


def finalize_hybrid(cfg: IndexBuildConfig, out_dir: str | os.PathLike[str], parts: list[IndexRef]) -> IndexRef:
    """Write the manifest of a composite (hybrid) index over finished sub-indexes in ``out_dir/<backend>``."""
    out = local_path(out_dir)
    params = {"parts": [p.backend for p in parts], **get_backend(cfg.backend).build(cfg, out, [])}
    ref = IndexRef(
        uri=str(out), backend=cfg.backend, n_passages=parts[0].n_passages, n_source_rows=parts[0].n_source_rows,
        size_bytes=sum(p.size_bytes for p in parts), shards_bytes=sum(p.shards_bytes for p in parts),
        timings={f"{p.backend}.{k}": v for p in parts for k, v in p.timings.items()},
        config_hash=config_hash(cfg), corpus_sha256=parts[0].corpus_sha256,
        params=params,
    )
    write_manifest(out, kind="index", backend=cfg.backend, config=cfg.model_dump(mode="json"),
                   config_hash=ref.config_hash, corpus=resolve_path(cfg.corpus),
                   corpus_sha256=ref.corpus_sha256, parts=[p.backend for p in parts], ref=ref.model_dump())
    return ref


def default_index_dir(cfg: IndexBuildConfig) -> Path:
    """``<home>/runs/indexes/<backend>-<config hash>``."""
    return get_settings().runs_dir / "indexes" / f"{cfg.backend}-{config_hash(cfg)}"


def build_index(cfg: IndexBuildConfig, out_dir: str | os.PathLike[str] | None = None, force: bool = False) -> IndexRef:
    """Build (or resume, or reuse) the index described by ``cfg`` in ``out_dir``.

    Args:
        cfg: the build config.
        out_dir: target directory (default: :func:`default_index_dir`).
        force: rebuild even when a complete index with the same config and corpus is there.
    """
    from retrieval.dense import embed_shard

    out = Path(out_dir) if out_dir is not None else default_index_dir(cfg)
    if not force and (ref := existing_index(cfg, out)) is not None:
        return ref
    if part_names := index_parts(cfg):
        parts = [build_index(part_config(cfg, p), out / p, force) for p in part_names]
        return finalize_hybrid(cfg, out, parts)
    plan = plan_index(cfg, out)
    shards = []
    if get_backend(cfg.backend).embeds_shards:
        shards = [embed_shard(out, spec, out / SHARDS_DIR, cfg.encoder) for spec in plan.store.shards]
    return finalize_index(cfg, plan, shards)


def load_searcher(index_dir: str | Path, query_backend: str | None = None,
                  query_model: str | None = None) -> Searcher:
    """Open a finished index directory (any backend) as a Searcher; ``query_backend`` (a dense encoder's
    ``EncoderConfig.query_backend``: torch, torch-int8, onnx, onnx-int8) and ``query_model``
    (``EncoderConfig.query_model``, a distilled query encoder) replace the ones the index was built with.

    Raises:
        ArtifactError: when the directory has no manifest (missing or unfinished build).
    """
    manifest = require_manifest(index_dir, kind="index")
    cfg = IndexBuildConfig.model_validate(manifest["config"])
    update = {k: v for k, v in (("query_backend", query_backend), ("query_model", query_model)) if v is not None}
    if update:
        cfg = cfg.model_copy(update={"encoder": cfg.encoder.model_copy(update=update)})
    name = manifest.get("backend")
    if name not in INDEX_BACKENDS:
        raise ArtifactError(f"{index_dir}/manifest.json has unknown backend {name!r}; rebuild the index (or register "
                            "the backend in retrieval.index_config.INDEX_BACKENDS)")
    d = local_path(index_dir)
    parts = [load_searcher(d / p, query_backend, query_model) for p in manifest.get("parts", [])]
    return get_backend(name).open(d, cfg, parts)


def log_index_run(name: str, cfg: IndexBuildConfig, ref: IndexRef, report: Any = None,
                  extra_params: dict[str, Any] | None = None) -> str:
    """Record a build in MLflow (params, counts, timings, sizes, recall metrics); returns the run id.

    Args:
        name: run name.
        cfg: the build config (logged as flattened params).
        ref: the built index.
        report: a ``retrieval.recall.RecallReport`` (its metrics are logged) or None.
        extra_params: more params (e.g. the eval files).
    """
    from infra.tracking import log_metrics, stage_run

    params = {"index": cfg.model_dump(mode="json"), "index_dir": ref.uri, "config_hash": ref.config_hash,
              **(extra_params or {})}
    with stage_run(name, params=params, tags={"stage": "build_index", "backend": ref.backend}) as run:
        metrics = {"n_passages": ref.n_passages, "n_source_rows": ref.n_source_rows, "index_size_bytes": ref.size_bytes,
                   "shards_bytes": ref.shards_bytes, "shards_reused": ref.shards_reused, "reused": float(ref.reused),
                   **{f"time.{k}": v for k, v in ref.timings.items()}}
        if report is not None:
            metrics.update(report.metrics())
        log_metrics(metrics)
        return run.info.run_id
