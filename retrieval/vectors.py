"""Per-passage embedding store of a finished dense index: content-keyed lookup of the vectors its shards hold.

A dense index keeps its passage vectors in ``shards/*.npy`` (float32, row-aligned with the passage store). Every
row gets a content key = hash(encoder fingerprint, passage id, title, text). The fingerprint
(``retrieval.encoders.config_fingerprint``) covers the model name, the query/passage prefixes, normalization and
max length, so a passage whose text changed, or any passage under a different encoder or prefix, never matches a
stored vector. ``retrieval.update.diff_store`` looks new passages up by key against the stored rows: hits reuse
the stored vector (``VectorStore.vectors``), misses are encoded.
Nothing is loaded into RAM beyond the rows asked for (shards are memory-mapped).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from infra.artifacts import content_hash, read_manifest
from retrieval.dense import SHARDS_DIR, ShardRef
from retrieval.encoders import EncoderConfig, config_fingerprint
from retrieval.store import PassageStore
from retrieval.types import Passage


def passage_key(p: Passage, fingerprint: str) -> str:
    """Content key of one passage's embedding under the encoder with ``fingerprint``."""
    return content_hash([fingerprint, p.id, p.title, p.text])[:32]


def read_rows(shards: Sequence[ShardRef], rows: Sequence[int] | np.ndarray) -> np.ndarray:
    """Vectors at global ``rows`` of row-ordered shard files; returns float32 [len(rows), dim] in the given order."""
    shards = sorted(shards, key=lambda s: s.index)
    if not shards:
        raise ValueError("no shards to read vectors from")
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(rows), shards[0].dim), dtype=np.float32)
    if not len(rows):
        return out
    starts = np.cumsum([0] + [s.n for s in shards])
    if rows.min() < 0 or rows.max() >= starts[-1]:
        raise IndexError(f"vector rows must be in 0..{starts[-1] - 1}, got {rows.min()}..{rows.max()}")
    which = np.searchsorted(starts, rows, side="right") - 1
    for s in np.unique(which):
        sel = np.nonzero(which == s)[0]
        arr = np.load(shards[s].path, mmap_mode="r")
        out[sel] = arr[rows[sel] - starts[s]]
    return out


class VectorStore:
    """The stored passage vectors of a finished dense index, addressable by content key."""

    def __init__(self, index_dir: Path, shards: list[ShardRef], encoder: EncoderConfig) -> None:
        self.index_dir = index_dir
        self.shards = shards
        self.fingerprint = config_fingerprint(encoder)
        self.store = PassageStore(index_dir)

    @classmethod
    def open(cls, index_dir: str | os.PathLike[str]) -> tuple[VectorStore | None, str]:
        """Open the vectors of a finished dense index; returns (store, "") or (None, why not)."""
        from retrieval.index_config import IndexBuildConfig

        d = Path(index_dir)
        m = read_manifest(d)
        if not m or m.get("backend") != "dense":
            return None, f"{d} is not a finished dense index"
        # shard paths are stored absolute; relocate them into this directory so a moved index still works
        shards = [ShardRef.model_validate({**s, "path": str(d / SHARDS_DIR / Path(s["path"]).name)})
                  for s in m.get("shards", [])]
        if missing := [s.path for s in shards if not Path(s.path).exists()]:
            return None, f"{d} lost {len(missing)} embedding shard(s) (e.g. {missing[0]}); vectors cannot be reused"
        n = sum(s.n for s in shards)
        store = cls(d, shards, IndexBuildConfig.model_validate(m["config"]).encoder)
        if n != len(store.store):
            return None, f"{d} has {n} stored vectors for {len(store.store)} passages; vectors cannot be reused"
        return store, ""

    def __len__(self) -> int:
        return len(self.store)

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        return self.shards[0].dim

    def vectors(self, rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """Stored vectors at ``rows`` (float32 [len(rows), dim])."""
        return read_rows(self.shards, rows)
