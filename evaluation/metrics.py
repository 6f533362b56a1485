"""Answer and retrieval metrics as pure functions, plus bootstrap intervals and per-dataset aggregation.

Answer metrics follow FlashRAG (what ReSearch, SmartSearch and Search-R1 report): EM, token F1, precision,
recall and ``acc`` (cover-EM: the normalized gold is a substring of the normalized prediction), each the maximum
over the gold answers, under SQuAD normalization. Token F1/precision/recall use FlashRAG's yes/no rule: when the
normalized prediction or gold is ``yes``/``no``/``noanswer`` and they differ, that gold scores 0.

Other normalizations (``normalization=`` argument):

- ``"squad"`` (default): lower-case, drop ASCII punctuation, drop the words a/an/the, collapse whitespace.
- ``"r1searcher"``: R1-Searcher's rule: ``"True"``/``"False"`` become yes/no, underscores and punctuation
  (ASCII plus curly quotes, acute accent and backtick) become spaces, then articles and whitespace as above. With it
  ``cem`` is R1-Searcher's CEM: every gold token is in the prediction's token list, order-insensitive.
- ``"exsearch_released_buggy"``: the normalization of ExSearch's ``v1`` branch (mangopy/SearchLM, 2025-05-22 on),
  which is BROKEN (see ``_exsearch_buggy``). Use it only to reproduce numbers computed with that code, never to
  compare systems. (The repository's ``main`` branch normalizes like ``"squad"``; its F1 has no yes/no rule:
  ``token_scores(..., yes_no_rule=False)``.)
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from evaluation.normalize import NORMALIZATIONS as NORMALIZATIONS  # re-exported
from evaluation.normalize import Normalization as Normalization
from evaluation.normalize import normalize_answer as normalize_answer
from infra.errors import ConfigError

ANSWER_METRICS: tuple[str, ...] = ("em", "f1", "precision", "recall", "acc", "cem")
YES_NO = ("yes", "no", "noanswer")


def _golds(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


def exact_match(pred: str, golds: str | Iterable[str], normalization: Normalization = "squad") -> float:
    """1.0 if the normalized prediction equals any normalized gold, else 0.0 (0.0 with no golds)."""
    p = normalize_answer(pred, normalization)
    return float(any(normalize_answer(g, normalization) == p for g in _golds(golds)))


def cover_exact_match(pred: str, golds: str | Iterable[str], normalization: Normalization = "squad") -> float:
    """FlashRAG ``acc`` / ExSearch ``Acc``: 1.0 if a normalized gold is a substring of the normalized prediction.

    This is a character substring test ("art" is covered by "martin"), exactly as the seeds compute it.
    """
    p = normalize_answer(pred, normalization)
    return float(any(normalize_answer(g, normalization) in p for g in _golds(golds)))


def token_cover_em(pred: str, golds: str | Iterable[str], normalization: Normalization = "r1searcher") -> float:
    """R1-Searcher's CEM: 1.0 if, for some gold, every gold token appears in the prediction's token list.

    Tokens come from ``split(" ")`` as in the seed, so an empty normalized gold gives the token ``""``, which is
    covered only by an empty prediction.
    """
    pred_tokens = normalize_answer(pred, normalization).split(" ")
    for gold in _golds(golds):
        if all(tok in pred_tokens for tok in normalize_answer(gold, normalization).split(" ")):
            return 1.0
    return 0.0


class TokenScores(BaseModel):
    """Token-level F1, precision and recall of one prediction (each already maximised over the golds)."""

    model_config = ConfigDict(frozen=True)

    f1: float = Field(description="Token F1 in [0, 1].")
    precision: float = Field(description="Shared tokens / prediction tokens.")
    recall: float = Field(description="Shared tokens / gold tokens.")


def _prf(pred_tokens: list[str], gold_tokens: list[str]) -> tuple[float, float, float]:
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def token_scores(
    pred: str, golds: str | Iterable[str], normalization: Normalization = "squad", yes_no_rule: bool | None = None
) -> TokenScores:
    """Token F1/precision/recall, maximised over golds.

    Args:
        pred: predicted answer.
        golds: one gold or several.
        normalization: see the module docstring.
        yes_no_rule: zero a gold when pred or gold is yes/no/noanswer and they differ. ``None`` picks the seed's
            choice: on for ``squad`` and ``r1searcher``, off for ``exsearch_released_buggy``.

    With ``squad`` the three maxima are taken independently (FlashRAG); with the other normalizations the
    (f1, precision, recall) triple of the gold with the best F1 is returned (R1-Searcher, ExSearch).
    """
    rule = normalization != "exsearch_released_buggy" if yes_no_rule is None else yes_no_rule
    p = normalize_answer(pred, normalization)
    triples = []
    for gold in _golds(golds):
        g = normalize_answer(gold, normalization)
        if rule and (p in YES_NO or g in YES_NO) and p != g:
            triples.append((0.0, 0.0, 0.0))
            continue
        triples.append(_prf(p.split(), g.split()))
    if not triples:
        return TokenScores(f1=0.0, precision=0.0, recall=0.0)
    if normalization == "squad":
        return TokenScores(f1=max(t[0] for t in triples), precision=max(t[1] for t in triples),
                           recall=max(t[2] for t in triples))
    best = max(triples, key=lambda t: t[0])
    return TokenScores(f1=best[0], precision=best[1], recall=best[2])


def f1_score(pred: str, golds: str | Iterable[str], normalization: Normalization = "squad") -> float:
    """Token F1 maximised over golds (see :func:`token_scores`)."""
    return token_scores(pred, golds, normalization).f1


def contains_answer(texts: Sequence[str], golds: str | Iterable[str]) -> str | None:
    """The first gold answer found, as whole words, in the SQuAD-normalised ``texts`` (``yes``/``no`` golds never
    match: a document holds those words without answering)."""
    hay = " " + " ".join(normalize_answer(t) for t in texts) + " "
    for g in _golds(golds):
        n = normalize_answer(g)
        if n and n not in {"yes", "no"} and f" {n} " in hay:
            return g
    return None


def copied_from_question(question: str, answer: str | None, golden_answers: Iterable[str] = ()) -> bool:
    """Whether ``answer`` is copied from ``question``: non-empty after SQuAD normalization, a substring of the
    normalized question that starts at a word (so "Jakobea Of Baden" is in "... jakobea of badens mother ..." but
    "e" is not in "directed"), and not a gold answer ("Which film came out first, X or Y?" -> "X" is right, not copied).
    """
    pred = normalize_answer(answer or "")
    if not pred or f" {pred}" not in f" {normalize_answer(question)}":  # from a word's start: "badens" has "baden"
        return False
    golds = [g for g in golden_answers if g]
    return not (golds and exact_match(answer or "", golds) > 0)


def answer_metrics(pred: str | None, golds: str | Iterable[str], normalization: Normalization = "squad") -> dict:
    """All answer metrics of one example: ``em``, ``f1``, ``precision``, ``recall``, ``acc`` and ``cem``.

    A missing prediction (``None``) scores like the empty string.
    """
    pred = pred or ""
    golds = _golds(golds)
    ts = token_scores(pred, golds, normalization)
    return {
        "em": exact_match(pred, golds, normalization),
        "f1": ts.f1,
        "precision": ts.precision,
        "recall": ts.recall,
        "acc": cover_exact_match(pred, golds, normalization),
        "cem": token_cover_em(pred, golds, normalization),
    }


def retrieval_metrics(rounds: Sequence[Sequence[str]], gold_doc_ids: Iterable[str] = ()) -> dict:
    """Retrieval metrics of one trajectory.

    Args:
        rounds: retrieved document ids, one list per search call, in order.
        gold_doc_ids: corpus ids of the gold (supporting) passages; may be empty.

    Returns:
        ``searches`` (number of search calls), ``retrieved`` (ids returned in total), ``repeated_doc_rate``
        (share of returned ids already returned earlier in the trajectory; 0.0 with nothing retrieved) and
        ``gold_recall`` (share of gold ids retrieved at least once; ``None`` when there are no gold ids).
    """
    seen: set[str] = set()
    total = repeated = 0
    for ids in rounds:
        for doc_id in ids:
            total += 1
            if doc_id in seen:
                repeated += 1
            seen.add(doc_id)
    gold = set(gold_doc_ids)
    return {
        "searches": float(len(rounds)),
        "retrieved": float(total),
        "repeated_doc_rate": repeated / total if total else 0.0,
        "gold_recall": len(gold & seen) / len(gold) if gold else None,
    }


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, n_resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean.

    Args:
        values: per-example scores (shape [n]).
        confidence: interval mass, e.g. 0.95.
        n_resamples: bootstrap resamples.
        seed: numpy generator seed (same inputs and seed give the same interval).

    Returns:
        (low, high); (nan, nan) for no values, (v, v) for one value.
    """
    import numpy as np

    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence}")
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    chunk = max(1, 2_000_000 // arr.size)
    for start in range(0, n_resamples, chunk):
        stop = min(n_resamples, start + chunk)
        idx = rng.integers(0, arr.size, size=(stop - start, arr.size))
        means[start:stop] = arr[idx].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(low), float(high)


class MetricSummary(BaseModel):
    """Mean of one metric over a dataset with its bootstrap interval."""

    model_config = ConfigDict(frozen=True)

    mean: float = Field(description="Mean over the examples that have the metric.")
    low: float = Field(description="Lower bound of the bootstrap interval.")
    high: float = Field(description="Upper bound of the bootstrap interval.")
    n: int = Field(description="Examples that had a value for this metric.")


class DatasetScores(BaseModel):
    """One row of the results table."""

    model_config = ConfigDict(frozen=True)

    dataset: str = Field(description="Dataset name, or 'ALL' for every example pooled.")
    n: int = Field(description="Examples in the dataset.")
    metrics: dict[str, MetricSummary] = Field(description="Metric name to summary.")


class ScoreTable(BaseModel):
    """Per-dataset results with intervals; ``rows`` in first-seen dataset order, pooled 'ALL' row last."""

    model_config = ConfigDict(frozen=True)

    metric_names: list[str] = Field(description="Column order.")
    rows: list[DatasetScores] = Field(description="One row per dataset (plus 'ALL' when several).")
    confidence: float = Field(default=0.95, description="Interval mass.")

    def as_dict(self) -> dict[str, dict[str, float]]:
        """Flat ``{dataset: {metric: mean}}`` mapping, e.g. for MLflow logging."""
        return {r.dataset: {k: v.mean for k, v in r.metrics.items()} for r in self.rows}

    @property
    def pooled(self) -> DatasetScores:
        """The pooled row: 'ALL' when there are several datasets, else the only one.

        Raises:
            ValueError: for a table with no row (no example was scored).
        """
        if not self.rows:
            raise ValueError("the score table has no row: no example was scored (check the benchmarks and limits)")
        return self.rows[-1]

    def row(self, dataset: str) -> DatasetScores:
        """The row of ``dataset``.

        Raises:
            KeyError: naming the datasets there are.
        """
        for r in self.rows:
            if r.dataset == dataset:
                return r
        raise KeyError(f"no row {dataset!r}; rows: {[r.dataset for r in self.rows]}")

    def flat(self) -> dict[str, float]:
        """``{dataset/metric: mean, dataset/metric_low, dataset/metric_high, dataset/n}`` for MLflow."""
        out: dict[str, float] = {}
        for r in self.rows:
            out[f"{r.dataset}/n"] = float(r.n)
            for k, v in r.metrics.items():
                out |= {f"{r.dataset}/{k}": v.mean, f"{r.dataset}/{k}_low": v.low, f"{r.dataset}/{k}_high": v.high}
        return out


def _summaries(examples: list[Mapping], names: Sequence[str], confidence: float, n_resamples: int, seed: int) -> dict:
    out = {}
    for name in names:
        vals = [float(e[name]) for e in examples if e.get(name) is not None]
        if not vals:
            continue
        low, high = bootstrap_ci(vals, confidence, n_resamples, seed)
        out[name] = MetricSummary(mean=sum(vals) / len(vals), low=low, high=high, n=len(vals))
    return out


def aggregate(
    examples: Sequence[Mapping],
    metric_names: Sequence[str] | None = None,
    dataset_key: str = "dataset",
    confidence: float = 0.95,
    n_resamples: int = 1000,
    seed: int = 0,
) -> ScoreTable:
    """Build the per-dataset table from per-example metric dicts.

    Args:
        examples: one mapping per example holding ``dataset_key`` and metric values (``None`` = not applicable).
        metric_names: columns; default: :data:`ANSWER_METRICS` then any other numeric keys, in first-seen order.
        dataset_key: key naming the dataset of each example (missing -> ``"default"``).
        confidence, n_resamples, seed: bootstrap settings.
    """
    if metric_names is None:
        seen: dict[str, None] = {m: None for m in ANSWER_METRICS}
        for e in examples:
            for k, v in e.items():
                if k != dataset_key and isinstance(v, (int, float)) and not isinstance(v, bool):
                    seen.setdefault(k, None)
        metric_names = [m for m in seen if any(e.get(m) is not None for e in examples)]
    groups: dict[str, list[Mapping]] = defaultdict(list)
    for e in examples:
        groups[str(e.get(dataset_key) or "default")].append(e)
    if len(groups) > 1:
        groups["ALL"] = list(examples)
    boot = (confidence, n_resamples, seed)
    rows = [
        DatasetScores(dataset=name, n=len(group), metrics=_summaries(group, metric_names, *boot))
        for name, group in groups.items()
    ]
    return ScoreTable(metric_names=list(metric_names), rows=rows, confidence=confidence)
