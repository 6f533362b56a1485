"""Learning evidence: the held-out set (beyond the minis, disjoint from training), greedy per-question rows, the
paired summary and the evidence folder with readable plots."""

from __future__ import annotations

import json

import pytest
from conftest import QUESTIONS
from training_fakes import ScriptedGenerator

from evaluation.benchmarks import Question, load_benchmark
from infra.errors import ConfigError, DataError
from training.agent.heldout import (
    HELDOUT_FIELDS,
    HeldoutSpec,
    build_heldout,
    check_disjoint,
    evaluate_heldout,
    learning_summary,
    report_learning,
)
from training.agent.rollout import RolloutConfig
from training.rewards.adapters import seed_reward_fn


@pytest.fixture()
def shared_data_dir():
    from infra.settings import get_settings

    path = get_settings().shared_data_dir
    if not (path / "eval" / "hotpotqa_dev.jsonl").exists():
        pytest.skip("shared data not present (set SEARCHLOOP_SHARED_DATA_DIR)")
    return path


def test_heldout_set_is_beyond_the_minis_and_large_enough(shared_data_dir) -> None:
    qs = build_heldout(HeldoutSpec())
    assert len(qs) == 210 and len({q.id for q in qs}) == 210
    minis = {q.id for name in ("hotpotqa_mini", "2wikimultihopqa_mini", "musique_mini") for q in load_benchmark(name)}
    assert not minis & {q.id for q in qs}
    assert {q.dataset for q in qs} == {"hotpotqa", "2wikimultihopqa", "musique"}
    corpus_ids = {json.loads(line)["id"] for line in (shared_data_dir / "corpus" / "multihop_wiki.jsonl").open()}
    assert all(set(q.supporting_doc_ids) <= corpus_ids for q in qs)  # the retriever can find the evidence
    with pytest.raises(DataError, match="min_questions"):
        build_heldout(HeldoutSpec(files=["musique_dev"], per_file=10))
    with pytest.raises(DataError, match="used for training"):
        check_disjoint(["x", qs[3].id], qs)
    check_disjoint(["x"], qs)


def test_rows_say_whether_a_search_found_the_answer(bm25, scripted) -> None:
    qs = [Question(id=i, question=q, golden_answers=a, dataset="hotpotqa") for i, q, a in QUESTIONS]
    reward = seed_reward_fn("research", eos_token="<EOS>")
    rows = evaluate_heldout(qs, "research", scripted("research"), bm25, RolloutConfig(), reward)
    # "Ed Wood film director" over the mini corpus returns Ed Wood's page, which names Tim Burton; a yes/no gold
    # never counts as found (a document holds the word without answering)
    assert [r["answer_retrieved"] for r in rows] == [1.0, 0.0]
    assert all(r["n_searches"] == 1 for r in rows)


def test_greedy_rows_summary_and_evidence(tmp_path, bm25, smol_tokenizer) -> None:
    qs = [Question(id=i, question=q, golden_answers=a, dataset="hotpotqa") for i, q, a in QUESTIONS]
    answer = "<think> ok </think> <answer> The final answer is \\[ \\boxed{Tim Burton} \\] </answer><EOS>"
    gen = ScriptedGenerator({q: [answer] for _, q, _ in QUESTIONS}, smol_tokenizer)
    reward = seed_reward_fn("research", eos_token=smol_tokenizer.eos_token)
    with pytest.raises(ConfigError, match="greedy"):
        evaluate_heldout(qs, "research", gen, bm25, RolloutConfig(temperature=0.7), reward)
    rows = evaluate_heldout(qs, "research", gen, bm25, RolloutConfig(), reward, tmp_path / "rows.jsonl")
    assert [r["id"] for r in rows] == ["q1", "q2"]
    assert set(HELDOUT_FIELDS) | {"id", "question", "golden_answers", "pred"} <= set(rows[0])
    assert rows[0]["pred"] == "Tim Burton" and rows[0]["f1"] == 1.0 and rows[0]["format_ok"] is True
    assert rows[0]["reward"] == 1.0 and rows[1]["reward"] == pytest.approx(0.1)  # ReSearch: wrong but formatted
    start = [{**r, "reward": r["reward"] - 0.5, "f1": 0.0} for r in rows]
    summary = learning_summary("demo", start, rows, n_resamples=100)
    assert summary["paired"]["f1"]["diff"] == pytest.approx(0.5) and summary["n_heldout"] == 2
    assert summary["paired"]["answer_retrieved"]["diff"] == 0.0  # no search in this script: nothing found
    older = [{k: v for k, v in r.items() if k != "answer_retrieved"} for r in start]  # rows from before the field
    assert "answer_retrieved" not in learning_summary("demo", older, rows, n_resamples=50)["paired"]
    curve = [{"step": 0, "reward": 0.1, "format_ok": 0.5, "kl": 0.0}, {"step": 1, "reward": 0.3, "format_ok": 0.9}]
    out = report_learning("demo", start, rows, ["t1", "t2"], tmp_path / "ev", curve=curve,
                          evidence_dir=tmp_path / "docs", n_resamples=100, wall_s=1.0)
    assert out["wall_s"] == 1.0 and out["improved"]["reward"] is True
    for name in ("heldout_start.jsonl", "heldout_final.jsonl", "train_ids.txt", "summary.json", "summary.md",
                 "learning_curves.png", "heldout_paired.png"):
        assert (tmp_path / "docs" / name).stat().st_size > 0, name
    assert (tmp_path / "docs" / "train_ids.txt").read_text() == "t1\nt2\n"
    with pytest.raises(DataError, match="used for training"):
        report_learning("demo", start, rows, ["q1"], tmp_path / "bad", n_resamples=100)


def test_report_splits_the_f1_change_by_a_question_field(tmp_path) -> None:
    """``groups`` (from :func:`question_groups` on a dotted field) -> ``by_group.md`` in the evidence folder and its
    copy: the born questions' gain and the died questions' loss are both visible though the mean is 0."""
    from evaluation.criteria import question_groups

    qs = [Question(id=f"q{i}", question=f"When did person {i} {'die' if i % 2 else 'live'}?", golden_answers=["1900"],
                   metadata={"relation": "date of death" if i % 2 else "date of birth"}) for i in range(24)]
    groups = question_groups(qs, "metadata.relation")
    assert groups["q0"] == "date of birth" and groups["q1"] == "date of death" and len(groups) == 24
    assert question_groups(qs, None) == {} and question_groups(qs, "metadata.nope") == {}
    assert question_groups([{"id": "x", "metadata": {"relation": "father"}}], "metadata.relation") == {"x": "father"}
    row = {"question": "q", "golden_answers": ["1900"], "pred": "", "format_ok": True, "n_searches": 1.0,
           "reward": 0.5, "em": 0.0}
    start = [{**row, "id": q.id, "f1": 0.5} for q in qs]
    final = [{**row, "id": q.id, "f1": 0.0 if i % 2 else 1.0} for i, q in enumerate(qs)]
    report_learning("dates", start, final, ["t1"], tmp_path / "ev", evidence_dir=tmp_path / "docs",
                    n_resamples=100, groups=groups)
    text = (tmp_path / "docs" / "by_group.md").read_text()
    assert "| date of birth | 12 | 0.500 → 1.000 |" in text and "12 / 0 | +6.0 |" in text
    assert "| date of death | 12 | 0.500 → 0.000 |" in text and "0 / 12 | -6.0 |" in text
    report_learning("plain", start, final, ["t1"], tmp_path / "ev2", n_resamples=100)
    assert not (tmp_path / "ev2" / "by_group.md").exists()
