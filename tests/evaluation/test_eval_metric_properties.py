"""Property-based checks of the metric functions (hypothesis): bounds and relations that must always hold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.metrics import (
    NORMALIZATIONS,
    answer_metrics,
    cover_exact_match,
    exact_match,
    normalize_answer,
    token_cover_em,
)

PIECES = [*"abcdeiTFru _-.,'\u2019", "the ", "an ", "yes", "no", "True", "Paris", "\u00e9"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
GOLDS = st.lists(TEXT, min_size=1, max_size=3)
NORM = st.sampled_from(NORMALIZATIONS)


@settings(max_examples=150, deadline=None)
@given(TEXT, NORM)
def test_normalization_idempotent_and_clean(text: str, norm: str) -> None:
    once = normalize_answer(text, norm)  # type: ignore[arg-type]
    assert normalize_answer(once, norm) == once  # type: ignore[arg-type]
    assert once == once.strip() and "  " not in once


@settings(max_examples=150, deadline=None)
@given(TEXT, GOLDS, NORM)
def test_metric_bounds_and_relations(pred: str, golds: list[str], norm: str) -> None:
    m = answer_metrics(pred, golds, norm)  # type: ignore[arg-type]
    assert all(0.0 <= m[k] <= 1.0 for k in m)
    if m["em"] == 1.0:  # equal strings contain each other, and their tokens cover each other
        assert m["acc"] == 1.0 and m["cem"] == 1.0
    if m["f1"] > 0:
        assert m["precision"] > 0 and m["recall"] > 0


@settings(max_examples=100, deadline=None)
@given(TEXT, TEXT, NORM)
def test_gold_inside_prediction_is_covered(prefix: str, gold: str, norm: str) -> None:
    assert exact_match(gold, [gold], norm) == 1.0  # type: ignore[arg-type]
    if gold not in ("True", "False"):  # R1-Searcher maps only these exact strings, so context changes them
        # a prediction that contains the gold after a word boundary covers it, as a substring and as tokens
        assert cover_exact_match(prefix + " " + gold, [gold], norm) == 1.0  # type: ignore[arg-type]
        covered = token_cover_em(prefix + " " + gold, [gold], norm)  # type: ignore[arg-type]
        assert covered == 1.0 or not normalize_answer(gold, norm)  # type: ignore[arg-type]
