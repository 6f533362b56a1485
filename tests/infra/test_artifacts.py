"""Artifact storage: atomic writes, manifest last, incomplete directories detected."""

from __future__ import annotations

import pytest

from infra import artifacts
from infra.errors import ArtifactError


def test_atomic_write_leaves_no_partial_file(tmp_path) -> None:
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError), artifacts.atomic_open(target, "wb") as fh:
        fh.write(b"half")
        raise RuntimeError("crash mid-write")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_manifest_marks_completion(tmp_path) -> None:
    d = tmp_path / "stage"
    artifacts.write_jsonl(d / "rows.jsonl", [{"a": 1}, {"a": 2}])
    assert artifacts.read_manifest(d) is None
    with pytest.raises(ArtifactError, match="incomplete"):
        artifacts.require_manifest(d, "index")
    m = artifacts.write_manifest(d, kind="test", count=2)
    assert m["files"] == ["rows.jsonl"]
    assert artifacts.require_manifest(d)["count"] == 2
    assert artifacts.read_jsonl(d / "rows.jsonl") == [{"a": 1}, {"a": 2}]
