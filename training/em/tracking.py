"""MLflow bookkeeping of the EM loop: explicit run ids (``infra.tracking``'s client style, safe across Prefect task
threads).

Run tree: one parent run per experiment directory, a nested run per iteration (``iter_00`` is the warm-up), and a
nested run per executed stage under its iteration. Run ids are kept in ``<root>/mlflow_runs.json`` so a resumed
experiment reattaches to the same runs. Checkpoints become versions of a registered model, tagged with their
iteration (logged as MLflow models, see ``infra.registry``); :func:`promote` moves the ``champion`` alias only when
``training.em.stages.beats_champion`` says so. mlflow is imported lazily.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from pathlib import Path
from typing import Any

from evaluation.metrics import MetricSummary
from infra import artifacts, links, tracking
from training.em.records import Promotion, StageRef

log = logging.getLogger(__name__)
_LOCK = threading.Lock()


def _runs_file(root: str | Path) -> Path:
    return Path(root) / "mlflow_runs.json"


def _runs(root: str | Path) -> dict[str, str]:
    path = _runs_file(root)
    return json.loads(path.read_text()) if path.exists() else {}


def ensure_run(root: str | Path, key: str, name: str, experiment: str, parent: str | None = None,
               tags: dict[str, str] | None = None) -> str:
    """Return the run id stored under ``key`` in the experiment dir, creating the run (nested under ``parent``).

    A reattached run is set ``RUNNING`` again and re-tagged with the current orchestrator run (``infra.links``): the
    flow run now driving it is the one whose final state ends it (``tasks.run_status``)."""
    with _LOCK:
        runs = _runs(root)
        if key in runs:
            tracking.client().update_run(runs[key], status="RUNNING")
            tracking.set_tags(links.link_tags(), run_id=runs[key])
            return runs[key]
        tracking.configure(experiment)
        client = tracking.client()
        exp = client.get_experiment_by_name(experiment)
        all_tags = {**links.link_tags(), "mlflow.runName": name, **(tags or {})}
        if parent:
            all_tags["mlflow.parentRunId"] = parent
        run_id = client.create_run(exp.experiment_id, tags=all_tags).info.run_id
        artifacts.write_json(_runs_file(root), {**runs, key: run_id})
    links.announce_run(run_id, exp.experiment_id, name)
    return run_id


def stage_run(root: str | Path, key: str, name: str, experiment: str, parent: str) -> str:
    """A nested run for one executed stage; when the stage is redone after a crash, the earlier attempt's run
    (left RUNNING by a kill -9) is marked KILLED and a new run is created."""
    with _LOCK:
        runs = _runs(root)
        stale = runs.pop(key, None)
        if stale is not None and tracking.client().get_run(stale).info.status == "RUNNING":
            tracking.finish_run(stale, status="KILLED")
        artifacts.write_json(_runs_file(root), runs)
    return ensure_run(root, key, name, experiment, parent)


def finish(run_id: str, status: str = "FINISHED") -> None:
    """Mark a run terminated."""
    tracking.finish_run(run_id, status)


def log_metrics(run_id: str, metrics: dict[str, Any], step: int | None = None) -> None:
    """Log finite numeric metrics in one batch."""
    tracking.log_metrics(metrics, step=step, run_id=run_id)


def log_params(run_id: str, params: dict[str, Any]) -> None:
    """Log flattened params (keys prefixed ``sl.`` so they never clash with the engine's own params)."""
    tracking.log_params(params, run_id=run_id, prefix="sl.")


def log_artifacts(run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
    """Log a file or a directory's files (not subdirectories with models) as artifacts."""
    p = Path(path)
    client = tracking.client()
    if p.is_dir():
        for f in sorted(p.iterdir()):
            if f.is_file():
                client.log_artifact(run_id, str(f), artifact_path)
    elif p.exists():
        client.log_artifact(run_id, str(p), artifact_path)


def log_loss_curve(run_id: str, curve_path: str | Path) -> None:
    """Log the engine's loss curve as step metrics ``train_loss`` (in addition to its own report_to)."""
    if not Path(curve_path).exists():
        return
    for row in artifacts.read_jsonl(curve_path):
        if row.get("loss") is not None:
            log_metrics(run_id, {"sl_train_loss": row["loss"]}, step=int(row.get("current_steps", 0)))


def log_histogram(run_id: str, weights: list[float], out_png: str | Path) -> None:
    """Save a histogram of E-step weights as a PNG artifact (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [w for w in weights if math.isfinite(w)]
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.hist(finite, bins=20)
    ax.set_xlabel("normalized E-step weight w_i")
    ax.set_ylabel("trajectories")
    fig.tight_layout()
    fig.savefig(out_png)
    plt.close(fig)
    log_artifacts(run_id, out_png, "selection")


def register_checkpoint(name: str, path: str, run_id: str, iteration: int, f1: MetricSummary) -> str:
    """Log ``path`` as an MLflow model of run ``run_id`` and register it as a new version of ``name`` (portable:
    ``models:/<name>@champion`` downloads it anywhere), tagged with its iteration and F1; returns the version."""
    from infra.registry import log_checkpoint

    tags = {"iteration": str(iteration), "heldout_f1": f"{f1.mean:.4f}",
            "heldout_f1_ci": f"[{f1.low:.4f}, {f1.high:.4f}]"}
    with _LOCK:
        return log_checkpoint(path, name, run_id=run_id, tags=tags).version


def champion(name: str) -> tuple[str, MetricSummary] | None:
    """(version, held-out F1) of the current ``champion`` alias, or None."""
    v = tracking.get_alias(name, "champion")
    if v is None:
        return None
    low, high = json.loads(v.tags["heldout_f1_ci"])
    return str(v.version), MetricSummary(mean=float(v.tags["heldout_f1"]), low=low, high=high, n=0)


def set_champion(name: str, version: str) -> None:
    """Move the ``champion`` alias to ``version``."""
    tracking.set_alias(name, "champion", version)


def promote(name: str, path: str, iteration: int, f1: MetricSummary, run_id: str) -> Promotion:
    """Register checkpoint ``path`` as a version of ``name``; move ``champion`` to it only when its held-out F1
    beats the champion's interval (``training.em.stages.beats_champion``). Safe to repeat after a crash."""
    from training.em.stages import beats_champion

    version = register_checkpoint(name, path, run_id, iteration, f1)
    current = champion(name)
    if current is not None and current[0] == version:  # resumed after this version was already promoted
        return Promotion(version=version, promoted=True, champion=version)
    promoted = current is None or beats_champion(f1, current[1])
    if promoted:
        set_champion(name, version)
    return Promotion(version=version, promoted=promoted, champion=version if promoted else current[0])


def tracked_stage(root: str | Path, experiment: str, parent: str, step: str, out_dir: str | Path,
                  fn: Any) -> Any:
    """Run ``fn(run_id)`` for a stage inside its own nested MLflow run, unless ``out_dir`` is already complete.

    A complete stage (manifest present) is returned by ``fn(None)`` with no new run (``training.em.stages.run_stage``
    logs the skip). After a run: top-level files of ``out_dir`` (and ``trajectories/trajectories.jsonl``) are logged as
    artifacts and the numbers of the returned record (``StageRef.numbers``) as metrics.
    """
    if artifacts.read_manifest(out_dir) is not None:
        return fn(None)
    key = f"{Path(out_dir).relative_to(root)}"
    run_id = stage_run(root, key, step, experiment, parent)
    try:
        ref = fn(run_id)
    except BaseException:
        finish(run_id, "FAILED")
        raise
    log_artifacts(run_id, out_dir, step)
    traj = Path(out_dir) / "trajectories" / "trajectories.jsonl"
    if traj.exists():
        log_artifacts(run_id, traj, f"{step}/trajectories")
    if isinstance(ref, StageRef):
        log_metrics(run_id, ref.numbers())
    finish(run_id)
    return ref
