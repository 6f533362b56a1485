"""Learning evidence shared by every training recipe: the held-out question set, a greedy per-question evaluation of
a checkpoint, the start-vs-final report with paired bootstrap intervals, learning-curve plots and the evidence folder.

- ``build_heldout``: dev questions *beyond the minis* (rows ``skip`` .. ``skip + per_file`` of each
  ``*_dev.jsonl``; their paragraphs are in ``corpus/multihop_wiki``). No training stage reads these files' rows, and
  ``check_disjoint`` asserts it against the ids every stage trained on (written to ``train_ids.txt``).
- ``evaluate_heldout``: greedy rollouts (n = 1, temperature 0) of one checkpoint, one row per question:
  ``id``, ``question``, ``golden_answers``, ``pred``, ``reward`` (the recipe's own signal, from ``reward_fn``),
  ``format_ok``, ``n_searches``, ``answer_retrieved`` (1 when a document any search returned holds a gold answer,
  whole words after SQuAD normalisation: what the searches found, apart from what the policy read from it) plus
  ``f1``, ``em``, ``cover_em``, ``dataset``, ``finish_reason``.
- ``learning_summary``: paired bootstrap of final - start for every per-question field (``evaluation.paired``).
- ``plot_learning_curves`` / ``plot_paired``: PNGs a person can read (bounded metrics on fixed [0, 1] axes).
- ``learning_alarms``: the training-health alarms (``training.agent.alarms``: search collapse, answers copied from
  the question, answer collapse) of the final rows and the curve, plus those the training run raised itself; they
  go into ``summary.json`` (``alarms``), ``summary.md`` and MLflow tags ``health.alarm.<name>.<where>``.
- ``write_evidence``: ``heldout_start.jsonl``, ``heldout_final.jsonl``, ``train_ids.txt``, ``summary.json``,
  ``curve.jsonl`` and the plots in one folder (``docs/results/learning/<recipe>/`` for committed evidence).

Library code: no prefect; matplotlib and numpy are imported inside functions.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evaluation.benchmarks import Question, load_benchmark
from evaluation.metrics import answer_metrics, contains_answer
from infra import artifacts
from infra.errors import ConfigError, DataError
from training.agent.alarms import Alarm, AlarmConfig, alarms_table, curve_alarms, heldout_alarms
from training.agent.config import HeldoutSpec, RolloutConfig
from training.agent.records import Trajectory
from training.agent.rollout import run_rollouts

log = logging.getLogger(__name__)

HELDOUT_FIELDS = ("reward", "f1", "em", "cover_em", "format_ok", "n_searches", "answer_retrieved")
BOUNDED = {"f1", "em", "cover_em", "format_ok", "answer_retrieved", "heldout_f1", "heldout_em", "heldout_format_ok",
           "heldout_answer_retrieved", "format_ok_rate"}
RewardFn = Callable[[list[Trajectory]], list[float]]


def build_heldout(spec: HeldoutSpec) -> list[Question]:
    """The held-out questions: rows ``skip`` .. ``skip + per_file`` of each file, in file order.

    Raises:
        DataError: fewer than ``min_questions`` questions, or duplicate ids.
    """
    out: list[Question] = []
    for name in spec.files:
        out += load_benchmark(name, limit=spec.skip + spec.per_file)[spec.skip:]
    ids = [q.id for q in out]
    if len(set(ids)) != len(ids):
        raise DataError("held-out set has duplicate question ids; list each benchmark once")
    if len(out) < spec.min_questions:
        raise DataError(f"held-out set has {len(out)} questions, fewer than min_questions={spec.min_questions}; "
                        "raise per_file or add files")
    return out


def check_disjoint(train_ids: Iterable[str], heldout: Sequence[Question]) -> None:
    """Raise unless no held-out question id (or question text) was used for training.

    Raises:
        DataError: naming up to five overlapping ids.
    """
    train = set(train_ids)
    overlap = sorted({q.id for q in heldout} & train)
    if overlap:
        raise DataError(f"{len(overlap)} held-out questions were used for training (e.g. {overlap[:5]}); the held-out "
                        "set must be disjoint from every training stage")


def write_train_ids(ids: Iterable[str], path: str | Path) -> list[str]:
    """Write the sorted unique training ids, one per line; return them."""
    uniq = sorted(set(ids))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(f"{i}\n" for i in uniq))
    return uniq


def heldout_row(traj: Trajectory, reward: float) -> dict[str, Any]:
    """The evidence row of one greedy trajectory."""
    m = answer_metrics(traj.final_answer, traj.golden_answers)
    docs = [text for turn in traj.turns for text in turn.doc_texts]
    return {"id": traj.question_id, "question": traj.question, "golden_answers": list(traj.golden_answers),
            "pred": traj.final_answer, "reward": float(reward), "format_ok": bool(traj.format_ok),
            "n_searches": traj.n_searches,
            "answer_retrieved": float(contains_answer(docs, traj.golden_answers) is not None),
            "f1": m["f1"], "em": m["em"], "cover_em": m["acc"],
            "dataset": traj.dataset, "finish_reason": traj.finish_reason}


def evaluate_heldout(
    questions: Sequence[Question], protocol: str, generator: Any, searcher: Any, rollout: RolloutConfig,
    reward_fn: RewardFn, out_path: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Greedy evaluation of the generator's checkpoint on the held-out questions, one row per question.

    Args:
        questions: the held-out set (``build_heldout``).
        protocol: the recipe's protocol name.
        generator: any ``Generator`` holding the checkpoint.
        searcher: the retriever (its corpus must hold the held-out paragraphs).
        rollout: rollout limits; must be greedy (temperature 0), ``n`` is forced to 1.
        reward_fn: the recipe's own per-question signal for the greedy trajectories (same order).
        out_path: when given, the rows are written there as JSON lines.

    Raises:
        ConfigError: a sampling temperature (the start and final evaluations must both be greedy).
    """
    if rollout.temperature != 0:
        raise ConfigError(f"held-out evaluation must be greedy (temperature 0), got {rollout.temperature}")
    trajs = run_rollouts(list(questions), protocol, generator, searcher, rollout.model_copy(update={"n": 1}))
    rewards = reward_fn(trajs)
    if len(rewards) != len(trajs):
        raise ConfigError(f"reward_fn returned {len(rewards)} values for {len(trajs)} trajectories")
    rows = [heldout_row(t, r) for t, r in zip(trajs, rewards, strict=True)]
    if out_path is not None:
        artifacts.write_jsonl(Path(out_path), rows)
    return rows


def means(rows: Sequence[dict[str, Any]], fields: Sequence[str] = HELDOUT_FIELDS) -> dict[str, float]:
    """Mean of each field over rows with a finite value (NaN when none)."""
    out = {}
    for f in fields:
        vals = [float(r[f]) for r in rows if r.get(f) is not None and math.isfinite(float(r[f]))]
        out[f] = sum(vals) / len(vals) if vals else math.nan
    return out


def learning_summary(
    recipe: str, start_rows: Sequence[dict[str, Any]], final_rows: Sequence[dict[str, Any]],
    fields: Sequence[str] = HELDOUT_FIELDS, confidence: float = 0.95, n_resamples: int = 10000,
    **extra: Any,
) -> dict[str, Any]:
    """The ``summary.json`` content: paired final - start differences per field held by every row (rows written
    before a field existed leave it out), and ``extra`` (run ids, wall times, checkpoints, settings)."""
    from evaluation.paired import paired_rows

    fields = [f for f in fields if all(f in r for r in (*start_rows, *final_rows))]
    diffs = paired_rows(start_rows, final_rows, fields, confidence=confidence, n_resamples=n_resamples)
    return {"recipe": recipe, "n_heldout": len(start_rows), "confidence": confidence, "n_resamples": n_resamples,
            "paired": {f: d.model_dump() for f, d in diffs.items()},
            "improved": {f: d.low > 0 for f, d in diffs.items()}, **extra}


def summary_table(summary: dict[str, Any]) -> str:
    """A markdown before/after table of a summary (mean start, mean final, difference and its interval), followed
    by its health alarms when the summary has them."""
    pct = int(round(100 * summary["confidence"]))
    lines = [f"| field | start | final | final - start | {pct}% paired CI |", "|---|---|---|---|---|"]
    for f, d in summary["paired"].items():
        lines.append(f"| {f} | {d['start']:.4f} | {d['final']:.4f} | {d['diff']:+.4f} | "
                     f"[{d['low']:+.4f}, {d['high']:+.4f}] |")
    if "alarms" in summary:
        alarms = [Alarm(**a) for a in summary["alarms"]]
        lines += ["", alarms_table(alarms)] + [f"- {a.message}" + (f" (step {a.step:g})" if a.step is not None
                                                                     else "") for a in alarms]
    return "\n".join(lines)


def learning_alarms(
    start_rows: Sequence[dict[str, Any]], final_rows: Sequence[dict[str, Any]], curve: Sequence[dict[str, Any]] = (),
    x: str = "step", cfg: AlarmConfig | None = None, window: int = 5, training: Sequence[Alarm] = (),
) -> list[Alarm]:
    """The alarms of a learning report: ``training`` ones (raised live by the health monitor) first, then the
    final held-out rows' (against the start's searches) and the curve's, one per alarm name and place."""
    cfg = cfg or AlarmConfig()
    out = list(training)
    seen = {(a.name, a.where) for a in out}
    for a in heldout_alarms(cfg, final_rows, start_rows) + curve_alarms(cfg, curve, window, x=x):
        if (a.name, a.where) not in seen:
            seen.add((a.name, a.where))
            out.append(a)
    return out


def _ylim(name: str, values: list[float]) -> tuple[float, float]:
    if name in BOUNDED or name.endswith(("_rate", "format_ok", "_f1", "_em")):
        return 0.0, 1.0
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    lo, hi = min(finite), max(finite)
    pad = 0.1 * (hi - lo) if hi > lo else max(0.1, 0.1 * abs(hi))
    return lo - pad, hi + pad


def plot_learning_curves(curve: Sequence[dict[str, Any]], path: str | Path, x: str = "step",
                         title: str = "") -> Path | None:
    """One panel per numeric metric of ``curve`` (rows keyed by ``x``); bounded metrics on [0, 1].

    Returns:
        The PNG path, or None when the curve has no metric to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({k for r in curve for k, v in r.items()
                    if k != x and isinstance(v, int | float) and not isinstance(v, bool)})
    if not curve or not names:
        return None
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        pts = [(r[x], float(r[name])) for r in curve if r.get(name) is not None and x in r]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, marker="o", linewidth=1.5)
        ax.set_title(name)
        ax.set_xlabel(x)
        ax.set_ylim(*_ylim(name, ys))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _save(fig: Any, path: str | Path) -> Path:
    """Lay out, write (parents created) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_paired(summary: dict[str, Any], path: str | Path) -> Path:
    """Start vs final means per field with the paired interval of the difference (one row per field)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = list(summary["paired"].items())
    fig, axes = plt.subplots(1, len(items), figsize=(2.6 * len(items), 3.4), squeeze=False)
    for ax, (name, d) in zip(axes.flat, items, strict=True):
        ax.bar([0, 1], [d["start"], d["final"]], color=["#999999", "#1f77b4"], width=0.6)
        ax.errorbar([1], [d["final"]], yerr=[[d["diff"] - d["low"]], [d["high"] - d["diff"]]], fmt="none",
                    ecolor="black", capsize=4)
        ax.set_xticks([0, 1], ["start", "final"])
        verdict = "CI > 0" if d["low"] > 0 else ("CI < 0" if d["high"] < 0 else "CI spans 0")
        ax.set_title(f"{name}\n{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]\n{verdict}", fontsize=8)
        vals = [d["start"], d["final"], d["final"] + (d["high"] - d["diff"]), d["final"] - (d["diff"] - d["low"])]
        lo, hi = _ylim(name, vals)
        ax.set_ylim(min(lo, 0.0), hi if name in BOUNDED else max(hi, 0.0))
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{summary['recipe']}: held-out start vs final (n={summary['n_heldout']}; error bar = paired "
                 f"{int(round(100 * summary['confidence']))}% CI of the difference)", fontsize=9)
    return _save(fig, path)


def write_evidence(
    out_dir: str | Path, start_rows: Sequence[dict[str, Any]], final_rows: Sequence[dict[str, Any]],
    train_ids: Iterable[str], summary: dict[str, Any], curve: Sequence[dict[str, Any]] = (), x: str = "step",
) -> list[Path]:
    """Write the evidence folder; return the files written.

    Files: ``heldout_start.jsonl``, ``heldout_final.jsonl``, ``train_ids.txt``, ``summary.json``, ``summary.md``,
    ``curve.jsonl`` and the plots ``learning_curves.png`` (when ``curve`` has metrics) and ``heldout_paired.png``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    artifacts.write_jsonl(out / "heldout_start.jsonl", list(start_rows))
    artifacts.write_jsonl(out / "heldout_final.jsonl", list(final_rows))
    ids = write_train_ids(train_ids, out / "train_ids.txt")
    check_disjoint(ids, [Question(id=str(r["id"]), question=str(r["question"])) for r in start_rows])
    artifacts.write_json(out / "summary.json", summary)
    (out / "summary.md").write_text(summary_table(summary) + "\n")
    artifacts.write_jsonl(out / "curve.jsonl", list(curve))
    files = [out / n for n in ("heldout_start.jsonl", "heldout_final.jsonl", "train_ids.txt", "summary.json",
                               "summary.md", "curve.jsonl")]
    png = plot_learning_curves(curve, out / "learning_curves.png", x=x, title=summary["recipe"])
    files += [p for p in (png, plot_paired(summary, out / "heldout_paired.png")) if p is not None]
    return files


def report_learning(
    recipe: str, start_rows: Sequence[dict[str, Any]], final_rows: Sequence[dict[str, Any]],
    train_ids: Iterable[str], out_dir: str | Path, curve: Sequence[dict[str, Any]] = (), x: str = "step",
    evidence_dir: str | Path | None = None, mlflow_run_id: str | None = None, confidence: float = 0.95,
    n_resamples: int = 10000, alarm_config: AlarmConfig | None = None, alarm_window: int = 5,
    training_alarms: Sequence[Alarm] = (), groups: Mapping[str, str] | None = None, **extra: Any,
) -> dict[str, Any]:
    """The whole learning report of a recipe: summary (paired intervals), evidence files, plots, MLflow artifacts.

    Writes the evidence folder to ``out_dir`` and, when given, copies it to ``evidence_dir`` (e.g.
    ``docs/results/learning/<recipe>``); logs every file under ``learning/`` of ``mlflow_run_id`` and the paired
    numbers as metrics (``heldout_<field>_start|final|diff|low|high``). The health alarms (:func:`learning_alarms`
    with ``alarm_config``, default thresholds when None, ``alarm_window`` training steps, plus ``training_alarms``)
    go into the summary's ``alarms`` and the run's tags ``health.alarm.<name>.<where>``. With ``groups`` (question
    id -> group, from :func:`evaluation.criteria.question_groups`), ``by_group.md`` splits the F1 change by group
    (:func:`evaluation.criteria.row_group_changes`), so a mean that hides a trade between question types is seen in
    the evidence itself. Returns the summary.
    """
    import shutil

    from training.agent.alarms import alarm_tags

    alarms = learning_alarms(start_rows, final_rows, curve, x=x, cfg=alarm_config, window=alarm_window,
                             training=training_alarms)
    summary = learning_summary(recipe, start_rows, final_rows, confidence=confidence, n_resamples=n_resamples,
                               mlflow_run_id=mlflow_run_id, alarms=[a.model_dump() for a in alarms], **extra)
    files = write_evidence(out_dir, start_rows, final_rows, train_ids, summary, curve, x=x)
    if groups:
        from evaluation.criteria import group_table, row_group_changes

        changes = row_group_changes(start_rows, final_rows, groups, n_resamples=n_resamples)
        by_group = Path(out_dir) / "by_group.md"
        by_group.write_text(group_table(recipe, changes) + "\n")
        files.append(by_group)
        log.info("%s F1 change by group:\n%s", recipe, group_table(recipe, changes))
    if evidence_dir is not None:
        dest = Path(evidence_dir)
        dest.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy2(f, dest / f.name)
    if mlflow_run_id:
        from infra.tracking import log_artifact, log_metrics, set_tags

        for f in files:
            log_artifact(f, artifact_path="learning", run_id=mlflow_run_id)
        log_metrics({f"heldout_{field}_{k}": d[k] for field, d in summary["paired"].items()
                     for k in ("start", "final", "diff", "low", "high")}, run_id=mlflow_run_id)
        set_tags(alarm_tags(alarms), run_id=mlflow_run_id)
    for a in alarms:
        log.warning("%s health alarm: %s", recipe, a.message)
    log.info("%s learning report:\n%s", recipe, summary_table(summary))
    return summary
