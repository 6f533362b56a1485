"""Training-health monitors: per-step reward, format failures, searches, length, entropy/KL; stop on NaN or collapse;
alarms for search collapse, answers copied from the question and answer collapse (``training.agent.alarms``).

:class:`HealthMonitor` is pure logic over a stream of metric dicts (one per logging step) so it is testable with
synthetic streams. :func:`health_callback` wraps it in a transformers ``TrainerCallback`` that logs the monitored
metrics to MLflow each step, stops training with a clear message when a check fails, and blocks any checkpoint save
after the failure so the last *good* checkpoint is the newest one on disk.

Metric names are read from TRL's GRPO logs (``reward``, ``entropy``, ``kl``, ``completions/mean_length``) and the
search trainer's additions (``search/format_failure_rate``, ``search/searches_per_traj``); verl's names map through
``ALIASES``.

Alarms (:class:`HealthConfig` inherits their thresholds from ``training.agent.alarms.AlarmConfig``) warn by default:
the callback logs each first firing, sets the MLflow tag ``health.alarm.<name>.training`` and keeps it in
``alarms``; an alarm listed in ``health.stop_on`` stops training at its step like a failed check. The trainer feeds
each step's rollouts to the callback's ``on_rollouts`` (question, answer, gold) for the two answer alarms.

``python -m training.rl.health docs/results/learning/<recipe> ...`` re-checks committed evidence folders and prints
which alarms fire (:func:`main`).
"""

from __future__ import annotations

import logging
import math
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from infra.config import StrictModel
from infra.errors import StoppedError
from training.agent.alarms import Alarm, AnswerObs, copied_share, evidence_alarms, window_alarms
from training.agent.config import AlarmConfig
from training.rl.config import HealthConfig

log = logging.getLogger(__name__)

# our name -> accepted source names (TRL first, then verl)
ALIASES: dict[str, tuple[str, ...]] = {
    "reward": ("reward", "critic/score/mean", "critic/rewards/mean"),
    "format_failure_rate": ("search/format_failure_rate",),
    "searches_per_traj": ("search/searches_per_traj",),
    "response_length": ("completions/mean_length", "response_length/mean"),
    "entropy": ("entropy", "actor/entropy"),
    "kl": ("kl", "actor/kl_loss"),
    "loss": ("loss", "actor/pg_loss"),
    "grad_norm": ("grad_norm", "actor/grad_norm"),
    "copied_answer_rate": ("search/copied_answer_rate",),
    "top_answer_share": ("search/top_answer_share",),
    # dynamic sampling (TRLSearchConfig.resample_flat_groups): share of the step's drawn groups without a reward
    # spread, and how many were replaced; with it on, "reward" is the trained groups' reward, not the drawn ones'
    "flat_groups": ("search/flat_groups",),
    "replaced_groups": ("search/replaced_groups",),
}


class TrainingHealthError(StoppedError):
    """Training was stopped by a health check; the message names the metric, the step and the kept checkpoint."""


class HealthVerdict(StrictModel):
    """Result of one health check step."""

    ok: bool = Field(description="False when training must stop.")
    step: int = Field(description="Training step of the check.")
    reason: str = Field(default="", description="Why training must stop (empty when ok).")


def pick(metrics: Mapping[str, Any], name: str) -> float | None:
    """Our metric ``name`` from a raw log dict (first alias present), as float; None when absent/non-numeric."""
    for key in ALIASES.get(name, (name,)):
        if key in metrics:
            try:
                return float(metrics[key])
            except (TypeError, ValueError):
                return None
    return None


class HealthMonitor:
    """Stateful checker: feed one metric dict per logging step to :meth:`update`."""

    def __init__(self, cfg: HealthConfig) -> None:
        self.cfg = cfg
        self.history: dict[str, deque[float]] = {k: deque(maxlen=cfg.window) for k in ALIASES}
        self.steps_seen = 0
        self.failed: HealthVerdict | None = None
        self.searches: list[float] = []  # every step's searches per trajectory (the first ones are the start)
        self.answers: deque[list[AnswerObs]] = deque(maxlen=cfg.window)
        self.alarms: list[Alarm] = []  # first firing of each alarm
        self.new_alarms: list[Alarm] = []  # fired at the last update

    def observe_rollouts(self, items: Sequence[AnswerObs]) -> dict[str, float]:
        """Record one step's rollouts; returns the step's answer metrics (``search/copied_answer_rate``,
        ``search/top_answer_share`` over the window's questions) to merge into that step's log."""
        from training.agent.alarms import top_answer

        self.answers.append(list(items))
        _, count, n_q = top_answer([i for step in self.answers for i in step])
        return {"search/copied_answer_rate": copied_share(items),
                "search/top_answer_share": count / n_q if n_q else 0.0}

    def snapshot(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        """The monitored metrics present in a raw log dict, under our names (prefixed ``health/``)."""
        out = {}
        for name in ALIASES:
            value = pick(metrics, name)
            if value is not None:
                out[f"health/{name}"] = value
        return out

    def update(self, step: int, metrics: Mapping[str, Any]) -> HealthVerdict:
        """Record a step's metrics and return the verdict (the first failure sticks)."""
        if self.failed is not None:
            return self.failed
        values = {name: pick(metrics, name) for name in ALIASES}
        if not any(v is not None for v in values.values()):
            return HealthVerdict(ok=True, step=step)
        self.steps_seen += 1
        reason = self._nan_reason(values) or self._kl_reason(values)
        for name, value in values.items():
            if value is not None and math.isfinite(value):
                self.history[name].append(value)
        if not reason and self.steps_seen > self.cfg.warmup_steps:
            reason = self._collapse_reason()
        if not reason:
            reason = self._alarm_reason(step, values)
        verdict = HealthVerdict(ok=not reason, step=step, reason=reason)
        if not verdict.ok:
            self.failed = verdict
        return verdict

    def _alarm_reason(self, step: int, values: Mapping[str, float | None]) -> str:
        """Run the alarms; record first firings; the reason to stop when one is in ``stop_on``."""
        searches = values.get("searches_per_traj")
        if searches is not None and math.isfinite(searches):
            self.searches.append(searches)
        copied = list(self.history["copied_answer_rate"]) if values.get("copied_answer_rate") is not None else []
        window_items = [i for s in self.answers for i in s]
        fired = window_alarms(self.cfg, step, self.searches if searches is not None else [], copied, window_items,
                              self.cfg.window)
        seen = {a.name for a in self.alarms}
        self.new_alarms = [a for a in fired if a.name not in seen]
        self.alarms += self.new_alarms
        for a in self.new_alarms:
            if a.name in self.cfg.stop_on:
                return f"alarm {a.name} (health.stop_on): {a.message}"
            log.warning("health alarm at step %s: %s", step, a.message)
        return ""

    def _nan_reason(self, values: Mapping[str, float | None]) -> str:
        if not self.cfg.stop_on_nan:
            return ""
        for name in ("loss", "reward", "kl", "grad_norm", "entropy"):
            v = values.get(name)
            if v is not None and not math.isfinite(v):
                return f"{name} is {v} (NaN/inf): the update diverged; lower the learning rate or check rewards"
        return ""

    def _kl_reason(self, values: Mapping[str, float | None]) -> str:
        kl = values.get("kl")
        if self.cfg.max_kl is not None and kl is not None and math.isfinite(kl) and kl > self.cfg.max_kl:
            return f"kl={kl:.4g} exceeds max_kl={self.cfg.max_kl}: the policy ran away from the reference"
        return ""

    def _full(self, name: str) -> deque[float] | None:
        h = self.history[name]
        return h if len(h) >= self.cfg.window else None

    def _collapse_reason(self) -> str:
        c, w = self.cfg, self.cfg.window
        h = self._full("reward")
        if c.min_reward_std is not None and h is not None:
            mean = sum(h) / len(h)
            std = math.sqrt(sum((x - mean) ** 2 for x in h) / len(h))
            if std < c.min_reward_std:
                return f"reward collapsed: std {std:.3g} < {c.min_reward_std} over {w} steps (mean {mean:.3g})"
        checks = (("format_failure_rate", c.max_format_failure_rate, "above"),
                  ("response_length", c.min_response_length, "below"), ("entropy", c.min_entropy, "below"))
        for name, limit, side in checks:
            h = self._full(name)
            if limit is None or h is None:
                continue
            bad = all(x > limit for x in h) if side == "above" else all(x < limit for x in h)
            if bad:
                return f"{name} stayed {side} {limit} for {w} steps (last {h[-1]:.3g}): the policy collapsed"
        return ""


def health_callback(cfg: HealthConfig, log_to_mlflow: bool = True) -> Any:
    """A transformers ``TrainerCallback`` running :class:`HealthMonitor` on every log.

    It logs ``health/*`` metrics to the active MLflow run (``log_to_mlflow``), sets ``should_training_stop`` and
    clears ``should_save`` on failure, and records ``last_good_checkpoint`` (the newest checkpoint saved before
    it). Alarms that fire are kept in ``alarms`` and set as MLflow tags ``health.alarm.<name>.training``. The
    trainer calls ``on_rollouts(items)`` with each step's :class:`AnswerObs` and logs the returned metrics. After
    ``trainer.train()`` call :func:`raise_if_unhealthy`.
    """
    from transformers import TrainerCallback

    class HealthCallback(TrainerCallback):
        def __init__(self) -> None:
            self.monitor = HealthMonitor(cfg)
            self.last_good_checkpoint: str | None = None
            self.series: list[dict[str, float]] = []

        @property
        def alarms(self) -> list[Alarm]:
            return self.monitor.alarms

        def on_rollouts(self, items: Sequence[AnswerObs]) -> dict[str, float]:
            return self.monitor.observe_rollouts(items)

        def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if not logs:
                return
            verdict = self.monitor.update(state.global_step, logs)
            snap = self.monitor.snapshot(logs)
            if snap:
                self.series.append({"step": float(state.global_step), **snap})
            if log_to_mlflow:
                raw = {f"train/{k}": v for k, v in logs.items() if isinstance(v, (int, float))}
                _log_mlflow({**raw, **snap}, state.global_step)
                if self.monitor.new_alarms:
                    _tag_mlflow(self.monitor.new_alarms)
            if not verdict.ok:
                log.error("health check failed at step %s: %s", verdict.step, verdict.reason)
                control.should_training_stop = True
                control.should_save = False

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.monitor.failed is None:
                self.last_good_checkpoint = f"{args.output_dir}/checkpoint-{state.global_step}"

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.monitor.failed is not None:
                control.should_save = False
                control.should_training_stop = True

    return HealthCallback()


def _log_mlflow(metrics: Mapping[str, float], step: int) -> None:
    from infra import tracking

    try:
        if tracking.active_run_id() is None:
            return
    except ImportError:  # an engine environment without mlflow
        return
    tracking.log_metrics(metrics, step=step)


def _tag_mlflow(alarms: Sequence[Alarm]) -> None:
    from infra import tracking
    from training.agent.alarms import alarm_tags

    if tracking.active_run_id() is not None:
        tracking.set_tags(alarm_tags(alarms))


def raise_if_unhealthy(callback: Any) -> None:
    """Raise TrainingHealthError if the health callback stopped training."""
    failed = callback.monitor.failed
    if failed is None:
        return
    kept = callback.last_good_checkpoint or "none (no checkpoint was saved before the failure)"
    raise TrainingHealthError(
        f"training stopped at step {failed.step}: {failed.reason}. Last good checkpoint: {kept}. "
        "Resume from it with adjusted settings (e.g. lower learning_rate) or relax the thresholds in `health:`.")


def plot_health(series: list[Mapping[str, float]], path: str) -> str:
    """Plot reward, format-failure rate, searches per trajectory, length and KL over steps; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("reward", "reward"), ("format_failure_rate", "format-failure rate"),
              ("searches_per_traj", "searches / trajectory"), ("response_length", "response length (tokens)"),
              ("kl", "KL to the reference")]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2))
    for ax, (name, title) in zip(axes, panels, strict=True):
        pts = [(row["step"], row[f"health/{name}"]) for row in series if f"health/{name}" in row]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def check_folders(folders: Sequence[str], cfg: HealthConfig | None = None) -> list[tuple[str, list[Alarm]]]:
    """The alarms of each evidence folder (``training.agent.alarms.evidence_alarms`` with ``cfg``'s thresholds)."""
    cfg = cfg or HealthConfig()
    alarm_cfg = AlarmConfig(**{k: getattr(cfg, k) for k in AlarmConfig.model_fields})
    return [(f, evidence_alarms(f, alarm_cfg, window=cfg.window)) for f in folders]


def alarms_report(results: Sequence[tuple[str, list[Alarm]]]) -> str:
    """A markdown table: one row per folder, one column per alarm (the value where it fired, else "-")."""
    from training.agent.config import ALARMS

    lines = ["| evidence folder | " + " | ".join(ALARMS) + " |", "|---" * (len(ALARMS) + 1) + "|"]
    for folder, alarms in results:
        cells = []
        for name in ALARMS:
            fired = [a for a in alarms if a.name == name]
            cells.append("; ".join(f"{a.where}{f' step {a.step:g}' if a.step is not None else ''}: "
                                   f"{a.value:.3g} (limit {a.threshold:.3g})" for a in fired) or "-")
        lines.append(f"| {folder.rstrip('/')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m training.rl.health FOLDER...``: print which alarms fire on each evidence folder (default
    thresholds; ``--window N`` for the training window). Exit status 1 when any fires, so a script can gate."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m training.rl.health", description=main.__doc__)
    parser.add_argument("folders", nargs="+", help="evidence folders (docs/results/learning/<recipe>)")
    parser.add_argument("--window", type=int, default=5, help="training steps a condition is averaged over")
    args = parser.parse_args(argv)
    folders = list(args.folders)
    if len(folders) > 1:  # a glob (docs/results/learning/*/) also matches tables and runs stopped before RL
        skipped = [f for f in folders if not (Path(f) / "heldout_final.jsonl").exists()]
        for f in skipped:
            print(f"skipped {f.rstrip('/')}: no heldout_final.jsonl (not a finished learning run)", file=sys.stderr)
        folders = [f for f in folders if f not in skipped] or folders[:1]  # none left: report the first's error
    try:
        results = check_folders(folders, HealthConfig(window=args.window))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(alarms_report(results))
    for folder, alarms in results:
        for a in alarms:
            print(f"{folder.rstrip('/')}: {a.message}" + (f" (step {a.step:g})" if a.step is not None else ""))
    return 1 if any(alarms for _, alarms in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
