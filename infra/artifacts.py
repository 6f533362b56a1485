"""Artifact storage through fsspec: local paths and ``s3://`` URIs with the same code.

Rules (the STYLE guide's "manifest last"): every file is written to a temporary name and renamed into place;
a stage directory is complete only when its ``manifest.json`` exists, and the manifest is written last. A
directory without a manifest is incomplete and is redone, never read.
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import fsspec
import orjson

from infra.errors import ArtifactError

MANIFEST = "manifest.json"


def url_to_fs(uri: str | os.PathLike[str]) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return (filesystem, path) for a local path or URL (``s3://bucket/key`` uses s3fs)."""
    return fsspec.core.url_to_fs(str(uri))


def join(uri: str | os.PathLike[str], *parts: str) -> str:
    """Join path parts onto a local path or URL with ``/``."""
    base = str(uri).rstrip("/")
    return "/".join([base, *[p.strip("/") for p in parts]])


def exists(uri: str | os.PathLike[str]) -> bool:
    """True if the file or directory exists."""
    fs, path = url_to_fs(uri)
    return fs.exists(path)


@contextmanager
def atomic_open(uri: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary sibling for writing and rename it onto ``uri`` when the block succeeds.

    If the block raises, the temporary file is removed and the target is untouched.
    """
    if mode not in {"wb", "w"}:
        raise ValueError(f"atomic_open mode must be 'wb' or 'w', got {mode!r}")
    fs, path = url_to_fs(uri)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with fs.open(tmp, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as fh:
            yield fh
        if fs.exists(path) and fs.isdir(path):
            raise ArtifactError(f"cannot write file {uri}: a directory is in the way")
        fs.mv(tmp, path)
    finally:
        if fs.exists(tmp):
            fs.rm(tmp)


def write_bytes(uri: str | os.PathLike[str], data: bytes) -> None:
    """Atomically write bytes."""
    with atomic_open(uri, "wb") as fh:
        fh.write(data)


def write_text(uri: str | os.PathLike[str], text: str) -> None:
    """Atomically write UTF-8 text."""
    write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str | os.PathLike[str], obj: Any) -> None:
    """Atomically write indented JSON."""
    write_bytes(uri, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, default=str))


def write_jsonl(uri: str | os.PathLike[str], rows: Iterable[Any]) -> int:
    """Atomically write JSON Lines; returns the row count."""
    n = 0
    with atomic_open(uri, "wb") as fh:
        for row in rows:
            fh.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY, default=str) + b"\n")
            n += 1
    return n


def read_bytes(uri: str | os.PathLike[str]) -> bytes:
    """Read a whole file."""
    fs, path = url_to_fs(uri)
    with fs.open(path, "rb") as fh:
        return fh.read()


def read_json(uri: str | os.PathLike[str]) -> Any:
    """Read a JSON file."""
    return orjson.loads(read_bytes(uri))


def read_jsonl(uri: str | os.PathLike[str]) -> list[Any]:
    """Read a JSON Lines file (blank lines skipped)."""
    return [orjson.loads(line) for line in read_bytes(uri).splitlines() if line.strip()]


def file_sha256(uri: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes, streamed."""
    fs, path = url_to_fs(uri)
    h = hashlib.sha256()
    with fs.open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def library_versions() -> dict[str, str]:
    """Python's and the main libraries' versions (what a manifest records)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("searchloop", "torch", "transformers", "faiss-cpu", "bm25s", "sentence-transformers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def write_manifest(dir_uri: str | os.PathLike[str], **fields: Any) -> dict[str, Any]:
    """Write ``manifest.json`` into ``dir_uri`` (call it last); adds time, versions and the file list."""
    fs, path = url_to_fs(dir_uri)
    files = sorted(
        p.rsplit("/", 1)[-1] if "/" in p else p
        for p in (fs.ls(path, detail=False) if fs.exists(path) else [])
        if not p.endswith(MANIFEST)
    )
    manifest = {"created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "versions": library_versions(),
                "files": files, **fields}
    write_json(join(dir_uri, MANIFEST), manifest)
    return manifest


def read_manifest(dir_uri: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Return the manifest of a complete directory, or None when it is missing (incomplete or absent)."""
    uri = join(dir_uri, MANIFEST)
    if not exists(uri):
        return None
    return read_json(uri)


def require_manifest(dir_uri: str | os.PathLike[str], kind: str = "artifact") -> dict[str, Any]:
    """Return the manifest or raise ArtifactError explaining that the directory is incomplete."""
    manifest = read_manifest(dir_uri)
    if manifest is None:
        raise ArtifactError(
            f"{kind} at {dir_uri} is missing or incomplete (no {MANIFEST}); rebuild it "
            f"(e.g. `searchloop index build ...`) or point to a finished one"
        )
    return manifest


def reset_dir(dir_uri: str | os.PathLike[str]) -> None:
    """Remove an incomplete directory's manifest-less contents so a stage can be redone from scratch."""
    fs, path = url_to_fs(dir_uri)
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.makedirs(path, exist_ok=True)


def local_path(uri: str | os.PathLike[str]) -> Path:
    """Return a local Path for a local URI; raise ArtifactError for remote ones (engines needing local files)."""
    fs, path = url_to_fs(uri)
    if "file" not in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        raise ArtifactError(f"{uri} is remote; this step needs a local path (copy it with `fsspec` first)")
    return Path(path)


def content_hash(parts: Iterable[bytes | str]) -> str:
    """SHA-256 over a sequence of byte/str parts (length-prefixed so boundaries matter)."""
    h = hashlib.sha256()
    for part in parts:
        b = part.encode("utf-8") if isinstance(part, str) else part
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()
