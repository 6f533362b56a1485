"""The one data-path resolver: every preset path (corpora, question files, benchmarks, warm-up data) goes through it.

Rules, in order, for :func:`resolve_path`:

1. ``shared:<rel>`` -> ``<shared_data_dir>/<rel>`` (``SEARCHLOOP_SHARED_DATA_DIR``, default ``../shared/data``).
2. URIs (``s3://bucket/key``, ``file://...``, ``http://...``) and absolute paths pass through unchanged.
3. A relative path that exists from the working directory is kept; else one that exists under the repository
   (``data/corpus/mini.jsonl`` from any directory) becomes that absolute path.
4. Anything else passes through unchanged, so a benchmark name (``hotpotqa_mini``) reaches
   :func:`resolve_benchmark_path` and a path that does not exist yet fails where it is opened, with its own message.

:func:`resolve_benchmark_path` adds benchmark names: ``<data_dir>/eval/<name>.{jsonl,json,parquet}`` (the shipped
minis), then ``<shared_data_dir>/eval/<name>.{jsonl,json,parquet}`` (``hotpotqa_dev``, ``r1searcher/hotpotqa_500``).
"""

from __future__ import annotations

import os
from pathlib import Path

from infra.errors import DataError
from infra.settings import REPO_ROOT, get_settings

SHARED_PREFIX = "shared:"


def is_uri(ref: str) -> bool:
    """True for ``scheme://...`` references (s3, gs, http, file)."""
    return "://" in ref


def resolve_path(ref: str | os.PathLike[str]) -> str:
    """Resolve a data reference by the rules in the module docstring; returns a string (a path or a URI)."""
    text = os.fspath(ref)
    if text.startswith(SHARED_PREFIX):
        return str(get_settings().shared_data_dir / text.removeprefix(SHARED_PREFIX).lstrip("/"))
    if is_uri(text) or os.path.isabs(text) or os.path.exists(text):
        return text
    candidate = REPO_ROOT / text
    return str(candidate) if candidate.exists() else text


def repo_path(ref: str | os.PathLike[str]) -> Path:
    """A path to *write* (an evidence folder, a file of this checkout): absolute paths unchanged, relative ones
    under the repository root whatever the working directory (``docs/results/learning/x``)."""
    path = Path(ref)
    return path if path.is_absolute() else REPO_ROOT / path


def home_relative(path: str | os.PathLike[str] | None) -> str | None:
    """A path of the data home written as ``$SEARCHLOOP_HOME/...`` (what a record committed to the repository
    shows instead of this machine's absolute path); other values unchanged."""
    if path is None:
        return None
    home = str(get_settings().home).rstrip("/")
    text = str(path)
    return "$SEARCHLOOP_HOME" + text[len(home):] if text == home or text.startswith(home + "/") else text


def experiment_root(loop: str, name: str, key: str) -> Path:
    """The one experiment-directory rule: ``<runs_dir>/<loop>/<name>-<key>`` (``key``: the config's short hash, so
    the same preset + overrides give the same directory and a re-run resumes from the stages' manifests)."""
    return get_settings().runs_dir / loop / f"{name}-{key}"


def benchmark_dirs() -> list[Path]:
    """Where benchmark names are looked up: the shipped ``data/eval`` first, then the shared ``eval`` folder."""
    s = get_settings()
    return [s.data_dir / "eval", s.shared_data_dir / "eval"]


def list_benchmark_names() -> list[str]:
    """Names that :func:`resolve_benchmark_path` accepts (shipped minis first, then shared sets found on disk)."""
    names: list[str] = []
    for root in benchmark_dirs():
        if root.is_dir():
            for p in sorted([*root.rglob("*.jsonl"), *root.rglob("*.parquet")]):
                name = p.relative_to(root).with_suffix("").as_posix()
                if name not in names:
                    names.append(name)
    return names


def resolve_benchmark_path(name_or_path: str | os.PathLike[str]) -> Path:
    """The question file for a benchmark name or a path (``shared:`` and repo-relative paths included).

    Raises:
        DataError: naming the known benchmarks when nothing matches.
    """
    resolved = resolve_path(name_or_path)
    if Path(resolved).is_file():
        return Path(resolved)
    for root in benchmark_dirs():
        for suffix in (".jsonl", ".json", ".parquet"):
            candidate = root / f"{resolved}{suffix}"
            if candidate.is_file():
                return candidate
    raise DataError(
        f"benchmark {os.fspath(name_or_path)!r} is neither a file nor a known name; known names: "
        f"{', '.join(list_benchmark_names()) or '(none found)'}"
    )
