"""Promotion gate and the retrieval metric it uses for scheduled retraining (pure functions, no I/O).

A candidate (a rebuilt index, a retrained checkpoint) replaces the incumbent only when its metric is at least
the incumbent's plus ``min_delta`` (negative = a tolerated regression, e.g. for a fresher index). Every decision
carries a one-line reason that is written to MLflow and to the Prefect flow run.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from infra.config import StrictModel


class GateDecision(StrictModel):
    """Outcome of the promotion gate."""

    promote: bool = Field(description="True when the candidate should replace the incumbent.")
    metric: str = Field(description="Metric the gate compared (higher is better).")
    candidate: float = Field(description="Candidate's metric value.")
    incumbent: float | None = Field(default=None, description="Incumbent's value (None when there is none).")
    min_delta: float = Field(description="Required improvement (negative: tolerated regression).")
    reason: str = Field(description="Why, in one line.")


def decide_promotion(metric: str, candidate: float, incumbent: float | None, min_delta: float = 0.0) -> GateDecision:
    """Promote when there is no incumbent or ``candidate >= incumbent + min_delta``."""
    if incumbent is None:
        return GateDecision(promote=True, metric=metric, candidate=candidate, incumbent=None, min_delta=min_delta,
                            reason=f"no incumbent yet; promoting candidate with {metric}={candidate:.4f}")
    delta = candidate - incumbent
    ok = delta >= min_delta
    verb = "passes" if ok else "fails"
    return GateDecision(
        promote=ok, metric=metric, candidate=candidate, incumbent=incumbent, min_delta=min_delta,
        reason=f"{metric}: candidate {candidate:.4f} vs incumbent {incumbent:.4f} (delta {delta:+.4f}) "
        f"{verb} the gate (required delta >= {min_delta:+.4f})",
    )



def recall_gate_value(report: Any, k: int) -> float:
    """Gate metric of a ``retrieval.recall.RecallReport``: mean any-gold recall@k over the scored datasets.

    Raises:
        ValueError: when ``k`` was not evaluated or no dataset had gold passages.
    """
    scored = [d for d in report.datasets if d.n]
    if k not in report.ks or not scored:
        raise ValueError(f"recall@{k} not available (ks={report.ks}, scored datasets={len(scored)}); "
                         f"add {k} to evaluation.ks and use eval files with supporting_doc_ids")
    return sum(d.any_gold[k] for d in scored) / len(scored)
