"""``data/hops/build.py`` reproduces the committed single-hop files, whose three parts are disjoint."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from infra.settings import REPO_ROOT, get_settings

HOPS = REPO_ROOT / "data" / "hops"


def _builder():
    spec = importlib.util.spec_from_file_location("hops_build", HOPS / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(name: str) -> list[dict]:
    return [json.loads(x) for x in (HOPS / name).read_text(encoding="utf-8").splitlines() if x.strip()]


def test_questions_read_as_questions() -> None:
    b = _builder()
    assert b.question_for("Love in Pawn", "director") == "Who is the director of Love in Pawn?"
    assert b.question_for("Dillon Francis", "date of birth") == "When was Dillon Francis born?"
    assert b.question_for("X", "award received") == "What is the award received of X?"


def test_parts_are_disjoint_and_answerable() -> None:
    parts = {n: _rows(f"2wiki_hops_{n}.jsonl") for n in ("warmup", "rl", "heldout")}
    assert len(parts["heldout"]) == 210
    texts = [r["question"].lower() for rows in parts.values() for r in rows]
    assert len(texts) == len(set(texts))
    train_parents = {r["metadata"]["parent_id"] for n in ("warmup", "rl") for r in parts[n]}
    assert not train_parents & {r["metadata"]["parent_id"] for r in parts["heldout"]}
    large = _rows("2wiki_hops_heldout600.jsonl")  # attempt 10's held-out set: the 210 first, then 390 more
    assert len(large) == 600 and large[:210] == parts["heldout"]
    assert not train_parents & {r["metadata"]["parent_id"] for r in large}
    train_texts = {r["question"].lower() for n in ("warmup", "rl") for r in parts[n]}
    assert not train_texts & {r["question"].lower() for r in large}
    assert len({r["question"].lower() for r in large}) == 600
    for rows in parts.values():
        for r in rows:
            assert r["metadata"]["qa_pairs"] == [{"question": r["question"], "answer": r["golden_answers"][0]}]
            assert len(r["supporting_doc_ids"]) == 1


def test_rebuild_matches_committed(tmp_path: Path) -> None:
    shared = get_settings().shared_data_dir
    if not (shared / "eval" / "2wikimultihopqa_dev.jsonl").is_file():
        pytest.skip("the shared data folder is not beside the repository")
    written = _builder().build(shared, tmp_path)
    for name in written:
        assert (tmp_path / name).read_bytes() == (HOPS / name).read_bytes(), name


def test_r1searcher_stages_label_the_rl_file_only(tmp_path: Path) -> None:
    """``2wiki_hops_rl_staged.jsonl`` is the RL file plus ``metadata.stage`` (1: the question's top-1 BM25 hit over
    the training corpus is its paragraph); relabelled by ``data/hops/stages.py`` when the shared data is present."""
    rl, staged = _rows("2wiki_hops_rl.jsonl"), _rows("2wiki_hops_rl_staged.jsonl")
    assert len(staged) == len(rl) == 524
    for a, b in zip(rl, staged, strict=True):
        stage = b["metadata"].pop("stage")
        assert stage in (1, 2) and a == b
    stages = [r["metadata"]["stage"] for r in _rows("2wiki_hops_rl_staged.jsonl")]
    assert stages.count(1) == 447  # 85%: the share the README gives for the RL questions
    shared = get_settings().shared_data_dir
    if not (shared / "corpus" / "train_wiki.jsonl").is_file():
        pytest.skip("the shared data folder is not beside the repository")
    spec = importlib.util.spec_from_file_location("hops_stages", HOPS / "stages.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--shared", str(shared), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "2wiki_hops_rl_staged.jsonl").read_bytes() == (HOPS / "2wiki_hops_rl_staged.jsonl").read_bytes()


def test_dates_file_balances_the_rl_questions_between_two_dates(tmp_path: Path) -> None:
    """``2wiki_hops_rl_dates.jsonl`` (ReSearch attempt 8) is the RL file, then the warm-up file's "date of death"
    rows, verbatim; ``data/hops/dates.py`` rebuilds it byte for byte; it shares no question with the held-out sets."""
    rl, warmup, dates = (_rows(f"2wiki_hops_{n}.jsonl") for n in ("rl", "warmup", "rl_dates"))
    added = [r for r in warmup if r["metadata"]["relation"] == "date of death"]
    assert dates == rl + added and len(added) == 36
    relations = [r["metadata"]["relation"] for r in dates]
    assert (relations.count("date of birth"), relations.count("date of death")) == (50, 69)
    held = {r["question"].lower() for r in _rows("2wiki_hops_heldout600.jsonl")}
    assert not held & {r["question"].lower() for r in dates}
    spec = importlib.util.spec_from_file_location("hops_dates", HOPS / "dates.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / "2wiki_hops_rl_dates.jsonl").read_bytes() == (HOPS / "2wiki_hops_rl_dates.jsonl").read_bytes()


def test_nodates_file_is_the_rl_file_without_its_date_questions(tmp_path: Path) -> None:
    """``2wiki_hops_rl_nodates.jsonl`` (ReSearch attempt 9) is the RL file's rows whose relation is not a date,
    verbatim and in order; ``data/hops/dates.py`` rebuilds it byte for byte; it shares no question with the
    held-out sets."""
    rl, nodates = _rows("2wiki_hops_rl.jsonl"), _rows("2wiki_hops_rl_nodates.jsonl")
    dates = {"date of birth", "date of death", "publication date", "inception"}
    assert nodates == [r for r in rl if r["metadata"]["relation"] not in dates] and len(nodates) == 418
    held = {r["question"].lower() for r in _rows("2wiki_hops_heldout600.jsonl")}
    assert not held & {r["question"].lower() for r in nodates}
    assert not any(r["question"].lower().startswith("when ") for r in nodates)
    spec = importlib.util.spec_from_file_location("hops_dates", HOPS / "dates.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out", str(tmp_path)]) == 0
    name = "2wiki_hops_rl_nodates.jsonl"
    assert (tmp_path / name).read_bytes() == (HOPS / name).read_bytes()
