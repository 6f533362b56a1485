"""verl parquet schema from question files, atomic write + manifest, difficulty buckets and ratio mixing."""

from __future__ import annotations

import pytest

from evaluation.benchmarks import Question, load_benchmark
from infra import artifacts
from infra.errors import DataError
from training.rl.data import (
    DifficultyConfig,
    bucket_of,
    bucket_questions,
    default_messages,
    first_correct,
    mix_buckets,
    prepare_rl_data,
    read_parquet,
    trl_rows,
)


@pytest.fixture(scope="module")
def questions(data_dir) -> list[Question]:
    return load_benchmark("hotpotqa_mini", limit=6)


def test_prepare_writes_verl_schema_with_manifest(tmp_path, questions) -> None:
    ref = prepare_rl_data({"train": questions[:4], "val": questions[4:]}, str(tmp_path / "rl"),
                          default_messages("You are a search agent."), source="hotpotqa_mini")
    manifest = artifacts.require_manifest(ref.uri)
    assert manifest["splits"] == {"train": 4, "val": 2} and manifest["source"] == "hotpotqa_mini"
    assert sorted(manifest["files"]) == ["train.parquet", "val.parquet"]
    rows = read_parquet(ref.split_uri("train"))
    row = rows[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "hotpotqa"
    assert row["prompt"] == [{"role": "system", "content": "You are a search agent."},
                             {"role": "user", "content": questions[0].question}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": ["yes"]}
    assert row["extra_info"]["index"] == 0 and row["extra_info"]["question"] == questions[0].question
    assert row["extra_info"]["tools_kwargs"]["search"]["create_kwargs"]["ground_truth"] == ["yes"]
    trl = trl_rows(rows)
    assert trl[0]["golden_answers"] == ["yes"] and trl[0]["question_id"] == questions[0].id


def test_empty_split_is_refused(tmp_path) -> None:
    with pytest.raises(DataError, match="empty parquet"):
        prepare_rl_data({"train": []}, str(tmp_path / "rl"), default_messages())
    assert artifacts.read_manifest(str(tmp_path / "rl")) is None


def test_buckets_follow_r1searcher_thresholds() -> None:
    cfg = DifficultyConfig()
    assert first_correct([False, False, True, True]) == 3 and first_correct([False]) is None
    assert [bucket_of(n, cfg) for n in (1, 9, 10, 20, 21, None)] == [
        "easy", "easy", "medium", "medium", "difficult", "difficult"]
    assert bucket_of(None, DifficultyConfig(unsolved="drop")) is None


def test_bucket_and_mix_by_ratio() -> None:
    qs = [Question(id=str(i), question=f"q{i}") for i in range(30)]
    flags = {q.id: [False] * (int(q.id) % 3 * 10) + [True] for q in qs}  # first correct at 1, 11 or 21
    cfg = DifficultyConfig(ratio={"medium": 1, "difficult": 1}, seed=3)
    buckets = bucket_questions(qs, flags, cfg)
    assert {k: len(v) for k, v in buckets.items()} == {"easy": 10, "medium": 10, "difficult": 10}
    mixed = mix_buckets(buckets, cfg)
    assert len(mixed) == 20 and not {q.id for q in mixed} & {q.id for q in buckets["easy"]}
    small = mix_buckets(buckets, cfg.model_copy(update={"total": 6, "ratio": {"easy": 2, "difficult": 1}}))
    assert sorted(int(q.id) % 3 for q in small) == [0, 0, 0, 0, 2, 2]
    assert [q.id for q in mix_buckets(buckets, cfg)] == [q.id for q in mixed], "seeded"
    no_medium = {**buckets, "medium": []}
    assert {q.id for q in mix_buckets(no_medium, cfg)} == {q.id for q in buckets["difficult"]}
    assert mix_buckets({"easy": buckets["easy"]}, cfg) == []
    with pytest.raises(DataError, match="no rollout results"):
        bucket_questions(qs, {}, cfg)
    with pytest.raises(DataError, match="positive weight"):
        mix_buckets(buckets, cfg.model_copy(update={"ratio": {"hard": 1.0}}))
