"""E-step weights on hand-computed groups, degenerate groups, the released-ExSearch flag and the alternatives."""

from __future__ import annotations

import math

import pytest

from infra.errors import ConfigError
from training.em.selection import (
    Scored,
    SelectionConfig,
    select_weights,
    softmax,
    weight_histogram,
)
from training.sft.weighted import exsearch_released_microbatch_weights


def _t(q: str, i: int, lp: float, n: int = 4, f1: float = 0.0, correct: float = 0.0) -> Scored:
    return Scored(question_id=q, trajectory_id=f"{q}-{i}", sum_logprob=lp, n_tokens=n, f1=f1, correct=correct)


def _by_id(rows):
    return {r.trajectory_id: r for r in rows}


def test_importance_weights_hand_computed() -> None:
    # q1: L = [-1, -2, -3] (sum log-prob), tau = 1.
    #   exp(0)=1, exp(-1)=0.36787944, exp(-2)=0.13533528; total 1.50321472
    #   w = [0.66524096, 0.24472847, 0.09003057]; training weight = 3 * w.
    rows, stats = select_weights([_t("q1", 0, -1.0), _t("q1", 1, -2.0), _t("q1", 2, -3.0)], SelectionConfig())
    w = _by_id(rows)
    assert w["q1-0"].w == pytest.approx(0.66524096, abs=1e-8)
    assert w["q1-1"].w == pytest.approx(0.24472847, abs=1e-8)
    assert w["q1-2"].w == pytest.approx(0.09003057, abs=1e-8)
    assert w["q1-0"].weight == pytest.approx(3 * 0.66524096, abs=1e-7)
    assert sum(r.w for r in rows) == pytest.approx(1.0)
    # ESS = 1 / (0.66524^2 + 0.24473^2 + 0.09003^2) = 1 / (0.442546 + 0.059892 + 0.008106) = 1.958699
    assert stats.mean_ess == pytest.approx(1.958699, abs=1e-5)
    assert stats.n_groups_kept == 1 and stats.dropped == {}


def test_temperature_flattens() -> None:
    # tau = 2 on L = [0, -2]: softmax([0, -1]) = [1, e^-1] / (1 + e^-1) = [0.73105858, 0.26894142]
    rows, _ = select_weights([_t("q", 0, 0.0), _t("q", 1, -2.0)], SelectionConfig(temperature=2.0))
    assert [r.w for r in rows] == pytest.approx([0.73105858, 0.26894142], abs=1e-8)


def test_mean_score_uses_per_token_average() -> None:
    # sum log-probs -4 over 4 tokens and -4 over 2 tokens: means -1 and -2 -> softmax([-1, -2]) = [0.7311, 0.2689]
    rows, _ = select_weights([_t("q", 0, -4.0, n=4), _t("q", 1, -4.0, n=2)], SelectionConfig(score="mean"))
    assert [r.w for r in rows] == pytest.approx([0.73105858, 0.26894142], abs=1e-8)
    rows_sum, _ = select_weights([_t("q", 0, -4.0, n=4), _t("q", 1, -4.0, n=2)], SelectionConfig(score="sum"))
    assert [r.w for r in rows_sum] == pytest.approx([0.5, 0.5])


def test_groups_are_normalized_separately_and_large_scores_are_stable() -> None:
    # q2: L = [-1000, -1001] would underflow exp(); stable softmax gives [1, e^-1]/(1+e^-1)
    data = [_t("q1", 0, -1.0), _t("q1", 1, -1.0), _t("q2", 0, -1000.0), _t("q2", 1, -1001.0)]
    w = _by_id(select_weights(data, SelectionConfig())[0])
    assert w["q1-0"].w == pytest.approx(0.5) and w["q1-0"].weight == pytest.approx(1.0)
    assert w["q2-0"].w == pytest.approx(0.73105858, abs=1e-8)


def test_degenerate_groups_dropped_and_counted() -> None:
    data = [
        _t("nan", 0, float("nan")), _t("nan", 1, float("-inf")),  # every score non-finite
        _t("single", 0, -2.0),  # one sample
        _t("equal", 0, -3.0), _t("equal", 1, -3.0),  # all equal
        _t("partial", 0, -1.0), _t("partial", 1, float("nan")), _t("partial", 2, -2.0),  # one bad member
        _t("empty", 0, 0.0, n=0), _t("empty", 1, 0.0, n=0),  # no tokens -> mean is NaN (sum is 0: fine for sum)
    ]
    rows, stats = select_weights(data, SelectionConfig(drop_all_equal=True, score="mean"))
    assert stats.dropped == {"nonfinite": 2, "single": 1, "all_equal": 1}
    assert stats.dropped_members == 1
    assert stats.n_questions == 5 and stats.n_groups_kept == 1
    assert {r.trajectory_id for r in rows} == {"partial-0", "partial-2"}
    # partial: means -1/4 and -2/4 -> w = [1, e^-0.25] / (1 + e^-0.25) = [0.56217650, 0.43782350]
    assert [r.w for r in rows] == pytest.approx([0.56217650, 0.43782350], abs=1e-8)


def test_single_and_equal_kept_when_configured() -> None:
    data = [_t("single", 0, -2.0), _t("equal", 0, -3.0), _t("equal", 1, -3.0)]
    rows, stats = select_weights(data, SelectionConfig(drop_single=False, drop_all_equal=False))
    assert stats.dropped == {}
    assert _by_id(rows)["single-0"].w == 1.0


def test_released_exsearch_flag_reproduces_bug() -> None:
    # Micro-batch of 2 with prob (mean NLL) = [0.5, 1.5]: s = [-0.5, -1.5], sum = -2.0,
    # w = [-0.5/-2.0, -1.5/-2.0] = [0.25, 0.75]: the LESS likely sample (NLL 1.5) gets 3x the weight.
    assert exsearch_released_microbatch_weights([0.5, 1.5]) == pytest.approx([0.25, 0.75])
    # A proper softmax over log-likelihoods [-0.5, -1.5] would give the opposite: [0.7311, 0.2689].
    assert softmax([-0.5, -1.5]) == pytest.approx([0.73105858, 0.26894142], abs=1e-8)
    # Selection in released mode carries prob = -sum_logprob / n_tokens and ignores question groups.
    data = [_t("q1", 0, -2.0, n=4), _t("q2", 0, -6.0, n=4), _t("q2", 1, float("nan"))]
    rows, stats = select_weights(data, SelectionConfig(method="exsearch_released_buggy"))
    assert [r.prob for r in rows] == pytest.approx([0.5, 1.5])
    assert stats.dropped_members == 1 and stats.n_selected == 2
    assert exsearch_released_microbatch_weights([r.prob for r in rows]) == pytest.approx([0.25, 0.75])
    assert all(math.isnan(x) for x in exsearch_released_microbatch_weights([0.0, 0.0]))


def test_reward_weighted() -> None:
    # F1 = [0.5, 0.25, 0.0] -> w = [0.5/0.75, 0.25/0.75] = [2/3, 1/3]; zero-F1 member gets no row;
    # weight = w * K with K = 3 (the largest group): 2/3 * 3 = 2
    data = [_t("q", 0, -1.0, f1=0.5), _t("q", 1, -9.0, f1=0.25), _t("q", 2, -0.1, f1=0.0), _t("z", 0, -1.0)]
    rows, stats = select_weights(data, SelectionConfig(method="reward"))
    w = _by_id(rows)
    assert w["q-0"].w == pytest.approx(2 / 3) and w["q-1"].w == pytest.approx(1 / 3)
    assert w["q-0"].weight == pytest.approx(2.0)
    assert stats.dropped == {"zero_reward": 1}


def test_rejection_sampling() -> None:
    data = [_t("q", 0, -1.0, correct=1.0), _t("q", 1, -2.0, correct=0.0), _t("q", 2, -3.0, correct=1.0),
            _t("wrong", 0, -1.0)]
    rows, stats = select_weights(data, SelectionConfig(method="rejection"))
    assert sorted(r.trajectory_id for r in rows) == ["q-0", "q-2"]
    # 2 kept of K = 3 samples: each 0.5 * 3, so the question still totals K
    assert all(r.weight == pytest.approx(1.5) and r.w == pytest.approx(0.5) for r in rows)
    assert stats.dropped == {"no_correct": 1}


def test_duplicate_ids_rejected_and_histogram() -> None:
    with pytest.raises(ConfigError, match="duplicate trajectory ids"):
        select_weights([_t("q", 0, -1.0), _t("q", 0, -2.0)], SelectionConfig())
    hist = weight_histogram([0.0, 0.5, 1.0, float("nan")], bins=2)
    assert hist == [(0.0, 0.5, 1), (0.5, 1.0, 2)]
    assert weight_histogram([2.0, 2.0]) == [(2.0, 2.0, 2)]


@pytest.mark.parametrize("method", ["importance", "reward", "rejection"])
def test_every_question_carries_the_same_total_weight(method: str) -> None:
    # K = 4 samples per question; q4 finished all 4, q2 only 2 (two never reached an answer). With weight = w * n
    # q2 weighed 2.0 and q4 4.0: the question whose samples failed more often counted half as much.
    data = [_t("q4", i, -1.0 - i, f1=0.5, correct=1.0) for i in range(4)]
    data += [_t("q2", i, -2.0 - i, f1=0.5, correct=1.0) for i in range(2)]
    for k in (4, None):  # explicit K, or the largest group
        rows, _ = select_weights(data, SelectionConfig(method=method), samples_per_question=k)
        totals = {q: sum(r.weight for r in rows if r.question_id == q) for q in ("q4", "q2")}
        assert totals["q4"] == pytest.approx(4.0) and totals["q2"] == pytest.approx(4.0), totals
    with pytest.raises(ConfigError, match="samples_per_question"):
        select_weights(data, SelectionConfig(), samples_per_question=0)


def test_trajectories_with_more_than_two_empty_facts_are_dropped() -> None:
    """The released ExSearch entropy step drops trajectories with more than 2 ``<FACT> \\n<QUERY>`` patterns."""
    from training.em.selection import count_empty_facts

    empty = [{"role": "user", "content": "<FACT> \n"}, {"role": "assistant", "content": "<QUERY> a"},
             *[{"role": "assistant", "content": "<FACT> \n<QUERY> b"}] * 3]
    assert count_empty_facts(empty) == 3  # user turns do not count
    assert count_empty_facts([{"role": "assistant", "content": "<FACT> Paris\n<QUERY> c"}]) == 0
    items = [Scored(question_id="q", trajectory_id=f"t{i}", sum_logprob=-float(i + 1), n_tokens=3, empty_facts=e)
             for i, e in enumerate([0, 2, 3])]
    out, stats = select_weights(items, SelectionConfig())
    assert sorted(w.trajectory_id for w in out) == ["t0", "t1"] and stats.dropped_empty_facts == 1
    assert stats.n_trajectories == 3
    out, stats = select_weights(items, SelectionConfig(max_empty_facts=None))
    assert len(out) == 3 and stats.dropped_empty_facts == 0
    out, stats = select_weights(items, SelectionConfig(method="exsearch_released_buggy"))
    assert len(out) == 2 and stats.dropped_empty_facts == 1
