"""Corpus reading and validation for the jsonl formats users have, plus ~100-word passage splitting.

Accepted rows (one JSON object per line):
- FlashRAG / Search-R1: ``{"id", "contents"}`` with contents = ``"Title"\\ntext`` (quotes optional);
- ``{"id", "title", "text"}`` (Search-R1 index builder, DPR, our shipped corpora; extra keys are ignored).
Bad rows raise DataError naming the file, the line number and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import orjson
from pydantic import BaseModel, ConfigDict, Field

from infra.artifacts import url_to_fs
from infra.errors import DataError
from retrieval.types import Passage

MAX_ERRORS_SHOWN = 10


def _parse_contents(contents: str) -> tuple[str, str]:
    title, sep, text = contents.partition("\n")
    if not sep:
        return "", contents.strip()
    return title.strip().strip('"').strip(), text.strip()


def parse_row(obj: object, where: str) -> Passage:
    """Turn one decoded jsonl row into a Passage; raise DataError naming ``where`` (file:line) on bad rows."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    pid = obj.get("id", obj.get("_id", obj.get("docid")))
    if pid is None or (isinstance(pid, str) and not pid.strip()):
        raise DataError(f"{where}: missing 'id' (every passage needs a unique id)")
    if not isinstance(pid, str | int):
        raise DataError(f"{where}: 'id' must be a string or integer, got {type(pid).__name__}")
    if isinstance(obj.get("text"), str):
        title = obj.get("title") or ""
        if not isinstance(title, str):
            raise DataError(f"{where}: 'title' must be a string")
        text = obj["text"].strip()
    elif isinstance(obj.get("contents"), str):
        title, text = _parse_contents(obj["contents"])
    else:
        raise DataError(
            f"{where}: row needs 'contents' (\"Title\"\\ntext) or 'text' (+ optional 'title'); "
            f"found keys {sorted(obj)[:8]}"
        )
    if not text and not title:
        raise DataError(f"{where}: passage {pid!r} has empty text")
    return Passage(id=str(pid), title=title, text=text)


def iter_corpus(uri: str | os.PathLike[str], strict: bool = True) -> Iterator[Passage]:
    """Stream passages from a jsonl corpus (local or s3://).

    Args:
        uri: corpus path.
        strict: raise on the first bad row; when False, bad rows are collected and reported at the end.

    Raises:
        DataError: with the file and line number of bad rows, or duplicate ids.
    """
    fs, path = url_to_fs(uri)
    if not fs.exists(path):
        raise DataError(f"corpus file {uri} does not exist; pass a jsonl corpus path (e.g. data/corpus/mini.jsonl)")
    seen: set[str] = set()
    errors: list[str] = []
    with fs.open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{uri}:{lineno}"
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                err = DataError(f"{where}: invalid JSON ({exc}); each line must be one JSON object")
                if strict:
                    raise err from exc
                errors.append(str(err))
                continue
            try:
                passage = parse_row(obj, where)
                if passage.id in seen:
                    raise DataError(f"{where}: duplicate id {passage.id!r}; ids must be unique in a corpus")
            except DataError as exc:
                if strict:
                    raise
                errors.append(str(exc))
                continue
            seen.add(passage.id)
            yield passage
    if errors:
        shown = "\n  - ".join(errors[:MAX_ERRORS_SHOWN])
        raise DataError(f"{len(errors)} bad row(s) in {uri}:\n  - {shown}")


def read_corpus(uri: str | os.PathLike[str]) -> list[Passage]:
    """Read a whole corpus into memory (validating every row)."""
    return list(iter_corpus(uri, strict=False))


def split_passages(passages: list[Passage], words: int = 100) -> list[Passage]:
    """Split long passages into ~``words``-word chunks (DPR/KILT convention), ids ``<id>#<n>``.

    Passages with at most ``words`` words are kept unchanged.
    """
    if words < 10:
        raise ValueError(f"split words must be >= 10, got {words}")
    out: list[Passage] = []
    for p in passages:
        toks = p.text.split()
        if len(toks) <= words:
            out.append(p)
            continue
        for n, start in enumerate(range(0, len(toks), words)):
            out.append(Passage(id=f"{p.id}#{n}", title=p.title, text=" ".join(toks[start : start + words])))
    return out


def corpus_fingerprint(uri: str | os.PathLike[str]) -> str:
    """SHA-256 of the corpus file (used as cache key and in manifests)."""
    from infra.artifacts import file_sha256

    return file_sha256(uri)


def shipped_corpus(name: str = "mini") -> Path:
    """Path of a corpus shipped in ``data/corpus``."""
    from infra.settings import get_settings

    return get_settings().data_dir / "corpus" / f"{name}.jsonl"


class CorpusRef(BaseModel):
    """A validated corpus file."""

    model_config = ConfigDict(frozen=True)

    uri: str = Field(description="Corpus path or URI.")
    n_rows: int = Field(description="Valid passages (rows) in the file.")
    sha256: str = Field(description="SHA-256 of the file bytes.")


def validate_corpus(uri: str | os.PathLike[str]) -> CorpusRef:
    """Read every row once (collecting all bad rows into one DataError) and fingerprint the file."""
    n = sum(1 for _ in iter_corpus(uri, strict=False))
    if n == 0:
        raise DataError(f"corpus {uri} has no passages; each line must be a JSON object with id and text/contents")
    return CorpusRef(uri=str(uri), n_rows=n, sha256=corpus_fingerprint(uri))
