"""SmartSearch stage-1 screen and stage-2 DPO pair rules on hand-made groups (the seed's transfer_dpo.py: good =
verdict 1 and redundancy <= 1, bad = verdict 0 or redundancy > 1, failed calls neither; ties to the first)."""

from __future__ import annotations

from training.smartsearch.pairs import Scored, build_pairs, pair_counts, screen_reason


def s(qid: str, sample: int, f1: float, verdicts: list, redundancy: list | None = None, ok: bool = True) -> Scored:
    return Scored(question_id=qid, sample=sample, prompt=f"P-{qid}", response=f"R-{qid}-{sample}", f1=f1,
                  format_ok=ok, verdicts=verdicts, redundancy=redundancy or [0] * len(verdicts))


def test_round_counts_follow_the_seed() -> None:
    x = s("q", 0, 1.0, [1, 0, None, 1], [0, 0, 0, 2])
    assert x.good_rounds() == 1 and x.bad_rounds() == 2   # the redundant 1 is bad; the failed call is neither


def test_original_correct_rejects_the_wrong_regeneration_with_fewest_good_rounds() -> None:
    orig = s("q", 0, 0.9, [1, 1])
    regens = [s("q", 1000, 0.0, [1, 1]), s("q", 1001, 0.1, [1, 0]), s("q", 1002, 0.2, [0, 1]),
              s("q", 1003, 1.0, [0, 0])]  # 1001 and 1002 tie on one good round: the first wins; 1003 is correct
    [p] = build_pairs([orig], regens)
    assert (p.case, p.chosen_sample, p.rejected_sample) == ("original_correct", 0, 1001)
    assert p.chosen == "R-q-0" and p.rejected == "R-q-1001" and p.prompt == "P-q"


def test_original_wrong_chooses_the_correct_regeneration_with_fewest_bad_rounds() -> None:
    orig = s("q", 0, 0.0, [0, 0])
    regens = [s("q", 1000, 1.0, [0, 1]), s("q", 1001, 0.85, [1, 1], [0, 3]), s("q", 1002, 0.9, [1, None]),
              s("q", 1003, 0.8, [1, 1]), s("q", 1004, 0.1, [1, 1])]
    [p] = build_pairs([orig], regens)
    # 1002 (failed call = not bad) and 1003 tie at zero bad rounds: the first wins; 1001's redundancy is bad
    assert (p.case, p.chosen_sample, p.rejected_sample) == ("regeneration_correct", 1002, 0)


def test_no_pair_without_contrast_or_regenerations() -> None:
    assert build_pairs([s("q", 0, 1.0, [1])], [s("q", 1000, 0.9, [0])]) == []     # both correct
    assert build_pairs([s("q", 0, 0.0, [1])], [s("q", 1000, 0.5, [1])]) == []     # both wrong (0.5 < 0.8)
    assert build_pairs([s("q", 0, 1.0, [1])], [s("other", 1000, 0.0, [0])]) == []  # other question's group
    assert build_pairs([s("q", 0, 0.0, [1])], []) == []


def test_regenerations_are_grouped_by_question_and_thresholds_apply() -> None:
    originals = [s("a", 0, 1.0, [1]), s("a", 1, 0.0, [0]), s("b", 0, 0.4, [1])]
    regens = [s("a", 1000, 0.0, [0]), s("a", 1001, 1.0, [1]), s("b", 1000, 0.5, [1])]
    pairs = build_pairs(originals, regens)
    assert [(p.question_id, p.case) for p in pairs] == [("a", "original_correct"), ("a", "regeneration_correct")]
    assert pair_counts(pairs) == {"original_correct": 1, "regeneration_correct": 1}
    low = build_pairs(originals, regens, min_f1=0.3)                               # b: 0.4 correct, 0.5 correct
    assert pair_counts(low) == {"original_correct": 1, "regeneration_correct": 1}


def test_screen_rules_in_order() -> None:
    assert screen_reason(s("q", 0, 1.0, [1, 1])) == "kept"
    assert screen_reason(s("q", 0, 1.0, [1, 1], ok=False)) == "format"
    assert screen_reason(s("q", 0, 1.0, [1, 1], ok=False), require_format=False) == "kept"
    assert screen_reason(s("q", 0, 1.0, [1, 1], [0, 2])) == "redundancy"
    assert screen_reason(s("q", 0, 1.0, [1, 0])) == "judge_0"
    assert screen_reason(s("q", 0, 1.0, [1, None])) == "judge_failed"
    assert screen_reason(s("q", 0, 1.0, [1, None]), failed_verdict="keep") == "kept"
    assert screen_reason(s("q", 0, 0.79, [1])) == "f1"
    assert screen_reason(s("q", 0, 0.5, [1]), min_f1=0.5) == "kept"
