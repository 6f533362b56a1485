"""E-step selection: turn scored trajectories into per-trajectory training weights (ExSearch's "entropy" step).

Methods (``SelectionConfig.method``):

- ``importance`` (default, the paper's intent): per question q with K scored trajectories,
  ``w_i = softmax_i(L_i / tau)`` where ``L_i`` is the teacher-forced log-likelihood of the supervised tokens with
  the gold answer substituted (``training.em.scoring``). Self-normalized importance weights; they sum to 1 per question.
- ``reward``: reward-weighted regression, ``w_i = F1_i / sum_j F1_j`` per question (ExSearch ``PROCEDURE=reward``).
- ``rejection``: keep only correct trajectories, uniform among them (ExSearch's legacy ``format.py``).
- ``exsearch_released_buggy``: reproduce the released ExSearch alignment weighting exactly. **It is a bug**, kept
  for ablations only: the released trainer (``src/tuning/trainer.py: WeightedTrainer``) ignores question groups and,
  inside each *micro-batch*, sets ``s_i = -prob_i`` (``prob_i`` = mean token NLL, so ``s_i <= 0``) and
  ``w_i = s_i / sum_j s_j``; the softmax it computes is assigned to a misspelled variable and never used. The
  effect is that *less likely* trajectories get *larger* weights. Here selection only carries ``prob_i`` through
  (``Weighted.prob``); the micro-batch weights are computed by
  ``training.sft.weighted.exsearch_released_microbatch_weights`` inside ``WeightedTrainer``.

Before any weighting, trajectories with more than ``max_empty_facts`` (default 2) empty ``<FACT>`` steps are dropped
and counted (``SelectionStats.dropped_empty_facts``), as the released entropy step drops those with more than two
``<FACT> \n<QUERY>`` patterns (:func:`count_empty_facts`); ``max_empty_facts: null`` keeps them.

Degenerate groups are dropped and counted (``SelectionStats.dropped``): every score non-finite; a single sample
(``drop_single``; its weight would be 1 whatever the model thinks); all scores equal (``drop_all_equal``; weights
carry no preference); no reward (``reward``); no correct trajectory (``rejection``). Non-finite members of an
otherwise valid group are dropped individually (``dropped_members``).

Training weights: ``Weighted.weight`` = the normalized ``w_i`` times ``samples_per_question`` (K, the number of samples
drawn per question; by default the largest group in the input), the same constant for every question. Every kept
question therefore carries the same total training weight K, however many of its samples finished or were kept: a
question with 2 finished samples out of 4 weighs as much as one with 4 (with ``w * group size`` it would weigh half).
A uniform full group is exactly plain SFT on that group.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from infra.errors import ConfigError
from training.em.config import SelectionConfig


class Scored(BaseModel):
    """One scored trajectory: the input to selection."""

    model_config = ConfigDict(frozen=True)

    question_id: str = Field(description="Question the trajectory answers; groups are formed by this id.")
    trajectory_id: str = Field(description="Unique id of the trajectory.")
    sum_logprob: float = Field(description="Sum of log p(token) over the supervised tokens (gold answer in place).")
    n_tokens: int = Field(ge=0, description="Number of supervised tokens scored.")
    f1: float = Field(default=0.0, ge=0, le=1, description="Token F1 of the trajectory's own predicted answer.")
    correct: float = Field(default=0.0, ge=0, le=1, description="Correctness score (EM / cover-EM) of the prediction.")
    empty_facts: int = Field(default=0, ge=0, description="Empty <FACT> steps of the trajectory (count_empty_facts).")

    @property
    def mean_logprob(self) -> float:
        """Per-token mean log-prob (NaN when no token was scored)."""
        return self.sum_logprob / self.n_tokens if self.n_tokens else float("nan")


class Weighted(BaseModel):
    """One selected trajectory with its weights."""

    model_config = ConfigDict(frozen=True)

    question_id: str = Field(description="Question id.")
    trajectory_id: str = Field(description="Trajectory id.")
    w: float = Field(description="Normalized weight (sums to 1 over the question's normalization set).")
    weight: float = Field(description="Training weight = w * K (samples per question); sums to K per question.")
    group_size: int = Field(description="Size of the normalization set.")
    prob: float = Field(default=float("nan"), description="Mean token NLL (ExSearch's `prob`), for the released mode.")


class SelectionStats(BaseModel):
    """Counts from one selection pass."""

    method: str = Field(description="Method used.")
    n_trajectories: int = Field(description="Trajectories in.")
    n_questions: int = Field(description="Distinct questions in.")
    n_groups_kept: int = Field(description="Questions that contributed weights.")
    n_selected: int = Field(description="Trajectories out.")
    dropped: dict[str, int] = Field(description="Dropped groups by reason.")
    dropped_members: int = Field(description="Non-finite trajectories dropped from otherwise valid groups.")
    mean_ess: float = Field(description="Mean effective sample size 1/sum(w^2) over kept groups (NaN if none).")
    dropped_empty_facts: int = Field(default=0, description="Trajectories dropped for too many empty <FACT>s.")


_EMPTY_FACT = re.compile(r"<FACT>[ \t]*(?:\n|$)")


def count_empty_facts(messages: Sequence[dict]) -> int:
    """Empty ``<FACT>`` steps in a trajectory's assistant turns: ``<FACT>`` followed only by spaces up to the line
    end (the released pattern ``<FACT> \n<QUERY>``, and a fact left empty at the end of a turn)."""
    return sum(len(_EMPTY_FACT.findall(str(m.get("content", "")))) for m in messages if m.get("role") == "assistant")


def softmax(values: Sequence[float], temperature: float = 1.0) -> list[float]:
    """Numerically stable softmax of ``values / temperature``."""
    scaled = [v / temperature for v in values]
    top = max(scaled)
    exps = [math.exp(v - top) for v in scaled]
    total = sum(exps)
    return [e / total for e in exps]


def _score(item: Scored, cfg: SelectionConfig) -> float:
    return item.sum_logprob if cfg.score == "sum" else item.mean_logprob


def _group_weights(group: list[Scored], cfg: SelectionConfig) -> tuple[list[Scored], list[float]] | str:
    """Return (members, normalized weights) for one question, or the reason the group is dropped."""
    if cfg.method == "rejection":
        members = [t for t in group if t.correct >= cfg.correct_threshold]
        if not members:
            return "no_correct"
        return members, [1.0 / len(members)] * len(members)
    if cfg.method == "reward":
        total = sum(t.f1 for t in group)
        if total <= 0:
            return "zero_reward"
        members = [t for t in group if t.f1 > 0]
        return members, [t.f1 / total for t in members]
    scores = [_score(t, cfg) for t in group]
    if len(group) == 1 and cfg.drop_single:
        return "single"
    if cfg.drop_all_equal and max(scores) - min(scores) <= cfg.equal_tol:
        return "all_equal"
    return group, softmax(scores, cfg.temperature)


def select_weights(
    scored: Iterable[Scored], cfg: SelectionConfig, samples_per_question: int | None = None
) -> tuple[list[Weighted], SelectionStats]:
    """Compute E-step weights per question.

    Args:
        scored: scored trajectories (any order; grouped by ``question_id``).
        cfg: selection config.
        samples_per_question: K, the total training weight each kept question carries (``weight = w * K``); ``None``
            uses the largest question group in the input.

    Returns:
        (selected trajectories with weights, statistics including dropped-group counts).
    """
    items = list(scored)
    n_in = len(items)
    if cfg.max_empty_facts is not None:
        items = [t for t in items if t.empty_facts <= cfg.max_empty_facts]
    empty_dropped = n_in - len(items)
    seen = Counter(t.trajectory_id for t in items)
    dupes = [k for k, n in seen.items() if n > 1]
    if dupes:
        raise ConfigError(f"duplicate trajectory ids in selection input: {dupes[:5]}; ids must be unique")
    if cfg.method == "exsearch_released_buggy":
        out, stats = _released(items)
        return out, stats.model_copy(update={"dropped_empty_facts": empty_dropped, "n_trajectories": n_in})
    groups: dict[str, list[Scored]] = defaultdict(list)
    for t in items:
        groups[t.question_id].append(t)
    if samples_per_question is not None and samples_per_question < 1:
        raise ConfigError(f"samples_per_question must be >= 1, got {samples_per_question}")
    total = samples_per_question or max((len(g) for g in groups.values()), default=1)
    out: list[Weighted] = []
    dropped: Counter[str] = Counter()
    dropped_members = 0
    ess: list[float] = []
    for qid, group in groups.items():
        finite = [t for t in group if math.isfinite(_score(t, cfg))]
        if not finite:
            dropped["nonfinite"] += 1
            continue
        dropped_members += len(group) - len(finite)
        result = _group_weights(finite, cfg)
        if isinstance(result, str):
            dropped[result] += 1
            continue
        members, ws = result
        ess.append(1.0 / sum(w * w for w in ws))
        n = len(members)
        out.extend(
            Weighted(question_id=qid, trajectory_id=t.trajectory_id, w=w, weight=w * total, group_size=n,
                     prob=-t.mean_logprob)
            for t, w in zip(members, ws, strict=True)
        )
    stats = SelectionStats(
        method=cfg.method, n_trajectories=n_in, n_questions=len(groups), n_groups_kept=len(ess),
        n_selected=len(out), dropped=dict(dropped), dropped_members=dropped_members,
        mean_ess=sum(ess) / len(ess) if ess else float("nan"), dropped_empty_facts=empty_dropped,
    )
    return out, stats


def _released(items: list[Scored]) -> tuple[list[Weighted], SelectionStats]:
    """Released ExSearch: no grouping; keep finite ``prob`` (NaN dropped, as its entropy step does).

    ``w``/``weight`` are placeholders (1.0): the trainer derives the real weights per micro-batch from ``prob``.
    """
    out = [
        Weighted(question_id=t.question_id, trajectory_id=t.trajectory_id, w=1.0, weight=1.0, group_size=1,
                 prob=-t.mean_logprob)
        for t in items
        if math.isfinite(t.mean_logprob)
    ]
    n_q = len({t.question_id for t in items})
    stats = SelectionStats(
        method="exsearch_released_buggy", n_trajectories=len(items), n_questions=n_q,
        n_groups_kept=len({w.question_id for w in out}), n_selected=len(out), dropped={},
        dropped_members=len(items) - len(out), mean_ess=float("nan"),
    )
    return out, stats


def weight_histogram(weights: Sequence[float], bins: int = 10) -> list[tuple[float, float, int]]:
    """Histogram of finite weights as (low, high, count) rows over [min, max] (one bin when all equal)."""
    finite = [w for w in weights if math.isfinite(w)]
    if not finite:
        return []
    lo, hi = min(finite), max(finite)
    if hi == lo:
        return [(lo, hi, len(finite))]
    width = (hi - lo) / bins
    counts = [0] * bins
    for w in finite:
        counts[min(int((w - lo) / width), bins - 1)] += 1
    return [(lo + i * width, lo + (i + 1) * width, c) for i, c in enumerate(counts)]
