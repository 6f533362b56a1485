"""Register a Prefect deployment for every flow in ``flows/`` and submit runs to them, following their logs.

Discovery: every module ``flows/<name>.py`` is imported and each ``prefect.Flow`` defined in it gets a deployment
``<flow-name>/default`` on the ``cpu`` pool (or the pool named by the module's ``WORK_POOL``); subflows a module
lists in ``SUBFLOWS`` (``em-iteration``) are not deployed. The entrypoint is the module path
(``flows.retrain.retrain``) and the job runs in the repository root, so a process worker needs no code download.
The UI form comes from the flow's parameters: for the user flows (``flows.specs.FLOWS``) a ``preset`` drop-down
(the flow's presets) and a list of ``key.sub=value`` overrides, with the flow's default preset as the
deployment's default, so a run launched with no input works. A scheduled
variant (``<flow-name>/scheduled``) is added for flows given an interval or a cron string. Missing pools are
created (type process) first: ``gpu-step`` (``flows/gpu_step.py``) lives on the ``gpu`` pool even where no gpu
worker runs yet.

This lives in ``flows/`` rather than ``infra/`` because library code never imports Prefect (a test checks it).
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from prefect import Flow
from prefect.deployments.runner import EntrypointType

from infra.config import SECRET_MASK
from infra.errors import ConfigError
from infra.settings import REPO_ROOT

NOT_FLOW_MODULES = {"cli", "deployments", "commands", "specs", "flow_configs", "fanout"}
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def discover_flows() -> dict[str, tuple[Flow, str]]:
    """Flow name -> (flow, work pool) for every flow defined in a ``flows/*.py`` module."""
    import flows as pkg

    found: dict[str, tuple[Flow, str]] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name in NOT_FLOW_MODULES or info.ispkg or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"flows.{info.name}")
        pool = getattr(module, "WORK_POOL", "cpu")
        skip = getattr(module, "SUBFLOWS", set())
        for obj in vars(module).values():
            own = isinstance(obj, Flow) and getattr(obj.fn, "__module__", None) == module.__name__
            if own and obj.name not in skip:
                found[obj.name] = (obj, pool)
    return found


def job_variables() -> dict[str, Any]:
    """Process-worker job variables: run in the repository root with it on ``PYTHONPATH``."""
    return {"working_dir": str(REPO_ROOT), "env": {"PYTHONPATH": str(REPO_ROOT)}}


def ensure_pools(pools: set[str], pool_type: str = "process") -> list[str]:
    """Create the work pools that do not exist yet (a deployment on a missing pool is rejected); returns them.

    ``searchloop up`` on a machine without CUDA starts no ``gpu`` worker, but ``gpu-step`` is still deployed on an
    (empty) ``gpu`` pool, so a gpu worker started later picks up what was dispatched.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    created = []
    with get_client(sync_client=True) as client:
        for name in sorted(pools):
            try:
                client.read_work_pool(name)
            except ObjectNotFound:
                try:
                    client.create_work_pool(WorkPoolCreate(name=name, type=pool_type))
                    created.append(name)
                except ObjectAlreadyExists:  # a worker created it meanwhile
                    pass
    return created


def _with_base_env(overrides: dict[str, Any]) -> dict[str, Any]:
    """Run-level job variables replace the deployment's per key: keep our base ``env`` under the run's own."""
    out = dict(overrides)
    if "env" in out:
        out["env"] = {**job_variables()["env"], **out["env"]}
    return out


def default_parameters(flow: Flow) -> dict[str, Any]:
    """A deployment's default parameters: the flow's default preset and no overrides (user flows); for the others,
    every config-model parameter's default in full, so ``key.sub=value`` overrides merge into it section by
    section (``config.evaluation.files=[...]`` keeps ``config.evaluation.ks``)."""
    import inspect

    from pydantic import BaseModel

    from flows.specs import FLOWS

    spec = FLOWS.get(flow.name)
    if spec is not None:
        return {"preset": spec.default_preset, "overrides": []}
    return {name: p.default.model_dump(mode="json") for name, p in inspect.signature(flow.fn).parameters.items()
            if isinstance(p.default, BaseModel)}


def check_parameters(flow_name: str, overrides: list[str], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parameters of a run of a flow without presets (``retrain``): ``defaults`` (the flow's own when None) with the
    ``param.sub=value`` overrides merged in, each config-model parameter validated here, before any server is
    contacted. Returns the parameters.

    Raises:
        ConfigError: an unknown flow, parameter or key (with the closest known name), or an invalid value.
    """
    import inspect

    from pydantic import BaseModel

    from infra.config import apply_overrides, build_config
    from infra.lazy import unknown_name

    found = discover_flows()
    if flow_name not in found:
        raise ConfigError(unknown_name("flow", flow_name, sorted(found)))
    flow = found[flow_name][0]
    models = {name: type(p.default) for name, p in inspect.signature(flow.fn).parameters.items()
              if isinstance(p.default, BaseModel)}
    params = apply_overrides(default_parameters(flow) if defaults is None else defaults, overrides)
    problems = []
    for key in params:
        if key not in models:
            close = [f"{m}.{c}" for m, model in models.items()
                     for c in difflib.get_close_matches(key, list(model.model_fields), n=1)]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{flow_name}: unknown parameter {key!r}{hint}; its parameters: {', '.join(models)}, "
                            f"set as {next(iter(models), 'config')}.<key>=value")
    for name, model in models.items():
        try:
            build_config(model, params.get(name) or {}, f"{flow_name} {name}")
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("\n".join(problems))
    return params


def run_parameters(flow_name: str, preset: str | None, overrides: list[str],
                   defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parameters of one run: ``preset`` + ``overrides`` (checked here first, as the CLI does) for the user flows;
    for the others (``retrain``) the overrides set ``param.sub=value`` keys, merged into the deployment's defaults
    section by section rather than replacing a whole section.

    Raises:
        ConfigError: an unknown preset, a bad override or input path, or ``--preset`` for a flow without presets.
    """
    from flows.specs import FLOWS, refuse_secret_overrides, resolve

    spec = FLOWS.get(flow_name)
    if spec is None:
        if preset is not None:
            raise ConfigError(f"flow {flow_name!r} takes no preset; pass its parameters as key=value "
                              "(e.g. config.name=nightly)")
        return check_parameters(flow_name, overrides, defaults or {})
    resolve(flow_name, preset, overrides)
    refuse_secret_overrides(overrides)
    return {"preset": preset or spec.default_preset, "overrides": list(overrides)}


def register(
    flow: Flow, pool: str = "cpu", name: str = "default", interval: float | None = None, cron: str | None = None,
    parameters: dict[str, Any] | None = None, concurrency_limit: int | None = None,
) -> str:
    """Create or update one deployment (defaults: ``default_parameters``); returns its id."""
    deployment = flow.to_deployment(
        name=name, work_pool_name=pool, job_variables=job_variables(),
        parameters=parameters if parameters is not None else default_parameters(flow),
        interval=timedelta(seconds=interval) if interval else None, cron=cron, tags=["searchloop"],
        entrypoint_type=EntrypointType.MODULE_PATH, concurrency_limit=concurrency_limit,
    )
    return str(deployment.apply())


def scheduled_parameters(flow_name: str, overrides: list[str]) -> dict[str, Any]:
    """Default parameters of ``<flow>/scheduled`` with ``key.sub=value`` overrides, checked here as ``deploy run``
    checks them (e.g. ``config.corpus=my.jsonl`` for ``retrain``: the scheduled run watches that corpus).

    Raises:
        ConfigError: an unknown flow, key or preset, a bad value, or a secret (parameters are stored in the server).
    """
    found = discover_flows()
    if flow_name not in found:
        from infra.lazy import unknown_name

        raise ConfigError(unknown_name("flow", flow_name, sorted(found)))
    params = run_parameters(flow_name, None, overrides, default_parameters(found[flow_name][0]))
    refuse_secret_parameters(params)
    return params


def register_all(schedules: dict[str, float | str] | None = None, pools: dict[str, str] | None = None,
                 parameters: dict[str, dict[str, Any]] | None = None) -> dict[str, str]:
    """Register ``<flow>/default`` for every flow, plus ``<flow>/scheduled`` for flows in ``schedules``.

    Args:
        schedules: flow name -> interval seconds (number) or cron string.
        pools: flow name -> work pool, overriding the module's ``WORK_POOL``.
        parameters: flow name -> parameters of its scheduled deployment (default: ``default_parameters``; build
            them with :func:`scheduled_parameters`).

    Returns:
        ``"flow/deployment"`` -> deployment id.
    """
    found = discover_flows()
    unknown = sorted(set(schedules or {}) - set(found))
    if unknown:
        raise ConfigError(f"no flow named {unknown} in flows/; known flows: {sorted(found)}")
    chosen = {name: (pools or {}).get(name, pool) for name, (_, pool) in found.items()}
    ensure_pools(set(chosen.values()))
    out = {}
    for flow_name, (flow, _) in found.items():
        pool = chosen[flow_name]
        out[f"{flow_name}/default"] = register(flow, pool)
        sched = (schedules or {}).get(flow_name)
        if sched is not None:
            kw = {"cron": sched} if isinstance(sched, str) else {"interval": float(sched)}
            out[f"{flow_name}/scheduled"] = register(flow, pool, name="scheduled", concurrency_limit=1,
                                                     parameters=(parameters or {}).get(flow_name), **kw)
    return out


_SECRET_NAMES = ("token", "api_key", "apikey", "secret", "password")


def _is_secret_name(key: str) -> bool:
    last = key.rsplit(".", 1)[-1].lower()
    return last in _SECRET_NAMES or last.endswith(tuple(f"_{n}" for n in _SECRET_NAMES))


def refuse_secret_parameters(parameters: Mapping[str, Any], where: str = "") -> None:
    """Refuse flow-run parameters that carry a secret: Prefect stores parameters in its database in plain text.

    Raises:
        ConfigError: naming the key and the environment variable to use instead.
    """
    for key, value in parameters.items():
        path = f"{where}.{key}" if where else str(key)
        if isinstance(value, Mapping):
            refuse_secret_parameters(value, path)
        elif key == "overrides" and isinstance(value, list | tuple):  # key.sub=value strings of a preset flow
            from flows.specs import refuse_secret_overrides

            refuse_secret_overrides(value)
        elif value not in (None, "", SECRET_MASK) and _is_secret_name(str(key)):
            raise ConfigError(f"{path} is a secret and a deployment's parameters are stored in Prefect's database: "
                              "drop it and give it through the workers' environment instead (e.g. "
                              "SEARCHLOOP_RETRIEVER_TOKEN, SEARCHLOOP_GENERATOR_TOKEN, SEARCHLOOP_JUDGE_API_KEY)")


def submit(deployment: str, parameters: dict[str, Any] | None = None,
           job_variables: dict[str, Any] | None = None) -> str:
    """Create a flow run of ``deployment`` (``flow/name``) without waiting; returns the flow-run id.

    Prefect merges ``parameters`` into the deployment's defaults at the top level only; build them with
    :func:`run_parameters` so nested settings merge.

    ``job_variables`` override the deployment's for this run, e.g. ``{"env": {"SEARCHLOOP_DISPATCH": "pool"}}``.
    """
    from prefect.deployments import run_deployment

    refuse_secret_parameters(parameters or {})
    run = run_deployment(deployment, parameters=parameters or {}, timeout=0, as_subflow=False,
                         job_variables=_with_base_env(job_variables) if job_variables else None)
    return str(run.id)


def follow(flow_run_id: str, timeout: float = 3600, on_log: Callable[[str], None] = print,
           poll: float = 1.0) -> str:
    """Stream a flow run's logs through ``on_log`` until it finishes; returns the final state type name.

    Raises:
        TimeoutError: if the run is not final after ``timeout`` seconds.
    """
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    seen: set[UUID] = set()
    deadline = time.monotonic() + timeout
    flt = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(flow_run_id)]))
    with get_client(sync_client=True) as client:

        task_names: dict[UUID, str] = {}

        def source(entry: Any) -> str:
            if entry.task_run_id is None:
                return ""
            if entry.task_run_id not in task_names:
                task_names[entry.task_run_id] = client.read_task_run(entry.task_run_id).name
            return f"[{task_names[entry.task_run_id]}] "

        def drain() -> None:
            for entry in client.read_logs(flt, sort=LogSort.TIMESTAMP_ASC, limit=200, offset=len(seen)):
                if entry.id not in seen:
                    seen.add(entry.id)
                    on_log(f"{entry.timestamp:%H:%M:%S} {source(entry)}{entry.message}")

        while True:
            run = client.read_flow_run(UUID(flow_run_id))
            drain()
            state = run.state.type.value if run.state else "PENDING"
            if state in FINAL:
                time.sleep(2.5)  # logs are shipped in batches; collect the last ones
                drain()
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"flow run {flow_run_id} still {state} after {timeout:.0f} s")
            time.sleep(poll)


def deployment_defaults(deployment: str) -> dict[str, Any]:
    """The stored default parameters of ``flow/name`` (ConfigError naming the fix when it is not registered)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return dict(client.read_deployment_by_name(deployment).parameters or {})
        except ObjectNotFound as exc:
            raise ConfigError(f"no deployment {deployment!r} on the server; register them with `searchloop deploy "
                              f"register` (known flows: {', '.join(sorted(discover_flows()))})") from exc
