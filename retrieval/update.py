"""Incremental index updates: the index of a changed corpus, built from a finished index of the previous corpus.

``update_index(cfg, previous_dir, out_dir)`` diffs the passages of ``cfg.corpus`` (after the same splitting and
limit as a build) against the previous index's passage store by content key (passage id + title + text, and for
dense indexes the encoder fingerprint: model, prefixes, normalization, length). It writes a new index directory:
- the passage store, ordered *kept passages in their old order, then new/changed passages in corpus order*;
- dense: embedding shards assembled from the previous index's stored vectors (``retrieval.vectors``) plus the
  fresh passages, which are the only ones encoded; then the faiss index updated in place or rebuilt from the
  stored vectors (``retrieval.update_backends`` says which, per index type);
- bm25: rebuilt (corpus-wide statistics; cheap, see ``benchmarks/index_update.py``); colbert: Voyager in place;
  what each backend does is its :class:`retrieval.backends.IndexBackend`'s ``update`` (no per-backend branch here);
- ``manifest.json`` last, with the usual index fields plus ``update`` (previous index, method, counts: added,
  changed, deleted, unchanged, reused, encoded; how each backend was updated; timings).
The previous index is only read, so it stays servable throughout; a crash leaves ``out_dir`` without a manifest
(incomplete, never loaded), and a rerun resumes from the embedding shards already written (content-addressed).
When no usable previous index exists or the build parameters changed (backend, encoder, faiss/colbert build
parameters), it falls back to a full ``build_index`` and records why.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra.artifacts import MANIFEST, local_path, read_manifest, write_manifest
from infra.config import StrictModel, config_hash
from infra.errors import ConfigError
from infra.paths import resolve_path
from retrieval import encoders
from retrieval.backends import FullRebuild, UpdateInput, get_backend
from retrieval.dense import SHARDS_DIR, ShardRef
from retrieval.index import (
    IndexBuildConfig,
    IndexRef,
    build_index,
    default_index_dir,
    existing_index,
    finalize_hybrid,
    index_parts,
    part_config,
)
from retrieval.store import PASSAGES, PassageStore, StoreInfo, corpus_passages, write_passages
from retrieval.types import Passage
from retrieval.vectors import passage_key

log = logging.getLogger(__name__)


class UpdateCounts(StrictModel):
    """What an update found and did, in passages (after splitting)."""

    added: int = Field(default=0, description="Passages whose id is new.")
    changed: int = Field(default=0, description="Passages whose id existed with other title/text.")
    deleted: int = Field(default=0, description="Passages of the previous index whose id is gone.")
    unchanged: int = Field(default=0, description="Passages identical to the previous index's.")
    reused: int = Field(default=0, description="Stored vectors reused without encoding (dense, colbert).")
    encoded: int = Field(default=0, description="Passages encoded by this update.")
    total: int = Field(default=0, description="Passages in the new index.")


class IndexUpdate(BaseModel):
    """Result of :func:`update_index`: the new index and how it was obtained."""

    model_config = ConfigDict(frozen=True)

    ref: IndexRef = Field(description="The new (finished) index.")
    previous: str = Field(description="Previous index directory the update started from.")
    method: str = Field(description="'incremental', or 'full' when a full build was needed (see reason).")
    reason: str = Field(default="", description="Why a full build was done instead ('' for incremental).")
    how: str = Field(default="", description="How the backend index was updated (in place or rebuilt).")
    counts: UpdateCounts = Field(description="Passage counts.")
    timings: dict[str, float] = Field(default_factory=dict, description="Wall times in seconds.")

    def record(self) -> dict[str, Any]:
        """The manifest's ``update`` entry (everything but the ref)."""
        return self.model_dump(mode="json", exclude={"ref"})


@dataclass
class PassageDiff:
    """Previous store vs new passages, keyed by content: what is kept (by old row) and what is fresh."""

    kept_rows: list[int] = field(default_factory=list)
    kept: list[Passage] = field(default_factory=list)
    fresh: list[Passage] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    counts: UpdateCounts = field(default_factory=UpdateCounts)


def diff_store(previous: PassageStore, passages: Any, fingerprint: str) -> PassageDiff:
    """Sort ``passages`` into kept (same content key as a previous row) and fresh; list removed previous rows."""
    old_row: dict[str, int] = {}
    old_ids: set[str] = set()
    for i, p in enumerate(previous):
        old_row[passage_key(p, fingerprint)] = i
        old_ids.add(p.id)
    kept: list[tuple[int, Passage]] = []
    fresh: list[Passage] = []
    new_ids: set[str] = set()
    changed = 0
    for p in passages:
        new_ids.add(p.id)
        row = old_row.get(passage_key(p, fingerprint))
        if row is None:
            fresh.append(p)
            changed += p.id in old_ids
        else:
            kept.append((row, p))
    kept.sort(key=lambda rp: rp[0])
    kept_set = {r for r, _ in kept}
    counts = UpdateCounts(added=len(fresh) - changed, changed=changed, deleted=len(old_ids - new_ids),
                          unchanged=len(kept), total=len(kept) + len(fresh))
    return PassageDiff(kept_rows=[r for r, _ in kept], kept=[p for _, p in kept], fresh=fresh,
                       removed=[r for r in range(len(previous)) if r not in kept_set], counts=counts)


def incompatibility(previous: IndexBuildConfig, cfg: IndexBuildConfig) -> str:
    """Why ``previous`` cannot be updated into ``cfg`` ('' when it can): the backend changed, or the backend says
    so (encoder, ColBERT parameters, hybrid parts). Changed faiss parameters are no reason: the stored vectors are
    reused and the faiss index rebuilt."""
    if previous.backend != cfg.backend:
        return f"backend changed ({previous.backend} -> {cfg.backend})"
    return get_backend(cfg.backend).incompatibility(previous, cfg)


def _dir_bytes(d: Path, exclude: str | None = None) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not (exclude and exclude in p.parts))


def _annotate(out: Path, update: IndexUpdate) -> IndexUpdate:
    """Rewrite ``out``'s manifest with the update record (the manifest stays the last file written)."""
    m = read_manifest(out) or {}
    fields = {k: v for k, v in m.items() if k not in {"created_at", "versions", "files"}}
    write_manifest(out, **{**fields, "update": update.record()})
    return update


def _full(cfg: IndexBuildConfig, previous: Path, out: Path, reason: str) -> IndexUpdate:
    """Full build of ``cfg`` into ``out``, recorded as an update from ``previous`` with ``reason``."""
    log.info("full rebuild of %s: %s", out, reason)
    t0 = time.perf_counter()
    ref = build_index(cfg, out, force=True)
    counts = UpdateCounts(total=ref.n_passages, added=ref.n_passages)
    if read_manifest(previous) and (previous / PASSAGES).exists() and (out / PASSAGES).exists():
        counts = diff_store(PassageStore(previous), PassageStore(out), "").counts
    encoded = get_backend(cfg.backend).encoded_by_full_build(out, read_manifest(out) or {})
    counts = counts.model_copy(update={"encoded": encoded, "reused": 0})
    update = IndexUpdate(ref=ref, previous=str(previous), method="full", reason=reason,
                         how=f"{cfg.backend}: full build",
                         counts=counts, timings={"total_s": time.perf_counter() - t0})
    return _annotate(out, update)


def _incremental(cfg: IndexBuildConfig, previous: Path, out: Path, encoder: encoders.Encoder | None,
                 prev_cfg: IndexBuildConfig) -> IndexUpdate:
    from retrieval.corpus import corpus_fingerprint

    backend = get_backend(cfg.backend)
    try:
        fingerprint, state = backend.prepare_update(cfg, previous)
    except FullRebuild as why:
        return _full(cfg, previous, out, str(why))
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    corpus = resolve_path(cfg.corpus)
    sha = corpus_fingerprint(corpus)
    diff = diff_store(PassageStore(previous), corpus_passages(corpus, cfg.split_words, cfg.limit), fingerprint)
    if diff.counts.total == 0:
        raise ConfigError(f"corpus {corpus} yielded no passages; check the file and 'limit'")
    info = write_passages([*diff.kept, *diff.fresh], out, cfg.shard_size)
    timings, t1 = {"diff_store_s": time.perf_counter() - t0}, time.perf_counter()
    done = backend.update(UpdateInput(cfg=cfg, previous_cfg=prev_cfg, previous=previous, out=out, store=info,
                                      kept_rows=diff.kept_rows, removed=diff.removed, state=state, encoder=encoder))
    counts = diff.counts.model_copy(update={"encoded": done.encoded, "reused": done.reused})
    if "embed_s" in done.timings:
        timings["embed_s"] = done.timings["embed_s"]
    timings["index_s"] = time.perf_counter() - t1 - timings.get("embed_s", 0.0)
    timings["total_s"] = time.perf_counter() - t0
    return _finalize(cfg, previous, out, corpus, sha, info, done.shards, done.params, counts, done.how, timings)


def _finalize(cfg: IndexBuildConfig, previous: Path, out: Path, corpus: str, sha: str, info: StoreInfo,
              shards: list[ShardRef], params: dict[str, Any], counts: UpdateCounts, how: str,
              timings: dict[str, float]) -> IndexUpdate:
    shards_bytes = _dir_bytes(out / SHARDS_DIR) if (out / SHARDS_DIR).exists() else 0
    ref = IndexRef(uri=str(out), backend=cfg.backend, n_passages=info.n_passages, n_source_rows=info.n_source_rows,
                   size_bytes=_dir_bytes(out, exclude=SHARDS_DIR), shards_bytes=shards_bytes, timings=timings,
                   config_hash=config_hash(cfg), corpus_sha256=sha, params=params,
                   shards_reused=sum(s.cached for s in shards))
    update = IndexUpdate(ref=ref, previous=str(previous), method="incremental", how=how, counts=counts,
                         timings=timings)
    write_manifest(out, kind="index", backend=cfg.backend, config=cfg.model_dump(mode="json"),
                   config_hash=ref.config_hash, corpus=corpus, corpus_sha256=sha,
                   shards=[s.model_dump() for s in shards], ref=ref.model_dump(), update=update.record())
    log.info("updated index %s from %s: %s; %s", out, previous, counts.model_dump(), how)
    return update


def _hybrid(cfg: IndexBuildConfig, previous: Path, out: Path, encoder: encoders.Encoder | None) -> IndexUpdate:
    parts = [update_index(part_config(cfg, p), previous / p, out / p, encoder) for p in index_parts(cfg)]
    ref = finalize_hybrid(cfg, out, [u.ref for u in parts])
    first = parts[0].counts
    counts = first.model_copy(update={"reused": sum(u.counts.reused for u in parts),
                                      "encoded": sum(u.counts.encoded for u in parts)})
    method = "incremental" if all(u.method == "incremental" for u in parts) else "full"
    update = IndexUpdate(ref=ref, previous=str(previous), method=method,
                         reason="; ".join(f"{u.ref.backend}: {u.reason}" for u in parts if u.reason),
                         how="; ".join(u.how for u in parts), counts=counts,
                         timings={f"{u.ref.backend}.{k}": v for u in parts for k, v in u.timings.items()})
    return _annotate(out, update)


def update_index(cfg: IndexBuildConfig, previous_dir: str | os.PathLike[str],
                 out_dir: str | os.PathLike[str] | None = None, encoder: encoders.Encoder | None = None) -> IndexUpdate:
    """Build the index of ``cfg.corpus`` in ``out_dir`` by updating the finished index in ``previous_dir``.

    Only new and changed passages are encoded; every unchanged vector is reused; deleted passages are removed.
    Falls back to a full build (recorded with its reason) when the previous index is missing, unfinished or was
    built with other parameters.

    Args:
        cfg: the build config of the new index (its ``corpus`` is the new corpus).
        previous_dir: finished index of the previous corpus (only read).
        out_dir: new index directory (default: :func:`retrieval.index.default_index_dir`); must differ from
            ``previous_dir``.
        encoder: an Encoder to use instead of loading ``cfg.encoder`` (its outputs must match that config).

    Raises:
        ConfigError: when ``out_dir`` is ``previous_dir`` or the corpus yields no passages.
    """
    out = local_path(out_dir) if out_dir is not None else default_index_dir(cfg)
    previous = local_path(previous_dir)
    if (ref := existing_index(cfg, out)) is not None:  # e.g. a rerun, or the corpus went back to an indexed version
        record = (read_manifest(out) or {}).get("update")
        if record:
            return IndexUpdate.model_validate({**record, "ref": ref})
        return IndexUpdate(ref=ref, previous=str(previous), method="reused", counts=UpdateCounts(
            unchanged=ref.n_passages, total=ref.n_passages))
    if out.resolve() == previous.resolve():
        raise ConfigError(f"update_index out_dir {out} is the previous index; write the update to a new directory "
                          "(the previous index must stay readable until the new one is complete)")
    m = read_manifest(previous)
    if m is None or m.get("kind") != "index":
        return _full(cfg, previous, out, f"no finished index at {previous}")
    prev_cfg = IndexBuildConfig.model_validate(m["config"])
    if reason := incompatibility(prev_cfg, cfg):
        return _full(cfg, previous, out, reason)
    if index_parts(cfg):
        return _hybrid(cfg, previous, out, encoder)
    return _incremental(cfg, previous, out, encoder, prev_cfg)
