"""On-disk passage store shared by the index backends: ``passages.jsonl`` + ``offsets.npy``, memory-mapped.

Writing streams the corpus once (so a corpus larger than RAM never sits in memory), optionally splitting long
documents into ~100-word passages, and records a content hash for every fixed-size shard of passages; the dense
builder embeds shard by shard and names each embedding file by that hash, which is what lets a crashed build resume.
Reading memory-maps the jsonl and decodes only the rows a search returns.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field

from infra.artifacts import atomic_open
from retrieval.corpus import iter_corpus, split_passages
from retrieval.types import Passage

PASSAGES = "passages.jsonl"
OFFSETS = "offsets.npy"


class ShardSpec(BaseModel):
    """A contiguous range of passages in the store and the hash of their ids and contents."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(description="Shard number, from 0.")
    start: int = Field(description="First passage row (inclusive).")
    stop: int = Field(description="Last passage row (exclusive).")
    content_hash: str = Field(description="SHA-256 over the shard's passage ids and contents.")


class StoreInfo(BaseModel):
    """What writing the store produced."""

    model_config = ConfigDict(frozen=True)

    n_passages: int = Field(description="Rows in the store (after splitting).")
    n_source_rows: int = Field(description="Rows read from the corpus file.")
    shards: list[ShardSpec] = Field(description="Shard plan over the store rows.")
    size_bytes: int = Field(description="Bytes of passages.jsonl + offsets.npy.")


def _passages(corpus: str | os.PathLike[str], split_words: int | None, limit: int | None) -> Iterator[Passage]:
    count = 0
    for p in iter_corpus(corpus):
        parts = split_passages([p], split_words) if split_words else [p]
        for part in parts:
            if limit is not None and count >= limit:
                return
            count += 1
            yield part


def write_store(
    corpus: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    shard_size: int,
    split_words: int | None = None,
    limit: int | None = None,
) -> StoreInfo:
    """Stream ``corpus`` into ``out_dir/passages.jsonl`` (+ offsets) and plan shards of ``shard_size`` rows.

    Args:
        corpus: jsonl corpus path (validated row by row; bad rows raise DataError with file:line).
        out_dir: local directory to write into.
        shard_size: passages per embedding shard.
        split_words: split documents longer than this many words (None keeps them whole).
        limit: keep only the first ``limit`` passages (for quick builds and benchmarks).
    """
    return write_passages(_passages(corpus, split_words, limit), out_dir, shard_size)


def corpus_passages(corpus: str | os.PathLike[str], split_words: int | None = None,
                    limit: int | None = None) -> Iterator[Passage]:
    """The passages :func:`write_store` would store for these arguments, in order (streamed)."""
    return _passages(corpus, split_words, limit)


def write_passages(passages: Iterable[Passage], out_dir: str | os.PathLike[str], shard_size: int) -> StoreInfo:
    """Write ``passages`` (in the given order) as a store in ``out_dir`` and plan shards of ``shard_size`` rows."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    offsets: list[int] = [0]
    shards: list[ShardSpec] = []
    h = hashlib.sha256()
    start = 0
    source_ids: set[str] = set()
    with atomic_open(out / PASSAGES, "wb") as fh:
        for i, p in enumerate(passages):
            line = orjson.dumps(p.model_dump()) + b"\n"
            fh.write(line)
            offsets.append(offsets[-1] + len(line))
            source_ids.add(p.id.split("#", 1)[0])
            h.update(line)
            if i + 1 - start == shard_size:
                shards.append(ShardSpec(index=len(shards), start=start, stop=i + 1, content_hash=h.hexdigest()))
                start, h = i + 1, hashlib.sha256()
    n = len(offsets) - 1
    if n > start:
        shards.append(ShardSpec(index=len(shards), start=start, stop=n, content_hash=h.hexdigest()))
    with atomic_open(out / OFFSETS, "wb") as fh:
        np.save(fh, np.asarray(offsets, dtype=np.int64))
    size = (out / PASSAGES).stat().st_size + (out / OFFSETS).stat().st_size
    return StoreInfo(n_passages=n, n_source_rows=len(source_ids), shards=shards, size_bytes=size)


class PassageStore:
    """Read-only, memory-mapped access to a store written by :func:`write_store`."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        d = Path(directory)
        self._offsets = np.load(d / OFFSETS)
        self._fh = open(d / PASSAGES, "rb")  # noqa: SIM115 - kept open for the mmap's lifetime
        size = os.fstat(self._fh.fileno()).st_size
        self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def close(self) -> None:
        """Release the memory map and file handle."""
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        self._fh.close()

    def __del__(self) -> None:
        fh = getattr(self, "_fh", None)
        if fh is not None and not fh.closed:
            self.close()

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> Passage:
        if not 0 <= i < len(self):
            raise IndexError(f"passage row {i} out of range 0..{len(self) - 1}")
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        return Passage(**orjson.loads(self._mm[lo:hi]))

    def rows(self, start: int, stop: int) -> list[Passage]:
        """Passages in rows [start, stop)."""
        return [self[i] for i in range(start, min(stop, len(self)))]

    def __iter__(self) -> Iterator[Passage]:
        for i in range(len(self)):
            yield self[i]

    def many(self, rows: Iterable[int]) -> list[Passage]:
        """Passages at the given rows, in order."""
        return [self[int(i)] for i in rows]
