"""Benchmark loading: shipped minis by name, FlashRAG and R1-Searcher rows, errors with line numbers, sampling."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from evaluation.benchmarks import list_benchmarks, load_benchmark, resolve_benchmark
from infra.errors import DataError


def _write(path: Path, rows: list) -> Path:
    path.write_bytes(b"\n".join(r if isinstance(r, bytes) else orjson.dumps(r) for r in rows) + b"\n")
    return path


@pytest.mark.parametrize("name", ["hotpotqa_mini", "2wikimultihopqa_mini", "musique_mini", "bamboogle_mini"])
def test_shipped_minis_load_by_name(name: str) -> None:
    qs = load_benchmark(name)
    assert len(qs) == 50
    assert len({q.id for q in qs}) == 50
    assert all(q.golden_answers and q.question for q in qs)
    assert qs[0].dataset == name.removesuffix("_mini")
    if name != "bamboogle_mini":
        assert all(q.supporting_doc_ids for q in qs)
        assert "context_doc_ids" in qs[0].metadata


def test_names_listed_and_unknown_name_explains() -> None:
    assert "hotpotqa_mini" in list_benchmarks()
    with pytest.raises(DataError, match="hotpotqa_mini"):
        resolve_benchmark("no_such_set")


def test_flashrag_and_r1searcher_rows(tmp_path: Path) -> None:
    path = _write(tmp_path / "mixed.jsonl", [
        {"id": "q1", "question": " Who? ", "golden_answers": ["A", "B"], "extra": 1},
        {"idx": 7, "question": "When?", "answer": "1999"},
        {"question": "Is it?", "answer": True},
        {"question": "Which?", "answer": ["x", "y"]},
        {"id": "q5", "question": "What?", "golden_answers": "single"},
    ])
    qs = load_benchmark(path)
    assert [q.id for q in qs] == ["q1", "7", "mixed_2", "mixed_3", "q5"]
    assert qs[0].question == "Who?" and qs[0].golden_answers == ["A", "B"] and qs[0].metadata == {"extra": 1}
    assert qs[1].golden_answers == ["1999"]
    assert qs[2].golden_answers == ["yes"]
    assert qs[3].golden_answers == ["x", "y"]
    assert qs[4].golden_answers == ["single"]
    assert {q.dataset for q in qs} == {"mixed"}
    assert load_benchmark(path, dataset="custom")[0].dataset == "custom"


def test_json_list_file(tmp_path: Path) -> None:
    path = tmp_path / "set_dev.json"
    path.write_bytes(orjson.dumps([{"id": "a", "question": "q?", "golden_answers": ["x"]}]))
    (q,) = load_benchmark(path)
    assert q.dataset == "set" and q.golden_answers == ["x"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b"{not json", r"bad\.jsonl:2: invalid JSON"),
        (orjson.dumps([1, 2]), r"bad\.jsonl:2: expected a JSON object"),
        (orjson.dumps({"id": "x", "golden_answers": ["a"]}), r"bad\.jsonl:2: 'question'"),
        (orjson.dumps({"id": "x", "question": "q"}), r"bad\.jsonl:2: no answers"),
        (orjson.dumps({"id": "x", "question": "q", "golden_answers": []}), r"bad\.jsonl:2: answers must be"),
        (orjson.dumps({"id": "ok", "question": "q", "answer": "a"}), r"bad\.jsonl:2: duplicate id 'ok'"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path: Path, bad: bytes, message: str) -> None:
    path = _write(tmp_path / "bad.jsonl", [{"id": "ok", "question": "q", "answer": "a"}, bad])
    with pytest.raises(DataError, match=message):
        load_benchmark(path)


def test_limit_and_seeded_sample() -> None:
    assert [q.id for q in load_benchmark("musique_mini", limit=3)] == [q.id for q in load_benchmark("musique_mini")[:3]]
    a = load_benchmark("musique_mini", sample=10, seed=3)
    b = load_benchmark("musique_mini", sample=10, seed=3)
    c = load_benchmark("musique_mini", sample=10, seed=4)
    assert [q.id for q in a] == [q.id for q in b] != [q.id for q in c]
    order = [q.id for q in load_benchmark("musique_mini")]
    assert [order.index(q.id) for q in a] == sorted(order.index(q.id) for q in a)  # file order kept
    assert len(load_benchmark("musique_mini", sample=5, limit=2)) == 2


def test_shared_full_sets(shared_data: Path) -> None:
    assert len(load_benchmark("hotpotqa_dev")) == 816
    r1 = load_benchmark("r1searcher/hotpotqa_500")
    assert len(r1) == 500 and r1[0].id == "r1s_hotpotqa_001"
    raw = load_benchmark(shared_data / "train" / "raw" / "r1searcher" / "stage_1.jsonl")  # question/answer rows
    assert len(raw) == 350 and raw[0].golden_answers == ["U.S. Route 22"] and "pred_anses" in raw[0].metadata
