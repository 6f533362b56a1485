"""Training-health alarms: each fires on a constructed series and stays quiet on a healthy one; stop_on stops the
run at the step; the alarms fire on the recorded Search-R1 run and on an answer collapse built from recorded rows,
and stay quiet on every other committed evidence folder; report_learning records them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.agent.alarms import (
    AlarmConfig,
    AnswerObs,
    copied_from_question,
    evidence_alarms,
    heldout_alarms,
    top_answer,
)
from training.rl.health import (
    HealthConfig,
    HealthMonitor,
    TrainingHealthError,
    health_callback,
    main,
    raise_if_unhealthy,
)

LEARNING = Path(__file__).resolve().parents[3] / "docs" / "results" / "learning"


def _rows(name: str, end: str) -> list[dict]:
    return [json.loads(line) for line in (LEARNING / name / f"heldout_{end}.jsonl").read_text().splitlines()]


def _metrics(searches: float) -> dict[str, float]:
    return {"reward": 0.3, "loss": 0.01, "search/searches_per_traj": searches}


def _obs(step: int, answers: list[str], question: str = "Who directed the film {i}?") -> list[AnswerObs]:
    return [AnswerObs(question_id=f"s{step}q{i}", question=question.format(i=i), answer=a, golden_answers=["gold"])
            for i, a in enumerate(answers)]


def test_copied_from_question() -> None:
    q = "Which country Jakobea Of Baden's mother is from?"
    assert copied_from_question(q, "Jakobea Of Baden")
    assert not copied_from_question(q, "Germany") and not copied_from_question(q, "") and not copied_from_question(
        q, None)
    # a comparison question answered right is not a copy
    assert not copied_from_question("Which film came out first, Clownery or Brudebuketten?", "Clownery", ["Clownery"])
    assert copied_from_question("Which film came out first, Clownery or Brudebuketten?", "Clownery", ["Brudebuketten"])


def test_search_collapse_fires_on_a_falling_series_and_not_on_a_steady_one() -> None:
    cfg = HealthConfig(window=3)
    mon = HealthMonitor(cfg)
    verdicts = [mon.update(i + 1, _metrics(s)) for i, s in enumerate([1.4, 1.2, 0.9, 0.2, 0.0, 0.0, 0.0])]
    assert all(v.ok for v in verdicts), "warn only by default"
    [alarm] = mon.alarms
    # start = mean(1.4, 1.2) = 1.3; window means: (1.2, .9, .2) = .77 >= .65; (.9, .2, 0) = .37 < .65 at step 5
    assert alarm.name == "search_collapse" and alarm.step == 5 and alarm.threshold == pytest.approx(0.65)
    healthy = HealthMonitor(cfg)
    for i, s in enumerate([1.4, 1.2, 0.9, 1.1, 0.8, 1.0, 0.9, 1.3]):
        healthy.update(i + 1, _metrics(s))
    assert healthy.alarms == []


def test_copied_answers_fire_over_the_window() -> None:
    cfg = HealthConfig(window=2, max_copied_share=0.4)
    mon = HealthMonitor(cfg)
    copies = ["the film 0", "film 1", "the film 2", "Paris"]  # 3 of 4 are spans of "who directed the film {i}"
    for step in (1, 2):
        extra = mon.observe_rollouts(_obs(step, copies))
        assert extra["search/copied_answer_rate"] == pytest.approx(0.75)
        mon.update(step, {**_metrics(1.0), **extra})
    [alarm] = mon.alarms
    assert (alarm.name, alarm.step, alarm.value) == ("copied_answers", 2, pytest.approx(0.75))
    healthy = HealthMonitor(cfg)
    for step in (1, 2, 3):
        healthy.update(step, {**_metrics(1.0), **healthy.observe_rollouts(_obs(step, ["Paris", "Rome", "film 2"]))})
    assert healthy.alarms == []


def test_answer_collapse_counts_questions_not_rollouts() -> None:
    cfg = HealthConfig(window=3, max_answer_share=0.3, min_answer_questions=6)
    # 4 rollouts of one question giving the same answer is not a collapse: one question, and < 6 questions
    group = [AnswerObs(question_id="q", question="Who?", answer="Belkin") for _ in range(4)]
    assert top_answer(group) == ("belkin", 1, 1)
    mon = HealthMonitor(cfg)
    steps = [["Nicholas J. Belkin", "Paris"], ["nicholas j belkin", "Rome"], ["Nicholas J. Belkin", "Oslo"]]
    verdicts = [mon.update(s + 1, {**_metrics(1.0), **mon.observe_rollouts(_obs(s, a))}) for s, a in
                enumerate(steps)]
    assert all(v.ok for v in verdicts)
    [alarm] = mon.alarms
    assert alarm.name == "answer_collapse" and alarm.step == 3 and alarm.value == pytest.approx(0.5)
    assert "'nicholas j belkin' answers 3 of 6 questions" in alarm.message
    healthy = HealthMonitor(cfg)
    for s, answers in enumerate([["Oslo", "e"], ["Lima", "yes"], ["Kyiv", "Baku"], ["Pune", "Riga"]]):
        healthy.update(s + 1, {**_metrics(1.0), **healthy.observe_rollouts(_obs(s, answers))})
    assert healthy.alarms == []


def test_stop_on_raises_at_the_step_where_the_alarm_fires() -> None:
    cb = health_callback(HealthConfig(window=2, stop_on=["search_collapse"]), log_to_mlflow=False)

    class Control:
        should_training_stop = False
        should_save = True

    class State:
        def __init__(self, step: int) -> None:
            self.global_step = step

    control = Control()
    for step, s in enumerate([1.5, 1.5, 1.0, 0.2], start=1):
        cb.on_log(None, State(step), control, logs=_metrics(s))
        assert control.should_training_stop == (step == 4)
    with pytest.raises(TrainingHealthError, match=r"step 4: alarm search_collapse \(health\.stop_on\)"):
        raise_if_unhealthy(cb)
    assert [a.name for a in cb.alarms] == ["search_collapse"]


def test_recorded_searchr1_run_fires_search_collapse_and_copy() -> None:
    """The committed Search-R1 GRPO evidence: held-out searches 1.42 -> 0.00, half the final answers copied."""
    alarms = evidence_alarms(LEARNING / "searchr1_grpo")
    by = {(a.name, a.where): a for a in alarms}
    assert by[("search_collapse", "heldout_final")].value == 0.0
    assert by[("search_collapse", "training")].step == 6  # curve.jsonl: 1.375, 0.5, 0.375, 0.125, 0, 0 ...
    assert by[("copied_answers", "heldout_final")].value == pytest.approx(106 / 210)
    assert "answer_collapse" not in {a.name for a in alarms}
    assert heldout_alarms(AlarmConfig(), _rows("searchr1_grpo", "start")) == [], "the start policy is healthy"


def test_answer_collapse_on_recorded_rows_with_the_replicates_collapse() -> None:
    """The ReSearch replicate (not committed) answered "Nicholas J. Belkin" to 84 of 210: rebuilt from the committed
    research_grpo_try2 final rows (which already answer it 4 times) by giving that answer to 80 more rows."""
    rows = _rows("research_grpo_try2", "final")
    assert heldout_alarms(AlarmConfig(), rows) == []
    have = [r for r in rows if (r["pred"] or "").lower() == "nicholas j. belkin"]
    others = [r for r in rows if r not in have]
    collapsed = have + [{**r, "pred": "Nicholas J. Belkin"} for r in others[:84 - len(have)]] + others[84 - len(have):]
    [alarm] = [a for a in heldout_alarms(AlarmConfig(), collapsed) if a.name == "answer_collapse"]
    assert alarm.value == pytest.approx(84 / 210) and "84 of 210" in alarm.message


# every evidence folder (one written by report_learning has heldout_final.jsonl; search_value/ is a table, not a run)
# recorded runs whose agent stopped searching (ReSearch attempt 13: a start that never searched, and training went
# from 0.19 searches per trajectory to none)
FIRING = {"searchr1_grpo", "searchr1_grpo_try4", "searchr1_grpo_try5", "research_hops_mixed_try2"}
OTHERS = sorted(p.name for p in LEARNING.iterdir()
                if (p / "heldout_final.jsonl").exists() and p.name not in FIRING)


def test_search_r1_attempt_4_search_collapse_fires_on_its_heldout_rows() -> None:
    """Session 13's attempt 4 went from 2.01 to 0.995 searches per held-out question: the alarm says so."""
    alarms = evidence_alarms(LEARNING / "searchr1_grpo_try4")
    [alarm] = [a for a in alarms if a.name == "search_collapse" and a.where == "heldout_final"]
    assert alarm.value == pytest.approx(209 / 210, abs=0.01) and alarm.value < 0.5 * 2.0095


def test_search_r1_attempt_5_search_collapse_fires_on_its_heldout_rows() -> None:
    """Session 14's attempt 5 (no per-pass cap in training) collapsed the same way: 2.01 -> 0.995."""
    alarms = evidence_alarms(LEARNING / "searchr1_grpo_try5")
    [alarm] = [a for a in alarms if a.name == "search_collapse" and a.where == "heldout_final"]
    assert alarm.value == pytest.approx(209 / 210, abs=0.01) and alarm.value < 0.5 * 2.0095


def test_research_attempt_13_search_collapse_fires_in_training() -> None:
    """Session 39's ReSearch attempt 13 (warm-up share 0.75): its sampled policy searched on 0.19 and 0.06 of its
    trajectories in steps 1-2 and on 0.04 on average over steps 8-12, where the training alarm fires."""
    alarms = evidence_alarms(LEARNING / "research_hops_mixed_try2")
    assert {a.name for a in alarms} == {"search_collapse"}
    [alarm] = alarms
    assert alarm.where == "training" and alarm.step == 12
    assert alarm.value == pytest.approx(0.0375) and alarm.value < alarm.threshold == pytest.approx(0.0625)


@pytest.mark.parametrize("folder", OTHERS)
def test_other_committed_runs_stay_quiet(folder: str) -> None:
    assert evidence_alarms(LEARNING / folder) == []


def test_cli_prints_the_table_and_exits_1_when_an_alarm_fires(capsys) -> None:
    assert main([str(LEARNING / "searchr1_grpo"), str(LEARNING / "exsearch_em")]) == 1
    out = capsys.readouterr().out
    assert "| evidence folder | search_collapse | copied_answers | answer_collapse |" in out
    assert "searchr1_grpo | heldout_final: 0 (limit 0.71); training step 6" in out
    assert out.splitlines()[3].endswith("exsearch_em | - | - | - |")
    assert main([str(LEARNING / "exsearch_em")]) == 0
    assert main([str(LEARNING)]) == 2, "not an evidence folder"


def test_cli_on_the_documented_glob_skips_folders_that_are_not_finished_runs(capsys) -> None:
    """`python -m training.rl.health docs/results/learning/*/` (README) also matches search_value/ (a table) and
    runs the start gate stopped before RL: they are skipped with a line, the rest is checked."""
    folders = sorted(str(p) + "/" for p in LEARNING.iterdir() if p.is_dir())
    assert any(not (Path(f) / "heldout_final.jsonl").exists() for f in folders)
    assert main(folders) == 1  # searchr1_grpo fires
    captured = capsys.readouterr()
    assert "skipped " in captured.err and "search_value: no heldout_final.jsonl" in captured.err
    assert "searchr1_grpo | heldout_final: 0" in captured.out


def test_report_learning_records_alarms(tmp_path) -> None:
    from training.agent.heldout import report_learning

    start = _rows("searchr1_grpo", "start")
    final = _rows("searchr1_grpo", "final")
    summary = report_learning("searchr1", start, final, ["t1"], tmp_path / "ev", n_resamples=50)
    names = {(a["name"], a["where"]) for a in summary["alarms"]}
    assert names == {("search_collapse", "heldout_final"), ("copied_answers", "heldout_final")}
    md = (tmp_path / "ev" / "summary.md").read_text()
    assert "| search_collapse | heldout_final |" in md and "answers copied from the question" in md
    assert json.loads((tmp_path / "ev" / "summary.json").read_text())["alarms"] == summary["alarms"]
