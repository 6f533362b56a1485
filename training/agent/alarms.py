"""Training-health alarms for search agents: search collapse, answers copied from the question, answer collapse.

Pure logic over what a run records (no torch, no mlflow), shared by the RL health monitor
(``training.rl.health``, per training step from the rollouts) and the learning report
(``training.agent.heldout.report_learning``, from held-out rows and the learning curve), so EM and RL evidence
folders are judged by the same rules:

- ``search_collapse``: mean searches per trajectory fell under ``search_collapse_ratio`` x the start. In training
  the start is the mean of the first ``search_baseline_steps`` steps and the current value the mean over the last
  ``window`` steps; on held-out rows the start is the start policy's mean and the current value the final
  policy's; on a held-out curve the start is its first point.
- ``copied_answers``: the share of answers copied from the question (:func:`copied_from_question`: the normalized
  answer is a substring of the normalized question starting at a word and is not a gold answer, e.g. "Which
  country Jakobea Of Baden's mother is from?" -> "Jakobea Of Baden") above ``max_copied_share`` (training: mean
  over the window's steps; held-out: the final rows).
- ``answer_collapse``: one normalized answer string is the answer to more than ``max_answer_share`` of the
  questions (training: each question's most common answer over the window's rollouts, once at least
  ``min_answer_questions`` distinct questions were seen; held-out: the final rows). Empty answers do not count
  as a string (format failures have their own check).

:func:`evidence_alarms` re-checks a committed evidence folder (``heldout_start.jsonl``, ``heldout_final.jsonl``,
``curve.jsonl``); ``python -m training.rl.health <folder>...`` prints its table.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from evaluation.metrics import copied_from_question as copied_from_question  # re-exported
from evaluation.metrics import normalize_answer
from infra.config import StrictModel
from training.agent.config import AlarmConfig, AlarmName


class Alarm(StrictModel):
    """One alarm that fired."""

    name: AlarmName = Field(description="Which alarm.")
    where: str = Field(description="What it was computed on: training, heldout_final, heldout_curve.")
    step: float | None = Field(default=None, description="Training step where it fired (None: held-out rows).")
    value: float = Field(description="The measured value (searches, share of copied answers, top answer share).")
    threshold: float = Field(description="The limit it crossed (for search_collapse: ratio x start).")
    message: str = Field(description="A sentence a person can act on.")


class AnswerObs(StrictModel):
    """One rollout's answer, as the answer alarms need it."""

    question_id: str = Field(description="Question id (groups a question's rollouts).")
    question: str = Field(description="Question text.")
    answer: str | None = Field(default=None, description="Final answer (None/empty: no answer).")
    golden_answers: list[str] = Field(default_factory=list, description="Gold answers (a copied gold is fine).")


def copied_share(items: Sequence[AnswerObs]) -> float:
    """Share of ``items`` whose answer is copied from the question (0 when empty)."""
    if not items:
        return 0.0
    return sum(copied_from_question(i.question, i.answer, i.golden_answers) for i in items) / len(items)


def top_answer(items: Sequence[AnswerObs]) -> tuple[str, int, int]:
    """The most common normalized answer over the distinct questions of ``items`` (each question's most common
    non-empty answer counts once), how many questions gave it, and the number of distinct questions."""
    per_q: dict[str, Counter[str]] = {}
    for i in items:
        c = per_q.setdefault(i.question_id, Counter())
        a = normalize_answer(i.answer or "")
        if a:
            c[a] += 1
    majority = Counter(c.most_common(1)[0][0] for c in per_q.values() if c)
    if not majority:
        return "", 0, len(per_q)
    answer, count = majority.most_common(1)[0]
    return answer, count, len(per_q)


def _search_alarm(start: float, current: float, cfg: AlarmConfig, where: str, step: float | None,
                  what: str) -> Alarm | None:
    ratio = cfg.search_collapse_ratio
    if ratio is None or not (math.isfinite(start) and math.isfinite(current)) or start <= 0:
        return None
    if current >= ratio * start:
        return None
    return Alarm(name="search_collapse", where=where, step=step, value=current, threshold=ratio * start,
                 message=f"search collapse ({where}): {what} {current:.3g} searches per trajectory, under "
                         f"{ratio} x the start {start:.3g}; the agent stopped searching (reward it for evidence, "
                         "lower the learning rate or start from a policy that searches)")


def _copy_alarm(share: float, n: int, cfg: AlarmConfig, where: str, step: float | None) -> Alarm | None:
    if cfg.max_copied_share is None or share <= cfg.max_copied_share:
        return None
    return Alarm(name="copied_answers", where=where, step=step, value=share, threshold=cfg.max_copied_share,
                 message=f"answers copied from the question ({where}): {share:.0%} of {f'{n} ' if n else 'the '}"
                         f"answers are a span of the question (limit {cfg.max_copied_share:.0%}); the reward pays "
                         "for a well-formed guess without evidence")


def _collapse_alarm(answer: str, count: int, n_questions: int, cfg: AlarmConfig, where: str,
                    step: float | None) -> Alarm | None:
    if cfg.max_answer_share is None or not n_questions:
        return None
    share = count / n_questions
    if share <= cfg.max_answer_share:
        return None
    return Alarm(name="answer_collapse", where=where, step=step, value=share, threshold=cfg.max_answer_share,
                 message=f"answer collapse ({where}): {answer!r} answers {count} of {n_questions} questions "
                         f"({share:.0%}, limit {cfg.max_answer_share:.0%}); the policy found one answer the reward "
                         "sometimes pays for")


def window_alarms(cfg: AlarmConfig, step: float, searches: Sequence[float], copied: Sequence[float],
                  answers: Sequence[AnswerObs], window: int) -> list[Alarm]:
    """Alarms of a training step.

    Args:
        cfg: thresholds.
        step: the training step.
        searches: every step's mean searches per trajectory so far, oldest first (the start is the first
            ``search_baseline_steps``; the current value the mean of the last ``window``).
        copied: the last steps' shares of copied answers (judged once ``window`` are there).
        answers: the window's rollouts (answer collapse needs ``min_answer_questions`` distinct questions).
        window: steps a condition is averaged over.
    """
    out: list[Alarm] = []
    b = cfg.search_baseline_steps
    if len(searches) >= max(window, b + 1):
        start = sum(searches[:b]) / b
        last = list(searches)[-window:]
        a = _search_alarm(start, sum(last) / len(last), cfg, "training", step, f"last {window} steps' mean")
        out += [a] if a else []
    if len(copied) >= window:
        last = list(copied)[-window:]
        a = _copy_alarm(sum(last) / len(last), len(answers), cfg, "training", step)
        out += [a] if a else []
    answer, count, n_q = top_answer(answers)
    if n_q >= cfg.min_answer_questions:
        a = _collapse_alarm(answer, count, n_q, cfg, "training", step)
        out += [a] if a else []
    return out


def row_obs(rows: Iterable[Mapping[str, Any]]) -> list[AnswerObs]:
    """:class:`AnswerObs` of held-out evidence rows (``id``, ``question``, ``pred``, ``golden_answers``)."""
    return [AnswerObs(question_id=str(r["id"]), question=str(r["question"]), answer=r.get("pred"),
                      golden_answers=[str(g) for g in r.get("golden_answers") or []]) for r in rows]


def _mean(rows: Sequence[Mapping[str, Any]], key: str) -> float:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else math.nan


def answer_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``copied_answer_rate`` and ``top_answer_share`` of held-out rows (for curves and summaries)."""
    obs = row_obs(rows)
    _, count, n_q = top_answer(obs)
    return {"copied_answer_rate": copied_share(obs), "top_answer_share": count / n_q if n_q else 0.0}


def heldout_alarms(cfg: AlarmConfig, final_rows: Sequence[Mapping[str, Any]],
                   start_rows: Sequence[Mapping[str, Any]] = (), where: str = "heldout_final") -> list[Alarm]:
    """Alarms of the final policy's held-out rows (search collapse against ``start_rows`` when given)."""
    out: list[Alarm] = []
    if start_rows:
        a = _search_alarm(_mean(start_rows, "n_searches"), _mean(final_rows, "n_searches"), cfg, where, None,
                          "final policy's mean")
        out += [a] if a else []
    obs = row_obs(final_rows)
    a = _copy_alarm(copied_share(obs), len(obs), cfg, where, None)
    out += [a] if a else []
    a = _collapse_alarm(*top_answer(obs), cfg, where, None)
    return out + ([a] if a else [])


def curve_alarms(cfg: AlarmConfig, curve: Sequence[Mapping[str, Any]], window: int, x: str = "step") -> list[Alarm]:
    """Alarms of a learning curve: the training series (``searches_per_traj``, ``copied_answer_rate``, replayed
    step by step as in training; first firing of each) and the held-out curve points (``heldout_n_searches``
    against the first point, ``heldout_copied_answer_rate``, ``heldout_top_answer_share``)."""
    out: dict[str, Alarm] = {}
    searches: list[float] = []
    copied: list[float] = []
    for r in curve:
        if r.get("searches_per_traj") is not None:
            searches.append(float(r["searches_per_traj"]))
        if r.get("copied_answer_rate") is not None:
            copied.append(float(r["copied_answer_rate"]))
        if r.get("searches_per_traj") is None and r.get("copied_answer_rate") is None:
            continue
        for a in window_alarms(cfg, float(r.get(x, len(searches))), searches, copied, (), window):
            out.setdefault(a.name, a)
    key = "heldout_n_searches" if any("heldout_n_searches" in r for r in curve) else "heldout_searches"  # EM's name
    points = [r for r in curve if r.get(key) is not None]
    for r in points[1:]:
        a = _search_alarm(float(points[0][key]), float(r[key]), cfg,
                          "heldout_curve", r.get(x), "held-out curve point")
        if a:
            out.setdefault(f"curve_{a.name}", a)
    for r in curve:
        step = r.get(x)
        if r.get("heldout_copied_answer_rate") is not None:
            a = _copy_alarm(float(r["heldout_copied_answer_rate"]), 0, cfg, "heldout_curve", step)
            if a:
                out.setdefault(f"curve_{a.name}", a)
        if r.get("heldout_top_answer_share") is not None and cfg.max_answer_share is not None:
            share = float(r["heldout_top_answer_share"])
            if share > cfg.max_answer_share:
                out.setdefault("curve_answer_collapse", Alarm(
                    name="answer_collapse", where="heldout_curve", step=step, value=share,
                    threshold=cfg.max_answer_share,
                    message=f"answer collapse (heldout_curve): one answer for {share:.0%} of the curve's questions "
                            f"at step {step} (limit {cfg.max_answer_share:.0%})"))
    return list(out.values())


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def evidence_alarms(folder: str | Path, cfg: AlarmConfig | None = None, window: int = 5) -> list[Alarm]:
    """Every alarm of an evidence folder (``docs/results/learning/<recipe>``): its held-out rows and its curve.

    Raises:
        FileNotFoundError: the folder has no ``heldout_final.jsonl`` (not an evidence folder).
    """
    root = Path(folder)
    final = root / "heldout_final.jsonl"
    if not final.exists():
        raise FileNotFoundError(f"{final} not found: give an evidence folder written by report_learning "
                                "(e.g. docs/results/learning/searchr1_grpo)")
    cfg = cfg or AlarmConfig()
    x = "step"
    curve = _read_jsonl(root / "curve.jsonl")
    if curve and "step" not in curve[0] and "iteration" in curve[0]:
        x = "iteration"
    return (heldout_alarms(cfg, _read_jsonl(final), _read_jsonl(root / "heldout_start.jsonl"))
            + curve_alarms(cfg, curve, window, x=x))


def alarm_tags(alarms: Sequence[Alarm], prefix: str = "health.alarm") -> dict[str, str]:
    """MLflow tags of fired alarms: ``<prefix>.<name>.<where>`` -> the message (with the step)."""
    tags = {}
    for a in alarms:
        at = f"step {a.step:g}: " if a.step is not None else ""
        tags[f"{prefix}.{a.name}.{a.where}"] = (at + a.message)[:4900]
    return tags


def alarms_table(alarms: Sequence[Alarm]) -> str:
    """A markdown table of fired alarms ("no alarm fired" when none)."""
    if not alarms:
        return "Health alarms: none fired."
    lines = ["| alarm | where | step | value | limit |", "|---|---|---|---|---|"]
    for a in alarms:
        step = f"{a.step:g}" if a.step is not None else ""
        lines.append(f"| {a.name} | {a.where} | {step} | {a.value:.3g} | {a.threshold:.3g} |")
    return "\n".join(lines)
