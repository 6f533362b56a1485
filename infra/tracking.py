"""MLflow tracking, one style for every flow: embedded sqlite default, nested runs per stage, batched params and
metrics, registered-model aliases.

Two ways to address a run, same functions: the *active* run (``stage_run`` context, the fluent API; index builds,
evaluation, RL stages) or an explicit ``run_id`` (``create_run`` + ``MlflowClient``; safe across Prefect task
threads, used by the EM loop whose runs outlive one task). ``get_alias``/``set_alias`` read and move registered-model
aliases such as ``champion``; a checkpoint becomes a registered model version in one place, ``infra.registry``.
``MLFLOW_TRACKING_URI`` overrides the default store; ``SEARCHLOOP_PARENT_RUN_ID`` (set by a parent process) nests a
stage under an existing run, as verl does with ``MLFLOW_RUN_ID``. mlflow is imported inside functions.

Run status: a block (``stage_run``, ``child_run``) ends its own run, ``FINISHED`` or ``FAILED``; a run made by
``create_run`` stays ``RUNNING`` until ``finish_run`` / ``finish_tagged_runs`` ends it (a flow's parent run: the
flow's Prefect state hooks, ``tasks/run_status.py``), and ``resume_run`` leaves a run's status as it found it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infra.settings import get_settings

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "searchloop"


def configure(experiment: str = DEFAULT_EXPERIMENT) -> str:
    """Point mlflow at the configured store and select (or create) the experiment; returns the tracking URI."""
    import mlflow

    settings = get_settings()
    uri = settings.tracking_uri
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    if mlflow.get_experiment_by_name(experiment) is None:
        location = None
        if not uri.startswith(("http://", "https://")):
            root = settings.artifact_root
            location = root if "://" in root else Path(root).joinpath(experiment).as_uri()
        mlflow.create_experiment(experiment, artifact_location=location)
    mlflow.set_experiment(experiment)
    return uri


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def flatten_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Flatten nested params to dotted keys with string values (MLflow caps values at 6000 chars)."""
    flat: dict[str, Any] = {}
    _flatten("", params, flat)
    return {k: str(v)[:6000] for k, v in flat.items()}


@contextmanager
def stage_run(
    name: str,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
) -> Iterator[Any]:
    """Start an MLflow run for a stage, nested under the active run (or under ``MLFLOW_RUN_ID``'s run).

    Yields the ``mlflow.ActiveRun``. Params are flattened and logged in one batch.
    """
    import mlflow

    from infra import links

    configure(experiment)
    parent_id = os.environ.get("SEARCHLOOP_PARENT_RUN_ID")
    active = mlflow.active_run()
    kwargs: dict[str, Any] = {"run_name": name, "tags": {**links.link_tags(), **(tags or {})}}
    if active is not None:
        kwargs["nested"] = True
    elif parent_id:
        kwargs["tags"]["mlflow.parentRunId"] = parent_id
    with mlflow.start_run(**kwargs) as run:
        links.announce_run(run.info.run_id, run.info.experiment_id, name)
        if params:
            log_params(params)
        yield run


def child_run(parent_run_id: str | None, name: str, params: dict[str, Any] | None = None,
              tags: Mapping[str, str] | None = None) -> Any:
    """Start an MLflow run nested under ``parent_run_id`` (a context manager yielding the run), tagged with the
    Prefect links and ``tags``; the one way every loop opens its parent and child runs."""
    import mlflow

    from infra import links

    configure()
    tags = {**links.link_tags(), **(tags or {}),
            **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {})}
    run = mlflow.start_run(run_name=name, tags=tags, nested=mlflow.active_run() is not None)
    links.announce_run(run.info.run_id, run.info.experiment_id, name)
    if params:
        log_params(params)
    return run


@contextmanager
def resume_run(run_id: str) -> Iterator[Any]:
    """Make the existing run ``run_id`` the active run for the block (nested when a run is already active), so the
    fluent API (``mlflow.log_table``, traces) writes to it; yields the ``mlflow.ActiveRun``.

    The block never changes the run's status: on exit (normal or not) the run gets back the status it had before
    (a parent run stays ``RUNNING`` until its owner, e.g. the flow's state hooks, ends it). MLflow's own
    ``with mlflow.start_run(run_id=...)`` would mark it ``FINISHED`` (or ``FAILED``) when the block exits.
    """
    import mlflow

    configure()
    before = client().get_run(run_id).info.status
    run = mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None)
    try:
        yield run
    finally:
        mlflow.end_run(status=before)  # pops it from the active-run stack, status as it was


def client() -> Any:
    """An ``MlflowClient`` on the configured store."""
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=get_settings().tracking_uri)


def create_run(name: str, experiment: str = DEFAULT_EXPERIMENT, parent_id: str | None = None,
               tags: Mapping[str, str] | None = None, params: Mapping[str, Any] | None = None) -> str:
    """Create a ``RUNNING`` run (nested under ``parent_id`` when given, ``params`` logged) without activating it;
    returns its id. Nothing ends it but :func:`finish_run` or :func:`finish_tagged_runs` (a flow's parent run: its
    status follows the flow run, see ``tasks.run_status``)."""
    from infra import links

    configure(experiment)
    c = client()
    exp = c.get_experiment_by_name(experiment)
    all_tags = {**links.link_tags(), "mlflow.runName": name, **(tags or {})}
    if parent_id:
        all_tags["mlflow.parentRunId"] = parent_id
    run_id = c.create_run(exp.experiment_id, tags=all_tags).info.run_id
    if params:
        log_params(params, run_id=run_id)
    links.announce_run(run_id, exp.experiment_id, name)
    return run_id


def finish_run(run_id: str, status: str = "FINISHED") -> None:
    """Mark a run terminated (``FINISHED``, ``FAILED`` or ``KILLED``)."""
    client().set_terminated(run_id, status=status)


def finish_tagged_runs(tags: Mapping[str, str], status: str = "FINISHED") -> list[str]:
    """Terminate with ``status`` every ``RUNNING`` run, in any experiment, that carries all of ``tags`` (e.g. the
    Prefect flow run id every run of a flow run is tagged with, ``infra.links``); returns their ids."""
    from mlflow.entities import ViewType

    if not tags:
        raise ValueError("finish_tagged_runs needs at least one tag: with none it would end every running run")
    bad = [f"{k}={v}" for k, v in tags.items() if "'" in f"{k}{v}" or "`" in k]
    if bad:
        raise ValueError(f"finish_tagged_runs: quotes in tag(s) {bad} cannot go into an MLflow filter; "
                         "use tags without quotes")
    c = client()
    experiments, token = [], None
    while True:
        page = c.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        experiments += [e.experiment_id for e in page]
        token = page.token
        if not token:
            break
    query = " and ".join([*(f"tags.`{k}` = '{v}'" for k, v in tags.items()), "attributes.status = 'RUNNING'"])
    ended: list[str] = []
    token = None
    while experiments:
        page = c.search_runs(experiments, filter_string=query, max_results=1000, page_token=token)
        ended += [r.info.run_id for r in page]
        token = page.token
        if not token:
            break
    for run_id in ended:
        c.set_terminated(run_id, status=status)
    return ended


def log_params(params: Mapping[str, Any], run_id: str | None = None, prefix: str = "") -> None:
    """Log nested params as flattened strings in one batch, to ``run_id`` or the active run.

    ``prefix`` keeps ours apart from an engine's own params in a shared run (the EM loop uses ``sl.``).
    """
    flat = {f"{prefix}{k}"[:250]: v for k, v in flatten_params(params).items()}
    if run_id is None:
        import mlflow

        mlflow.log_params(flat)
        return
    from mlflow.entities import Param

    items = list(flat.items())
    for i in range(0, len(items), 100):  # MLflow's batch limit
        client().log_batch(run_id, params=[Param(k, v) for k, v in items[i : i + 100]])


def finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric entries of ``metrics`` as floats, keys made MLflow-safe (``@`` -> ``_at_``)."""
    import math

    clean = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            clean[k.replace("@", "_at_")] = f
    return clean


def log_metrics(metrics: Mapping[str, float], step: int | None = None, run_id: str | None = None) -> None:
    """Log finite numeric metrics in one batched call (non-numeric values are skipped), to ``run_id`` or the
    active run."""
    clean = finite_metrics(metrics)
    if not clean:
        return
    if run_id is None:
        import mlflow

        mlflow.log_metrics(clean, step=step)
        return
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client().log_batch(run_id, metrics=[Metric(k, v, now, step or 0) for k, v in clean.items()])


def set_tags(tags: Mapping[str, str], run_id: str | None = None) -> None:
    """Set string tags on ``run_id`` or the active run (values cut to MLflow's 5,000-character limit)."""
    clean = {k: str(v)[:5000] for k, v in tags.items()}
    if not clean:
        return
    if run_id is None:
        import mlflow

        mlflow.set_tags(clean)
        return
    from mlflow.entities import RunTag

    client().log_batch(run_id, tags=[RunTag(k, v) for k, v in clean.items()])


def log_artifact(path: str | os.PathLike[str], artifact_path: str | None = None, run_id: str | None = None) -> None:
    """Log a local file or directory as artifacts of ``run_id`` or the active run."""
    p = Path(path)
    if run_id is not None:
        c = client()
        (c.log_artifacts if p.is_dir() else c.log_artifact)(run_id, str(p), artifact_path=artifact_path)
        return
    import mlflow

    if p.is_dir():
        mlflow.log_artifacts(str(p), artifact_path=artifact_path)
    else:
        mlflow.log_artifact(str(p), artifact_path=artifact_path)


def get_alias(name: str, alias: str) -> Any | None:
    """The ``ModelVersion`` that ``alias`` points at in registered model ``name``, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return client().get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def set_alias(name: str, alias: str, version: str) -> None:
    """Point ``alias`` (e.g. ``champion``) of registered model ``name`` at ``version``."""
    client().set_registered_model_alias(name, alias, version)


def active_run_id() -> str | None:
    """The active MLflow run id, if any."""
    import mlflow

    run = mlflow.active_run()
    return run.info.run_id if run else None
