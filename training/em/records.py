"""Typed records the EM-loop stages return (flows read attributes, never string keys).

Each stage directory's ``manifest.json`` keeps the record's fields under ``data`` (a superset of the JSON written
before these types existed, so an experiment started earlier still resumes); :func:`training.em.stages.run_stage`
turns them back into the stage's record.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evaluation.metrics import MetricSummary, ScoreTable
from infra import artifacts
from training.em.selection import SelectionStats


def finite_numbers(value: Any, prefix: str = "") -> dict[str, float]:
    """The finite numbers inside nested dicts, keys joined with dots (lists and strings are skipped)."""
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out |= finite_numbers(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        out[prefix] = float(value)
    return out


class StageRef(BaseModel):
    """A completed stage directory."""

    model_config = ConfigDict(frozen=True)

    step: str = Field(description="Stage name.")
    path: str = Field(description="Stage directory.")

    def numbers(self) -> dict[str, float]:
        """The record's finite numbers, flattened with dots (what the stage's MLflow run logs as metrics)."""
        return finite_numbers(self.model_dump(exclude={"step", "path"}))


class WarmupDataRef(StageRef):
    """Warm-up chats (decompositions + FireAct) and their validator counts."""

    data: str = Field(description="Warm-up chats (jsonl).")
    n: int = Field(description="Valid chats.")
    stats: list[dict[str, Any]] = Field(default_factory=list, description="Validator counts per source.")


class SampleRef(StageRef):
    """E-step samples: K trajectories per training question."""

    trajectories: str = Field(description="Trajectory directory (training.agent.records).")
    n: int = Field(description="Trajectories.")
    finished: int = Field(description="Trajectories that reached an answer.")
    format_ok: int = Field(description="Trajectories that passed the protocol's format check.")
    questions: int = Field(description="Questions sampled.")


class ScoreRef(StageRef):
    """E-step scores: teacher-forced log-likelihood of each finished trajectory with the gold answer in place."""

    scores: str = Field(description="Scores (jsonl).")
    n_scored: int = Field(description="Trajectories scored.")
    unfinished: int = Field(description="Trajectories without an answer turn (not scored).")


class SelectRef(StageRef):
    """E-step selection: the weighted training file and its statistics."""

    train: str = Field(description="Weighted training chats (jsonl, gold answer substituted).")
    n_train: int = Field(description="Training rows.")
    stats: SelectionStats = Field(description="Selection statistics (dropped groups, ESS...).")


class EvalRef(StageRef, ScoreTable):
    """Held-out evaluation of one checkpoint: the loops' one evaluation record, an
    :class:`~evaluation.metrics.ScoreTable` (a row per held-out set, the pooled 'ALL' row last; RL and SmartSearch
    evaluations return the same table) that also names its stage directory.

    The manifest keeps the table's fields plus ``n``, ``table`` and the pooled ``metrics`` (what manifests held
    before the record was a table); a manifest written before then has no rows, and they are read back from its
    ``table`` file, so an experiment started earlier still resumes.
    """

    n: int = Field(description="Questions evaluated.")
    table: str = Field(description="Per-dataset table (json; the same table as this record).")

    @model_validator(mode="before")
    @classmethod
    def _rows_from_table_file(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "rows" in data or "table" not in data:
            return data
        path = Path(str(data["table"]))
        if not path.is_file():
            raise ValueError(f"evaluation record at {data.get('path')!r} has no rows and its table file {path} is "
                             "missing: delete that stage directory to evaluate the checkpoint again")
        return {**artifacts.read_json(path), **data}

    @property
    def metrics(self) -> dict[str, MetricSummary]:
        """Pooled em, f1, acc, format_ok, searches...: mean and bootstrap interval."""
        return self.pooled.metrics

    @property
    def f1(self) -> MetricSummary:
        """Held-out F1 (mean and bootstrap interval)."""
        return self.metrics["f1"]

    @property
    def em(self) -> MetricSummary:
        """Held-out exact match (mean and bootstrap interval)."""
        return self.metrics["em"]

    def numbers(self) -> dict[str, float]:
        """``n``, the pooled ``metrics.<name>.<mean|low|high|n>`` (the names logged before) and ``flat()``."""
        pooled = {k: v.model_dump() for k, v in self.metrics.items()}
        return finite_numbers({"n": self.n, "metrics": pooled}) | finite_numbers(self.flat())


class Promotion(BaseModel):
    """A checkpoint registered as a model version, and whether ``champion`` moved to it."""

    model_config = ConfigDict(frozen=True)

    version: str = Field(description="Registered model version of the checkpoint.")
    promoted: bool = Field(description="Whether `champion` points at this version now.")
    champion: str = Field(description="The champion version after this step.")


class HeldoutRef(StageRef):
    """Greedy held-out evaluation of one checkpoint for the learning report (``training.em.learning``)."""

    rows: str = Field(description="Per-question rows (jsonl).")
    n: int = Field(description="Questions evaluated.")
    means: dict[str, float] = Field(description="Mean of each per-question number (reward, f1, em, format_ok...).")
    model: str = Field(description="The checkpoint evaluated.")


class IterationResult(BaseModel):
    """What one EM iteration produced (iteration 0 is the warm-up)."""

    model_config = ConfigDict(frozen=True)

    iteration: int = Field(description="Iteration number (0 = warm-up).")
    checkpoint: str = Field(description="Checkpoint folder.")
    f1: MetricSummary = Field(description="Held-out F1: mean and bootstrap interval.")
    em: MetricSummary = Field(description="Held-out exact match: mean and bootstrap interval.")
    version: str = Field(description="Registered model version.")
    promoted: bool = Field(description="Whether `champion` moved to this version.")
    selection: SelectionStats | None = Field(default=None, description="E-step selection statistics (None: warm-up).")
    curve: dict[str, float] = Field(default_factory=dict, description="Learning-curve point (held-out, sampling, "
                                                                      "selection); see training.em.learning.curve_row.")
    heldout: HeldoutRef | None = Field(default=None, description="Held-out learning evaluation, when run.")

    @classmethod
    def of(cls, iteration: int, checkpoint: str, ev: EvalRef, promo: Promotion, selected: SelectRef | None = None,
           curve: dict[str, float] | None = None, heldout: HeldoutRef | None = None) -> IterationResult:
        """The result of an iteration from its stage records."""
        return cls(iteration=iteration, checkpoint=checkpoint, f1=ev.f1, em=ev.em, version=promo.version,
                   promoted=promo.promoted, selection=selected.stats if selected is not None else None,
                   curve=curve or {}, heldout=heldout)

    def run_metrics(self) -> dict[str, float]:
        """What the iteration's MLflow run records when it closes."""
        out = {"heldout_f1": self.f1.mean, "heldout_f1_low": self.f1.low, "heldout_f1_high": self.f1.high,
               "promoted": float(self.promoted)}
        if self.selection is not None:
            out["n_train"] = float(self.selection.n_selected)
        if self.heldout is not None:
            out.update({f"learning_{k}": v for k, v in self.heldout.means.items()})
        return out

