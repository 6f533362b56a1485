"""Issue 27's criteria from held-out rows: each criterion decided by its own rule, replicates paired by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.criteria import evaluate_folder, main, pooled_seeds, replicate_of, table


def _write(d: Path, start: list[dict], final: list[dict]) -> Path:
    d.mkdir(parents=True)
    for name, rows in (("heldout_start.jsonl", start), ("heldout_final.jsonl", final)):
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _row(i: int, reward: float, f1: float, ok: bool, searches: float) -> dict:
    return {"id": f"q{i}", "reward": reward, "f1": f1, "format_ok": ok, "n_searches": searches}


def test_learning_run_meets_1_to_4(tmp_path) -> None:
    start = [_row(i, 0.2, 0.1, True, 1.0) for i in range(40)]
    final = [_row(i, 0.2 + 0.5 * (i % 2), 0.1 + 0.4 * (i % 2), True, 1.0) for i in range(40)]
    c = evaluate_folder(_write(tmp_path / "rec", start, final), n_resamples=500)
    assert c is not None and c.meets_1_to_4 and c.n == 40
    assert c.f1_format_ok_both.n == 40 and abs(c.f1.diff - 0.2) < 1e-9


def test_answer_found_splits_search_from_reading_when_rows_have_it(tmp_path) -> None:
    start = [{**_row(i, 0.2, 0.1, True, 1.0), "answer_retrieved": float(i < 20)} for i in range(40)]
    final = [{**_row(i, 0.5, 0.4, True, 1.0), "answer_retrieved": float(i < 30)} for i in range(40)]
    c = evaluate_folder(_write(tmp_path / "rec", start, final), n_resamples=200)
    assert (c.retrieved_start, c.retrieved_final) == (0.5, 0.75)
    assert "1.00 → 1.00 (answer found 0.50 → 0.75)" in table([c])
    old = evaluate_folder(_write(tmp_path / "old", [_row(0, 0, 0, True, 1)], [_row(0, 1, 1, True, 1)]),
                          n_resamples=50)  # rows from before the field: the cell is as it was
    assert old.retrieved_start is None and "| 1.00 → 1.00 |" in table([old])


def test_search_collapse_and_format_only_gain_fail(tmp_path) -> None:
    # the reward rises only through rows that were not format-ok at the start, and searches fall to 0.4
    start = [_row(i, 0.0 if i < 20 else 0.2, 0.0, i >= 20, 1.0) for i in range(40)]
    final = [_row(i, 0.2 if i < 20 else 0.2, 0.3 if i < 20 else -0.0, True, 0.4) for i in range(40)]
    c = evaluate_folder(_write(tmp_path / "rec", start, final), n_resamples=500)
    assert c.c1_reward and c.c2_f1 and not c.c3_searching and not c.c4_not_format_only
    assert c.f1_format_ok_both.n == 20


def test_replicates_and_cli(tmp_path, capsys) -> None:
    good = ([_row(i, 0.1, 0.1, True, 1.0) for i in range(30)], [_row(i, 0.5, 0.4, True, 1.0) for i in range(30)])
    flat = ([_row(i, 0.1, 0.1, True, 1.0) for i in range(30)], [_row(i, 0.1, 0.1, True, 1.0) for i in range(30)])
    _write(tmp_path / "rec", *good)
    _write(tmp_path / "rec__seed43", *flat)
    (tmp_path / "stopped").mkdir()
    (tmp_path / "stopped" / "heldout_start.jsonl").write_text(json.dumps(_row(0, 0, 0, True, 1)) + "\n")
    assert replicate_of("rec__seed43") == "rec" and replicate_of("rec") is None
    assert evaluate_folder(tmp_path / "stopped") is None
    assert main([str(tmp_path / n) for n in ("rec", "rec__seed43", "stopped")] + ["--resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert "| rec | 30 |" in out and "rec__seed43: no" in out and "(replicate)" in out
    assert "No final evaluation (stopped before it): stopped." in out
    assert "rec__seed43: no | no |" in out  # 1-5: the replicate does not meet 1-3
    assert table([]).count("\n") == 1
    # the other way round (the first run flat, its replicate good): the replicate meets 1-3, the run not 1-4
    _write(tmp_path / "rev", *flat)
    _write(tmp_path / "rev__seed43", *good)
    assert main([str(tmp_path / n) for n in ("rev", "rev__seed43")] + ["--resamples", "200"]) == 0
    assert "rev__seed43: yes | no |" in capsys.readouterr().out
    _write(tmp_path / "both", *good)
    _write(tmp_path / "both__seed43", *good)
    assert main([str(tmp_path / n) for n in ("both", "both__seed43")] + ["--resamples", "200"]) == 0
    assert "both__seed43: yes | yes |" in capsys.readouterr().out


def test_bound_at_float_zero_is_not_above_zero(tmp_path) -> None:
    # one question gains 0.1, the rest are unchanged: the 2.5% quantile is 0 up to summation error
    start = [_row(i, 0.3, 0.3, True, 1.0) for i in range(50)]
    final = [_row(i, 0.3, 0.3 + (0.1 if i == 0 else 0.0), True, 1.0) for i in range(50)]
    c = evaluate_folder(_write(tmp_path / "rec", start, final), n_resamples=500)
    assert abs(c.f1.low) < 1e-9 and not c.c2_f1


def test_cli_names_bad_folders(tmp_path, capsys) -> None:
    import pytest

    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "nope")])
    assert exc.value.code == 2 and "not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path)])
    assert exc.value.code == 2 and "no folder holds heldout_start.jsonl" in capsys.readouterr().err


def test_ids_restrict_every_folder(tmp_path, capsys) -> None:
    # 40 questions: the first 20 gain, the last 20 are flat; restricted to the last 20 nothing moved
    start = [_row(i, 0.2, 0.1, True, 1.0) for i in range(40)]
    final = [_row(i, 0.2 + (0.5 if i < 20 else 0.0), 0.1 + (0.4 if i < 20 else 0.0), True, 1.0) for i in range(40)]
    _write(tmp_path / "rec", start, final)
    ids = tmp_path / "subset.jsonl"
    ids.write_text("".join(json.dumps({"id": f"q{i}", "question": "x"}) + "\n" for i in range(20, 40)))
    whole = evaluate_folder(tmp_path / "rec", n_resamples=300)
    part = evaluate_folder(tmp_path / "rec", n_resamples=300, ids={f"q{i}" for i in range(20, 40)})
    assert whole.n == 40 and whole.c2_f1 and part.n == 20 and not part.c2_f1 and part.f1.diff == 0
    assert evaluate_folder(tmp_path / "rec", ids={"other"}) is None
    assert main([str(tmp_path / "rec"), "--ids", str(ids), "--resamples", "200"]) == 0
    assert "| rec | 20 |" in capsys.readouterr().out
    import pytest

    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "rec"), "--ids", str(tmp_path / "missing.jsonl")])
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "elsewhere"}) + "\n")
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "rec"), "--ids", str(other)])
    assert exc.value.code == 2 and "no folder holds any question of --ids" in capsys.readouterr().err
    (tmp_path / "ids.txt").write_text("q1\nq2\n")  # not JSONL: a clear error, not a traceback
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "rec"), "--ids", str(tmp_path / "ids.txt")])
    assert exc.value.code == 2 and "is not a JSONL file" in capsys.readouterr().err


def test_by_splits_the_f1_change_by_a_question_field(tmp_path, capsys) -> None:
    # 30 "born" questions gain 0.5, 30 "die" questions lose 0.5, 3 "rare" ones gain: the mean hides a trade
    rel = ["born"] * 30 + ["die"] * 30 + ["rare"] * 3
    start = [_row(i, 0.5, 0.5, True, 1.0) for i in range(63)]
    final = [_row(i, 0.5, 1.0 if rel[i] != "die" else 0.0, True, 1.0) for i in range(63)]
    _write(tmp_path / "rec", start, final)
    from evaluation.criteria import group_changes

    groups = {f"q{i}": r for i, r in enumerate(rel)}
    changes = {c.group: c for c in group_changes(tmp_path / "rec", groups, min_group=10, n_resamples=300)}
    assert set(changes) == {"born", "die", "(other)"}
    assert changes["born"].up == 30 and changes["born"].f1.low > 0 and changes["born"].summed == 15
    assert changes["die"].down == 30 and changes["die"].f1.high < 0
    assert changes["(other)"].f1.n == 3
    kept = {c.group: c.f1.n for c in group_changes(tmp_path / "rec", groups, min_group=1, n_resamples=100,
                                                   keep=["die"])}
    assert kept == {"die": 30, "(other)": 33}
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "metadata": {"relation": r}}) + "\n"
                                 for i, r in enumerate(rel)))
    assert main([str(tmp_path / "rec"), "--by", "metadata.relation", "--questions", str(questions),
                 "--resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert "| born | 30 | 0.500 → 1.000 |" in out and "| die | 30 |" in out and "30 / 0 | +15.0 |" in out
    assert main([str(tmp_path / "rec"), "--by", "metadata.relation", "--questions", str(questions), "--groups",
                 "born", "--resamples", "100"]) == 0
    assert "| (other) | 33 | 0.500 → 0.091 |" in capsys.readouterr().out  # 30 died at 0, 3 rare at 1
    import pytest

    with pytest.raises(SystemExit) as exc:  # --by without --questions
        main([str(tmp_path / "rec"), "--by", "metadata.relation"])
    assert exc.value.code == 2 and "go together" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a field no question has
        main([str(tmp_path / "rec"), "--by", "metadata.nope", "--questions", str(questions)])
    assert exc.value.code == 2 and "has the field 'metadata.nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a --groups name no question has: the choices, not a silent pool
        main([str(tmp_path / "rec"), "--by", "metadata.relation", "--questions", str(questions), "--groups", "wed"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--groups wed" in err and "born, die, rare" in err


def test_pool_averages_seeds_and_widens_with_their_spread(tmp_path, capsys) -> None:
    """Three seeds, each +0.1 on a different third of 60 questions: every run alone moves F1 by +0.033; pooled, the
    mean is +0.033 and the interval over questions is narrower than one seed's, the seeds-x-questions one wider."""
    start = [_row(i, 0.2, 0.2, True, 1.0) for i in range(60)]
    for s in range(3):
        final = [_row(i, 0.2 + 0.1 * (i % 3 == s) * 1, 0.2 + 0.1 * (i % 3 == s), True, 1.0) for i in range(60)]
        _write(tmp_path / ("rec" if s == 0 else f"rec__seed{42 + s}"), start, final)
    final = [_row(i, 0.2, 0.2 + 0.1 * (i % 3 == 0), True, 1.0) for i in range(60)]
    _write(tmp_path / "uneven", start, final)
    _write(tmp_path / "uneven__seed43", start, start)  # a replicate that does not move
    folders = [tmp_path / n for n in ("rec", "rec__seed43", "rec__seed44")]
    p = pooled_seeds(folders, "f1", n_resamples=2000)
    one = evaluate_folder(folders[0], n_resamples=2000).f1
    assert p.n == 60 and p.folders == ["rec", "rec__seed43", "rec__seed44"]
    assert p.per_seed == pytest.approx([0.1 / 3] * 3) and p.diff == pytest.approx(0.1 / 3)
    assert p.low_questions == pytest.approx(p.high_questions) == pytest.approx(0.1 / 3)  # every question +0.033
    assert one.high - one.low > 0.02
    u = pooled_seeds([tmp_path / "uneven", tmp_path / "uneven__seed43"], "f1", n_resamples=2000)
    assert u.per_seed == pytest.approx([0.1 / 3, 0.0]) and u.diff == pytest.approx(0.1 / 6)
    assert u.low_seeds_questions <= u.low_questions and u.high_seeds_questions >= u.high_questions
    assert u.low_seeds_questions == pytest.approx(0.0, abs=1e-12)  # both seeds drawn as the flat one
    assert main([str(f) for f in (*folders, tmp_path / "uneven", tmp_path / "uneven__seed43")]
                + ["--pool", "--resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert "| rec | f1 | 3 | 60 | +0.033, +0.033, +0.033 | +0.033 |" in out and "| uneven | reward | 2 | 60 |" in out


def test_pool_names_what_it_cannot_pool(tmp_path, capsys) -> None:
    rows = [_row(i, 0.1, 0.1, True, 1.0) for i in range(10)]
    _write(tmp_path / "alone", rows, rows)
    with pytest.raises(ValueError, match="at least one replicate"):
        pooled_seeds([tmp_path / "alone"])
    other = [{**r, "id": f"x{i}"} for i, r in enumerate(rows)]
    _write(tmp_path / "alone__seed43", other, other)
    with pytest.raises(ValueError, match="share no question"):
        pooled_seeds([tmp_path / "alone", tmp_path / "alone__seed43"])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "alone"), "--pool"])
    assert "no folder given together with a replicate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "alone"), "--pool", "--by", "metadata.relation", "--questions", str(tmp_path / "q")])
    assert "separate reports" in capsys.readouterr().err


def test_gold_headroom_against_what_the_run_took(tmp_path, capsys) -> None:
    """--gold: gold - start is the room the start policy left, final - start what the run took of it."""
    from evaluation.criteria import headroom

    start = [_row(i, 0.5, 0.5, True, 1.0) for i in range(40)]
    final = [_row(i, 0.5, 0.5 + 0.2 * (i % 2), True, 1.0) for i in range(40)]  # +0.1 on average
    gold = [{"id": f"q{i}", "f1": 0.5 + 0.4 * (i % 2)} for i in range(40)] + [{"id": "other", "f1": 1.0}]
    d = _write(tmp_path / "rec", start, final)
    h = headroom(d, gold, n_resamples=500)
    assert h.n == 40 and abs(h.gold_minus_start.diff - 0.2) < 1e-9 and abs(h.final_minus_start.diff - 0.1) < 1e-9
    assert abs(h.gold_minus_final.diff - 0.1) < 1e-9 and abs(h.taken - 0.5) < 1e-9
    assert h.gold_minus_start.low > 0
    g = tmp_path / "gold.jsonl"
    g.write_text("".join(json.dumps(r) + "\n" for r in gold))
    assert main([str(d), "--gold", str(g), "--resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert "| rec | 40 | 0.500 | 0.700 | 0.600 | +0.200" in out and "| 50% |" in out
    # one --gold per folder, an existing file, shared questions: each refused with the fix named
    with pytest.raises(SystemExit):
        main([str(d), str(d), "--gold", str(g)])
    assert "one --gold per folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(d), "--gold", str(tmp_path / "missing.jsonl")])
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(d), "--gold", str(g), "--pool"])
    assert "report of its own" in capsys.readouterr().err
    g.write_text(json.dumps({"id": "elsewhere", "f1": 1.0}) + "\n")
    with pytest.raises(SystemExit):
        main([str(d), "--gold", str(g)])
    assert "share no question id" in capsys.readouterr().err


def _answer(i: int, question: str, pred: str, gold: str, f1: float, found: bool | None = None) -> dict:
    row = {**_row(i, f1, f1, True, 1.0), "question": question, "pred": pred, "golden_answers": [gold]}
    return row if found is None else {**row, "answer_retrieved": found}


def test_answer_kinds_read_what_the_answers_are() -> None:
    from evaluation.criteria import answer_kind

    q = "Which country Jakobea Of Baden's mother is from?"
    assert answer_kind(_answer(0, q, "Germany", "Germany", 1.0)) == "exact"
    assert answer_kind(_answer(0, "Where was X born?", "Dombås", "Dombås, Norway", 0.67)) == "partial"
    assert answer_kind(_answer(0, q, "Jakobea Of Baden", "Germany", 0.0)) == "copied"
    assert answer_kind(_answer(0, q, "France", "Germany", 0.0)) == "other"
    assert answer_kind(_answer(0, q, "", "Germany", 0.0)) == "none"
    assert answer_kind({"id": "q", "f1": 0.0, "pred": None}) == "none"  # a row without the optional fields


def test_answers_report_counts_kinds_moves_and_misses_with_the_answer_found(tmp_path, capsys) -> None:
    from evaluation.criteria import answer_kinds

    q = "Who is the father of Baw Ngan-Mohn?"
    start = [_answer(0, q, "Baw Ngan-Mohn", "Binnya U", 0.0, True),
             _answer(1, q, "Tabinshwehti", "Binnya U", 0.0, True),
             _answer(2, q, "", "Binnya U", 0.0, False), _answer(3, q, "Binnya U", "Binnya U", 1.0, True)]
    final = [_answer(0, q, "Binnya U", "Binnya U", 1.0, True), _answer(1, q, "Tabinshwehti", "Binnya U", 0.0, True),
             _answer(2, q, "King Binnya U", "Binnya U", 0.8, True), _answer(3, q, "Binnya U", "Binnya U", 1.0, True)]
    _write(tmp_path / "rec", start, final)
    a = answer_kinds(tmp_path / "rec")
    assert a.start == {"exact": 1, "partial": 0, "copied": 1, "other": 1, "none": 1}
    assert a.final == {"exact": 2, "partial": 1, "copied": 0, "other": 1, "none": 0}
    assert a.moves == {"copied -> exact": 1, "none -> partial": 1}
    assert (a.missed_found_start, a.missed_start, a.missed_found_final, a.missed_final) == (2, 3, 2, 2)
    assert main([str(tmp_path / "rec"), "--answers"]) == 0
    out = capsys.readouterr().out
    assert ("| rec | 4 | 1 → 2 | 0 → 1 | 1 → 0 | 1 → 1 | 1 → 0 | 2/3 → 2/2 | copied -> exact 1, none -> partial 1 |"
            in out)
    # rows from before answer_retrieved: that cell is "-"; --answers is a report of its own
    _write(tmp_path / "old", [_answer(0, q, "x", "Binnya U", 0.0)], [_answer(0, q, "Binnya U", "Binnya U", 1.0)])
    assert answer_kinds(tmp_path / "old").missed_found_start is None
    with pytest.raises(SystemExit):
        main([str(tmp_path / "rec"), "--answers", "--pool"])
    assert "separate reports" in capsys.readouterr().err


def test_searched_splits_questions_by_whether_each_end_searched(tmp_path, capsys) -> None:
    from evaluation.criteria import searched_split

    # 40 questions: 10 never searched, 20 learned to search (F1 0 -> 1), 5 stopped (1 -> 0), 5 searched at both ends
    start = ([_row(i, 0, 0.0, True, 0) for i in range(30)] + [_row(i, 1, 1.0, True, 1) for i in range(30, 40)])
    final = ([_row(i, 0, 0.0, True, 0) for i in range(10)] + [_row(i, 1, 1.0, True, 2) for i in range(10, 30)]
             + [_row(i, 0, 0.0, True, 0) for i in range(30, 35)] + [_row(i, 1, 1.0, True, 1) for i in range(35, 40)])
    d = _write(tmp_path / "mixed", start, final)
    s = searched_split(d, n_resamples=500)
    assert s is not None and s.n == 40 and (s.searched_start, s.searched_final) == (0.25, 0.625)
    cells = {(m.start_searched, m.final_searched): (m.n, m.f1_start, m.f1_final) for m in s.moves}
    assert cells == {(False, False): (10, 0.0, 0.0), (False, True): (20, 0.0, 1.0), (True, False): (5, 1.0, 0.0),
                     (True, True): (5, 1.0, 1.0)}
    assert abs(s.searches.diff - (45 / 40 - 10 / 40)) < 1e-9 and s.searches.low > 0
    assert searched_split(d, ids={"q0", "q35"}, n_resamples=50).n == 2
    assert main([str(d), "--searched", "--resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert "| mixed | 40 | 0.25 → 1.12, +0.875" in out and "| 20 (0.000 → 1.000) |" in out
    with pytest.raises(SystemExit):
        main([str(d), "--searched", "--answers"])
