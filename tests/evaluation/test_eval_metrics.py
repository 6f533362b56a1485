"""Metric functions against hand-computed values (arithmetic in the comments)."""

from __future__ import annotations

import math

import pytest

from evaluation.metrics import (
    aggregate,
    answer_metrics,
    bootstrap_ci,
    cover_exact_match,
    exact_match,
    f1_score,
    normalize_answer,
    retrieval_metrics,
    token_cover_em,
    token_scores,
)
from infra.errors import ConfigError


def test_squad_normalization_strips_case_punctuation_articles_whitespace() -> None:
    assert normalize_answer("  The  Eiffel-Tower!! ") == "eiffeltower"  # '-' and '!' deleted, 'the' dropped
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("Théâtre") == "théâtre"  # non-ASCII letters kept
    assert normalize_answer("") == ""


def test_r1searcher_normalization() -> None:
    # underscore and punctuation become spaces (not deleted), curly quotes too; True/False map to yes/no
    assert normalize_answer("Eiffel-Tower", "r1searcher") == "eiffel tower"
    assert normalize_answer("New_York", "r1searcher") == "new york"
    assert normalize_answer("\u2018Blue\u2019 Moon", "r1searcher") == "blue moon"
    assert normalize_answer("True", "r1searcher") == "yes"
    assert normalize_answer("true", "r1searcher") == "true"  # only the exact strings "True"/"False" map
    assert normalize_answer("The_Beatles", "r1searcher") == "beatles"


def test_exsearch_buggy_normalization_deletes_letters_a_and_i() -> None:
    # "Paris" -> lower "paris" -> delete a, i -> "prs"
    assert normalize_answer("Paris", "exsearch_released_buggy") == "prs"
    # "The Italian Job" -> "the italian job" -> delete a/i -> "the tln job" -> drop "the" -> "tln job"
    assert normalize_answer("The Italian Job", "exsearch_released_buggy") == "tln job"
    # underscore is not in its set and survives
    assert normalize_answer("a_b", "exsearch_released_buggy") == "_b"


def test_unknown_normalization_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="squad"):
        normalize_answer("x", "nope")  # type: ignore[arg-type]


def test_exact_match_and_cover_em() -> None:
    assert exact_match("The Beatles.", ["beatles"]) == 1.0
    assert exact_match("Beatles band", ["beatles"]) == 0.0
    assert exact_match("Paris", ["London", "paris"]) == 1.0  # any gold
    assert exact_match("", ["x"]) == 0.0
    assert exact_match("x", []) == 0.0  # no golds -> 0
    # acc: normalized gold "beatles" is a substring of "beatles band"
    assert cover_exact_match("Beatles band", ["The Beatles"]) == 1.0
    # substring is character-level, as FlashRAG: "art" in "martin"
    assert cover_exact_match("Martin", "art") == 1.0
    assert cover_exact_match("Lennon", ["Beatles"]) == 0.0
    # empty gold "" is a substring of anything
    assert cover_exact_match("anything", [""]) == 1.0


def test_f1_hand_computed() -> None:
    # pred "barack obama president" (3 tokens), gold "barack obama" (2): same=2, P=2/3, R=1, F1=2*(2/3)/(5/3)=0.8
    ts = token_scores("Barack Obama, president", ["Barack Obama"])
    assert ts.precision == pytest.approx(2 / 3)
    assert ts.recall == 1.0
    assert ts.f1 == pytest.approx(0.8)
    # articles removed before tokenising: "the cat sat" -> "cat sat" vs "a cat" -> "cat": P=1/2 R=1 F1=2/3
    assert f1_score("the cat sat", "a cat") == pytest.approx(2 / 3)
    # repeated tokens count with multiplicity: pred "a b b" -> "b b", gold "b c": same=min(2,1)=1, P=1/2, R=1/2
    assert f1_score("a b b", "b c") == pytest.approx(0.5)
    assert f1_score("", ["paris"]) == 0.0
    assert f1_score("paris", []) == 0.0


def test_f1_max_over_golds_independently_in_squad() -> None:
    # gold1 "a b c d" normalizes to "b c d" (article dropped); pred "b c x": same=2, P=2/3, R=2/3, F1=2/3
    # gold2 "x": same=1, P=1/3, R=1, F1=2*(1/3)/(4/3)=0.5
    # FlashRAG maxes each independently: F1=2/3, P=2/3, R=1 (R from gold2)
    ts = token_scores("b c x", ["a b c d", "x"])
    assert ts.f1 == pytest.approx(2 / 3)
    assert ts.precision == pytest.approx(2 / 3)
    assert ts.recall == 1.0
    # R1-Searcher keeps the whole triple of the best-F1 gold (gold1): (2/3, 2/3, 2/3)
    r1 = token_scores("b c x", ["a b c d", "x"], "r1searcher")
    assert (r1.f1, r1.precision, r1.recall) == pytest.approx((2 / 3, 2 / 3, 2 / 3))


def test_yes_no_rule() -> None:
    # pred "yes" vs gold "yes it is": differ and pred is yes -> 0 (without the rule F1 would be 2*(1*1/3)/(4/3)=.5)
    assert f1_score("yes", "yes it is") == 0.0
    assert token_scores("yes", "yes it is", yes_no_rule=False).f1 == pytest.approx(0.5)
    # gold "no" vs pred "no way": gold is "no" and they differ -> 0
    assert f1_score("no way", ["no"]) == 0.0
    assert f1_score("No.", ["no"]) == 1.0
    # ExSearch applies no such rule: "yes" vs "yes it is" -> buggy-normalized "yes" vs "yes t s": P=1 R=1/3 F1=.5
    assert f1_score("yes", "yes it is", "exsearch_released_buggy") == pytest.approx(0.5)


def test_exsearch_buggy_f1_differs_from_squad() -> None:
    # squad: "paris france" vs "paris": P=1/2 R=1 F1=2/3
    assert f1_score("Paris France", "Paris") == pytest.approx(2 / 3)
    # buggy: "prs frnce" vs "prs": same numbers here; but "in paris" vs "paris":
    # squad tokens ["in","paris"] vs ["paris"]: F1=2/3; buggy: "in paris" -> "n prs" vs "prs": F1=2/3 as well,
    # while "i am" vs "am" -> buggy "m" vs "m" = 1.0 but squad ["i","am"] vs ["am"] = 2/3.
    assert f1_score("i am", "am") == pytest.approx(2 / 3)
    assert f1_score("i am", "am", "exsearch_released_buggy") == 1.0


def test_r1searcher_cover_em_token_set() -> None:
    # every gold token in pred tokens, order-insensitive: gold "obama barack" vs pred "barack h obama" -> 1
    assert token_cover_em("Barack H. Obama", "Obama Barack") == 1.0
    # "art" is not a token of "martin" -> 0 (unlike substring acc)
    assert token_cover_em("Martin", "art") == 0.0
    assert token_cover_em("False", "no") == 1.0  # False -> no
    assert token_cover_em("", [""]) == 1.0  # "".split(" ") == [""] on both sides
    assert token_cover_em("x", ["y", "x"]) == 1.0


def test_answer_metrics_bundle() -> None:
    m = answer_metrics("Barack Obama, president", ["Barack Obama"])
    assert m == pytest.approx({"em": 0.0, "f1": 0.8, "precision": 2 / 3, "recall": 1.0, "acc": 1.0, "cem": 1.0})
    assert answer_metrics(None, ["x"])["f1"] == 0.0


def test_retrieval_metrics() -> None:
    # 3 searches, 6 ids returned, repeats: d2 (round 2) and d1, d2 (round 3) -> 3/6 = 0.5
    # gold {d1, d4, d9}: retrieved d1, d4 -> 2/3
    m = retrieval_metrics([["d1", "d2"], ["d2", "d4"], ["d1", "d2"]], ["d1", "d4", "d9"])
    assert m["searches"] == 3.0
    assert m["retrieved"] == 6.0
    assert m["repeated_doc_rate"] == pytest.approx(0.5)
    assert m["gold_recall"] == pytest.approx(2 / 3)
    empty = retrieval_metrics([], [])
    assert empty == {"searches": 0.0, "retrieved": 0.0, "repeated_doc_rate": 0.0, "gold_recall": None}


def test_bootstrap_ci_properties() -> None:
    vals = [1.0] * 30 + [0.0] * 70
    low, high = bootstrap_ci(vals, seed=1)
    assert low < 0.3 < high
    # normal approximation: se = sqrt(.3*.7/100) = .0458; 95% half-width ~ .09 -> bounds near .21 and .39
    assert 0.19 < low < 0.24 and 0.36 < high < 0.41
    assert bootstrap_ci(vals, seed=1) == (low, high)  # seeded
    assert bootstrap_ci([0.5]) == (0.5, 0.5)
    assert all(math.isnan(x) for x in bootstrap_ci([]))
    with pytest.raises(ConfigError):
        bootstrap_ci(vals, confidence=1.5)


def test_aggregate_per_dataset_table() -> None:
    examples = [
        {"dataset": "a", "em": 1.0, "f1": 1.0, "gold_recall": None},
        {"dataset": "a", "em": 0.0, "f1": 0.5, "gold_recall": 0.5},
        {"dataset": "b", "em": 1.0, "f1": 0.25, "gold_recall": 1.0},
    ]
    table = aggregate(examples, n_resamples=200)
    assert [r.dataset for r in table.rows] == ["a", "b", "ALL"]
    assert table.metric_names == ["em", "f1", "gold_recall"]
    a, b, pooled = table.rows
    assert a.n == 2 and a.metrics["em"].mean == 0.5 and a.metrics["f1"].mean == 0.75
    assert a.metrics["gold_recall"].n == 1 and a.metrics["gold_recall"].mean == 0.5  # None skipped
    assert a.metrics["f1"].low >= 0.5 and a.metrics["f1"].high <= 1.0
    # pooled: em (1+0+1)/3 = 2/3, f1 (1+.5+.25)/3 = 0.5833
    assert pooled.metrics["em"].mean == pytest.approx(2 / 3)
    assert pooled.metrics["f1"].mean == pytest.approx(1.75 / 3)
    assert table.as_dict()["b"]["f1"] == 0.25
