"""Promotion gate and the retrieval metric it uses for scheduled retraining (pure functions, no I/O).

A candidate (a rebuilt index, a retrained checkpoint) replaces the incumbent only when its metric is at least
the incumbent's plus ``min_delta`` (negative = a tolerated regression, e.g. for a fresher index). Every decision
carries a one-line reason that is written to MLflow and to the Prefect flow run.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def recall_at_k(retrieved: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]) -> float:
    """Any-gold recall: fraction of questions (with gold ids) where a gold passage id is retrieved.

    Args:
        retrieved: per question, the retrieved passage ids (already cut at k).
        gold: per question, the gold supporting passage ids; questions without gold are skipped.
    """
    if len(retrieved) != len(gold):
        raise ValueError(f"retrieved has {len(retrieved)} rows but gold has {len(gold)}; pass one row per question")
    scored = [bool(set(r) & set(g)) for r, g in zip(retrieved, gold, strict=True) if g]
    return sum(scored) / len(scored) if scored else 0.0


def load_questions(names: Sequence[str], limit: int | None = None) -> list:
    """Load shipped eval sets by name (``data/eval/<name>.jsonl``) or path; ``limit`` rows from each.

    Returns:
        ``evaluation.benchmarks.Question`` records.
    """
    from pathlib import Path

    from evaluation.benchmarks import Question
    from infra import artifacts
    from infra.errors import DataError
    from infra.settings import get_settings

    out = []
    for name in names:
        path = Path(name) if name.endswith(".jsonl") else get_settings().data_dir / "eval" / f"{name}.jsonl"
        if not path.exists():
            raise DataError(f"eval set {name!r} not found at {path}; use a name from data/eval (e.g. hotpotqa_mini)")
        rows = artifacts.read_jsonl(path)[: limit or None]
        out.extend(Question.model_validate(r) for r in rows)
    return out
