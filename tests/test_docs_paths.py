"""Committed docs name no absolute path of the machine a run happened on (``/work/...``, ``/tmp/...``).

Commands in docs are written from the repository root (repo-relative paths, ``../shared/data`` for the shared data
folder, ``<home>`` for a data home), so they work in any clone. Recorded machine output (``*.json``, ``*.log``
under ``docs/results``) is data, not instructions, and is not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC_SUFFIXES = {".md", ".yaml", ".yml", ".sh", ".txt"}
SKIP_DIRS = {".git", ".venv", ".searchloop", "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache"}
ABSOLUTE = re.compile(r"(?<![\w.~<>/:-])/(?:work|tmp)/[^\s`'\"()\[\],;]*")
# (file, exact text) pairs allowed to keep an absolute path; each says why
ALLOWED: set[tuple[str, str]] = set()


def doc_files(root: Path = REPO) -> list[Path]:
    """Every committed doc: markdown, YAML presets and configs, shell scripts and text files outside data files.
    Only files git tracks (or would track): the engine virtualenvs CI builds in the checkout (``.venv-vllm``,
    ``.venv-verl``) hold third-party files full of ``/tmp`` paths."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    out = []
    for path in (root / name for name in listed):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts) or not path.is_file() or path.suffix not in DOC_SUFFIXES:
            continue
        if rel.parts[0] == "requirements" or (rel.parts[0] == "data" and path.suffix != ".md"):
            continue  # lock files and shipped data, not prose
        out.append(path)
    return sorted(out)


def absolute_paths(text: str) -> list[str]:
    """The absolute ``/work/...`` or ``/tmp/...`` paths in ``text``."""
    return ABSOLUTE.findall(text)


def test_the_pattern_finds_machine_paths_and_not_repo_relative_ones() -> None:
    assert absolute_paths("cd /work/main && SEARCHLOOP_HOME=/tmp/sl-home x") == ["/work/main", "/tmp/sl-home"]
    assert absolute_paths("SEARCHLOOP_SHARED_DATA_DIR=/work/shared/data") == ["/work/shared/data"]
    assert absolute_paths("`(/tmp/x.log)` and \"/work/shared/data\"") == ["/tmp/x.log", "/work/shared/data"]
    assert absolute_paths("../shared/data, docs/work/x, <home>/tmp/y, s3://b/work/z, ~/tmp/k") == []


def test_no_committed_doc_names_an_absolute_machine_path() -> None:
    files = doc_files()
    assert REPO / "README.md" in files and REPO / "docs" / "ops.md" in files
    found = []
    for path in files:
        rel = str(path.relative_to(REPO))
        for no, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            found += [f"{rel}:{no}: {hit}" for hit in absolute_paths(line) if (rel, hit) not in ALLOWED]
    assert not found, ("absolute machine paths in docs (write repo-relative paths, ../shared/data or <home>):\n"
                       + "\n".join(found))


CITED_TEST = re.compile(r"\btests/[\w/]+\.py(?:::\w+)?")


def cited_tests(text: str) -> list[str]:
    """The test files (``tests/<dir>/test_x.py``) and tests (``...::test_y``) that ``text`` cites."""
    return CITED_TEST.findall(text)


def test_cited_test_paths_exist() -> None:
    """Docs and docstrings cite tests by repo-relative path (``tests/training/rl/test_rl_data.py::test_x``): each file
    and test they name exists, so moving a test file (``tests/`` mirrors the packages) cannot leave a stale citation."""
    assert cited_tests("see `tests/training/rl/test_health.py::test_stop` and tests/x.py.") == [
        "tests/training/rl/test_health.py::test_stop", "tests/x.py"]
    import subprocess

    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    here = Path(__file__).resolve()  # its own examples above are not citations
    sources = doc_files() + [REPO / name for name in listed if (REPO / name).is_file() and REPO / name != here]
    stale = []
    for path in sources:
        text = path.read_text(encoding="utf-8", errors="replace")
        for cite in cited_tests(text):
            file, _, name = cite.partition("::")
            target = REPO / file
            if not target.is_file():
                stale.append(f"{path.relative_to(REPO)}: {cite} (no such file)")
            elif name and not re.search(rf"^\s*(?:async def|def|class) {name}\b", target.read_text(), re.M):
                stale.append(f"{path.relative_to(REPO)}: {cite} (no {name} in {file})")
    assert not stale, "docs cite tests that do not exist (fix the path or the name):\n" + "\n".join(stale)
