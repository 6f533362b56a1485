"""Corpus change detection for scheduled retraining: whole-file hash, then per-passage hashes.

A watched corpus (local path or ``s3://``) has a state directory holding ``state.json`` (the corpus sha256, the
passage count and the index directory built from it) and ``passages.json`` (passage id -> content hash) of the
last corpus that was fully processed. ``check_corpus`` compares the file hash only (fast: one streamed read);
``diff_corpus`` reads the passages and sorts them into added / changed / deleted / unchanged; ``commit_state``
records a processed corpus (written last, so a crash before it means the next run redoes the work).
"""

from __future__ import annotations

import os
import time

from pydantic import Field

from infra import artifacts
from infra.config import StrictModel
from retrieval.corpus import iter_corpus
from retrieval.types import Passage

STATE = "state.json"
PASSAGE_HASHES = "passages.json"


class CorpusCheck(StrictModel):
    """Result of the fast whole-file check."""

    corpus: str = Field(description="Corpus URI that was checked.")
    sha256: str = Field(description="SHA-256 of the corpus file now.")
    previous_sha256: str | None = Field(default=None, description="SHA-256 recorded by the last processed run.")
    previous_index: str | None = Field(default=None, description="Index directory built from the previous corpus.")

    @property
    def changed(self) -> bool:
        """True when the corpus differs from the last processed one (or none was processed yet)."""
        return self.sha256 != self.previous_sha256


class CorpusDiff(StrictModel):
    """Per-passage differences between the last processed corpus and the current one."""

    added: list[str] = Field(default_factory=list, description="Ids of passages that are new.")
    changed: list[str] = Field(default_factory=list, description="Ids whose title or text changed.")
    deleted: list[str] = Field(default_factory=list, description="Ids that disappeared.")
    unchanged: int = Field(default=0, description="Number of passages with the same content hash.")
    total: int = Field(default=0, description="Passages in the current corpus.")

    def counts(self) -> dict[str, int]:
        """Counts for logging: added, changed, deleted, unchanged, total."""
        return {"added": len(self.added), "changed": len(self.changed), "deleted": len(self.deleted),
                "unchanged": self.unchanged, "total": self.total}


def passage_hash(p: Passage) -> str:
    """Content hash of one passage (id, title and text)."""
    return artifacts.content_hash([p.id, p.title, p.text])[:32]


def read_state(state_dir: str | os.PathLike[str]) -> dict | None:
    """The last committed state, or None when nothing was processed yet."""
    uri = artifacts.join(state_dir, STATE)
    return artifacts.read_json(uri) if artifacts.exists(uri) else None


def check_corpus(corpus: str | os.PathLike[str], state_dir: str | os.PathLike[str]) -> CorpusCheck:
    """Hash the corpus file and compare with the committed state (no parsing)."""
    state = read_state(state_dir) or {}
    return CorpusCheck(corpus=str(corpus), sha256=artifacts.file_sha256(corpus),
                       previous_sha256=state.get("sha256"),
                       previous_index=state.get("champion_index", state.get("index_dir")))


def passage_hashes(passages: list[Passage]) -> dict[str, str]:
    """Passage id -> content hash."""
    return {p.id: passage_hash(p) for p in passages}


def diff_passages(previous: dict[str, str], current: dict[str, str]) -> CorpusDiff:
    """Compare two id -> hash maps (pure)."""
    added = sorted(i for i in current if i not in previous)
    deleted = sorted(i for i in previous if i not in current)
    changed = sorted(i for i in current if i in previous and previous[i] != current[i])
    unchanged = sum(1 for i in current if previous.get(i) == current[i])
    return CorpusDiff(added=added, changed=changed, deleted=deleted, unchanged=unchanged, total=len(current))


def diff_corpus(corpus: str | os.PathLike[str], state_dir: str | os.PathLike[str]) -> tuple[CorpusDiff, list[Passage]]:
    """Read and validate the corpus and diff it against the committed passage hashes.

    Returns:
        The diff and the current passages (in file order).
    """
    passages = list(iter_corpus(corpus))
    uri = artifacts.join(state_dir, PASSAGE_HASHES)
    previous = artifacts.read_json(uri) if artifacts.exists(uri) else {}
    return diff_passages(previous, passage_hashes(passages)), passages


def commit_state(state_dir: str | os.PathLike[str], check: CorpusCheck, passages: list[Passage],
                 index_dir: str, extra: dict | None = None) -> dict:
    """Record ``check.sha256`` as processed with ``index_dir`` (passage hashes first, ``state.json`` last)."""
    artifacts.write_json(artifacts.join(state_dir, PASSAGE_HASHES), passage_hashes(passages))
    state = {"corpus": check.corpus, "sha256": check.sha256, "passages": len(passages), "index_dir": index_dir,
             "committed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(extra or {})}
    artifacts.write_json(artifacts.join(state_dir, STATE), state)
    return state

