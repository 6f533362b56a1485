"""The one data-path resolver: ``shared:``, URIs, absolute, cwd- and repo-relative paths, benchmark names."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.errors import DataError
from infra.paths import resolve_benchmark_path, resolve_path
from infra.settings import REPO_ROOT, get_settings


@pytest.fixture
def shared(monkeypatch, tmp_path) -> Path:
    root = tmp_path / "shared"
    (root / "eval").mkdir(parents=True)
    (root / "eval" / "toy_dev.jsonl").write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n')
    monkeypatch.setenv("SEARCHLOOP_SHARED_DATA_DIR", str(root))
    get_settings.cache_clear()
    yield root
    get_settings.cache_clear()


def test_rules(shared, monkeypatch, tmp_path) -> None:
    assert resolve_path("shared:corpus/x.jsonl") == str(shared / "corpus" / "x.jsonl")
    assert resolve_path("shared:/corpus/x.jsonl") == str(shared / "corpus" / "x.jsonl")
    assert resolve_path("s3://b/c.jsonl") == "s3://b/c.jsonl"
    assert resolve_path("/abs/x.jsonl") == "/abs/x.jsonl"
    monkeypatch.chdir(tmp_path)
    assert resolve_path("data/corpus/mini.jsonl") == str(REPO_ROOT / "data" / "corpus" / "mini.jsonl")
    (tmp_path / "data" / "corpus").mkdir(parents=True)
    (tmp_path / "data" / "corpus" / "mini.jsonl").write_text("")
    assert resolve_path("data/corpus/mini.jsonl") == "data/corpus/mini.jsonl"  # the working directory wins
    assert resolve_path("hotpotqa_mini") == "hotpotqa_mini"  # not a file: left for the benchmark lookup
    assert resolve_path(Path("nope/x.jsonl")) == "nope/x.jsonl"


def test_benchmarks_by_name_shared_prefix_and_path(shared, tmp_path, monkeypatch) -> None:
    assert resolve_benchmark_path("hotpotqa_mini") == get_settings().data_dir / "eval" / "hotpotqa_mini.jsonl"
    assert resolve_benchmark_path("toy_dev") == shared / "eval" / "toy_dev.jsonl"
    assert resolve_benchmark_path("shared:eval/toy_dev.jsonl") == shared / "eval" / "toy_dev.jsonl"
    monkeypatch.chdir(tmp_path)
    assert resolve_benchmark_path("data/eval/hotpotqa_mini.jsonl").is_file()
    with pytest.raises(DataError, match="known names: .*hotpotqa_mini"):
        resolve_benchmark_path("no_such_set")


def test_shared_prefix_in_em_question_sources(shared) -> None:
    """``shared:`` works in EM presets too (it used to work only in index and RL presets)."""
    from training.em.stages import load_questions
    from training.refs import QuestionSource

    qs = load_questions([QuestionSource(path="shared:eval/toy_dev.jsonl"), QuestionSource(path="hotpotqa_mini",
                                                                                         limit=2)])
    assert [q.id for q in qs][0] == "1" and len(qs) == 3


def test_home_relative_hides_this_machines_home_in_committed_records() -> None:
    from infra.paths import home_relative

    home = get_settings().home
    assert home_relative(home / "runs" / "rl" / "x" / "model") == "$SEARCHLOOP_HOME/runs/rl/x/model"
    assert home_relative(f"{home}-other/model") == f"{home}-other/model"  # a sibling folder is not the home
    assert home_relative("smollm2") == "smollm2" and home_relative(None) is None
