"""Ops commands: ``searchloop up | down | status`` (the local stack) and ``searchloop deploy register | run``.

``up`` starts the Prefect server (UI on 127.0.0.1:4200), the MLflow server (127.0.0.1:5000) and process workers,
then registers a deployment for every flow; ``--dispatch pool`` makes flow runs send their GPU steps to the ``gpu``
pool (``tasks.dispatch``), ``--gpu-worker`` starts a gpu-pool worker even without CUDA.
``deploy run <flow> --preset P key=value`` checks the preset, overrides and input paths here, then submits a run to
the server and follows its logs. The API URL comes from ``PREFECT_API_URL`` or from the running stack that ``up``
recorded.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from flows.specs import FLOWS
from infra.errors import ConfigError, SearchloopError

console = Console()
FLOW_NAMES = (*FLOWS, "retrain")  # the user flows (presets) and the scheduled one (key=value parameters)


def _parse_schedules(items: list[str]) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ConfigError(f"--schedule {item!r} must be flow=SECONDS or flow='CRON' (e.g. retrain=3600)")
        try:
            out[name] = float(value)
        except ValueError:
            out[name] = value
    return out


def _parse_env(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {item!r} must be KEY=VALUE (e.g. SEARCHLOOP_DISPATCH=pool)")
        out[key] = value
    return out


def _api_url() -> str:
    from infra import stack

    url = os.environ.get("PREFECT_API_URL")
    if url:
        return url
    state = stack.live_state()
    if state is None:
        raise SearchloopError("no Prefect server is running: start the stack with `searchloop up` "
                              "(or set PREFECT_API_URL)")
    return state["prefect_api_url"]


@contextmanager
def _prefect_api(url: str):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


@contextmanager
def _server_errors():
    """A 4xx answer of the Prefect server (e.g. 409: a parameter the deployment's schema rejects) as one
    ``error:`` line (exit 2) instead of a traceback; 5xx and other failures propagate."""
    import httpx

    try:
        yield
    except httpx.HTTPStatusError as exc:
        code = exc.response.status_code
        if not 400 <= code < 500:
            raise
        try:
            detail = exc.response.json().get("detail", exc.response.text)
        except ValueError:
            detail = exc.response.text
        raise SearchloopError(f"the Prefect server refused the request ({code} {exc.response.reason_phrase}): "
                              f"{' '.join(str(detail).split())[:400]}") from exc


def _register(schedules: dict[str, float | str], overrides: list[str] | None = None) -> dict[str, str]:
    from flows import deployments

    params = {}
    if overrides:  # checked before any server is contacted
        if len(schedules) != 1:
            raise ConfigError(f"key=value settings {overrides} are for one scheduled deployment: give exactly one "
                              "--schedule with them (e.g. --schedule retrain=3600 config.corpus=my.jsonl)")
        flow_name = next(iter(schedules))
        params = {flow_name: deployments.scheduled_parameters(flow_name, overrides)}
    with _prefect_api(_api_url()):
        return deployments.register_all(schedules=schedules, parameters=params)


def register(app: typer.Typer) -> None:
    """Add ``up``, ``down``, ``status`` and the ``deploy`` group to the root app."""
    deploy = typer.Typer(help="Prefect deployments: register every flow, run one through the server.",
                         no_args_is_help=True)
    app.add_typer(deploy, name="deploy")

    @app.command("up")
    def up(
        prefect_port: int = typer.Option(4200, help="Prefect server port."),
        mlflow_port: int = typer.Option(5000, help="MLflow server port."),
        schedule: list[str] = typer.Option([], help="flow=SECONDS or flow=CRON: also a scheduled deployment."),
        deploy_flows: bool = typer.Option(True, "--deploy/--no-deploy", help="Register a deployment per flow."),
        gpu_worker: bool = typer.Option(None, "--gpu-worker/--no-gpu-worker",
                                        help="Start a gpu-pool worker (default: when CUDA is present)."),
        dispatch: str = typer.Option("local", help="local: gpu steps run inside their flow; pool: flow runs started "
                                     "by the workers send them to the gpu pool (gpu-step deployment)."),
    ) -> None:
        """Start the local stack (Prefect server + UI, MLflow server, workers) and register deployments."""
        from infra import stack

        if dispatch not in {"local", "pool"}:
            raise ConfigError(f"--dispatch {dispatch!r}: use local or pool")
        overrides: dict[str, Any] = {"prefect_port": prefect_port, "mlflow_port": mlflow_port}
        if gpu_worker is not None:
            overrides["pools"] = ["cpu", "gpu"] if gpu_worker else ["cpu"]
        if dispatch == "pool":
            overrides["extra_env"] = {"SEARCHLOOP_DISPATCH": "pool"}
        cfg = stack.default_config(**overrides)
        timings = stack.up(cfg)
        for name, seconds in timings.items():
            console.print(f"[green]up[/] {name} ({seconds:.1f} s)")
        if deploy_flows:
            os.environ["PREFECT_API_URL"] = cfg.prefect_api_url
            for key, dep_id in _register(_parse_schedules(schedule)).items():
                console.print(f"deployment {key} ({dep_id})")
        if "worker-gpu" not in timings:
            console.print("gpu pool: no worker started (no CUDA here), so the Prefect UI shows it 'Not Ready'; "
                          "gpu-step runs wait there until a gpu worker starts (`searchloop up --gpu-worker`, or "
                          "`prefect worker start --pool gpu` on a GPU machine)")
        console.print(f"Prefect UI: {cfg.prefect_ui_url}   MLflow UI: {cfg.mlflow_url}")
        console.print("CLI runs use this stack by themselves; for other tools in this shell:")
        console.print(f"export PREFECT_API_URL={cfg.prefect_api_url}", soft_wrap=True)
        console.print(f"export MLFLOW_TRACKING_URI={cfg.mlflow_url}", soft_wrap=True)

    @app.command("down")
    def down() -> None:
        """Stop the workers and servers started by `searchloop up` (their data stays)."""
        from infra import stack

        stopped = stack.down(stack.default_config())
        console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")

    @app.command("status")
    def status() -> None:
        """Show which stack services run, their health and logs."""
        from infra import stack

        cfg = stack.default_config()
        table = Table("service", "pid", "running", "healthy")
        logs = []
        for row in stack.status(cfg):
            healthy = "-" if row["healthy"] is None else ("yes" if row["healthy"] else "[red]no[/]")
            table.add_row(str(row["name"]), str(row["pid"]), "yes" if row["running"] else "[red]no[/]", healthy)
            logs.append((str(row["name"]), str(row["log"])))
        console.print(table)
        console.print("logs (whole paths, one per line):")
        for name, path in logs:  # never cut: a path is copied from here
            console.print(f"  {name}: {path}", soft_wrap=True, markup=False, highlight=False)
        state = stack.live_state()
        if state:
            console.print(f"stack up: Prefect UI {state['prefect_ui_url']}   MLflow UI {state['mlflow_url']}  "
                          "(CLI runs use it)")
        else:
            console.print("stack down: CLI runs use embedded defaults; `searchloop up` starts it")

    @deploy.command("register")
    def deploy_register(
        overrides: list[str] | None = typer.Argument(
            None, show_default=False, help="key.sub=value parameters of the one scheduled deployment, merged into "
            "its defaults and checked here, e.g. config.corpus=my.jsonl (retrain watches that corpus)."),
        schedule: list[str] = typer.Option([], help="flow=SECONDS or flow=CRON: also a scheduled deployment."),
    ) -> None:
        """Register (create or update) a deployment for every flow in flows/, plus FLOW/scheduled per --schedule."""
        for key, dep_id in _register(_parse_schedules(schedule), list(overrides or [])).items():
            console.print(f"deployment {key} ({dep_id})")

    @deploy.command("pool")
    def deploy_pool(
        name: str = typer.Argument(..., help="Work pool name, e.g. gpu-docker or gpu-k8s."),
        pool_type: str = typer.Option("process", "--type", help="Work pool type: process, docker, kubernetes "
                                      "(docker/kubernetes need their prefect extras and a worker of that type)."),
        template: str = typer.Option(None, help="Base job template JSON (see infra/compose/base-job-template-*.json)."),
        concurrency: int = typer.Option(None, help="Pool concurrency limit (e.g. the number of GPUs)."),
    ) -> None:
        """Create or update a work pool with a base job template (validated by the server)."""
        from pathlib import Path

        from infra import stack

        pool = stack.apply_work_pool(_api_url(), name, pool_type, Path(template) if template else None, concurrency)
        console.print(f"work pool {pool['name']} ({pool['type']}), concurrency {pool.get('concurrency_limit')}")

    @deploy.command("run")
    def deploy_run(
        flow_name: str = typer.Argument(..., help=f"Flow: {', '.join(FLOW_NAMES)}."),
        overrides: list[str] | None = typer.Argument(
            None, show_default=False, help="key.sub=value settings on top of the preset (merged into nested "
            "sections), e.g. index.backend=dense; for retrain: config.name=nightly."),
        preset: str | None = typer.Option(None, "--preset", "-p",
                                          help="Preset (see `searchloop presets`); default: the flow's default."),
        deployment: str = typer.Option("default", help="Deployment name of the flow."),
        follow: bool = typer.Option(True, "--follow/--no-follow", help="Stream logs until the run finishes."),
        timeout: float = typer.Option(3600, help="Seconds to follow before giving up."),
        env: list[str] = typer.Option([], help="KEY=VALUE for this run's process, e.g. SEARCHLOOP_DISPATCH=pool."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Check and print the run's parameters and stage plan; "
                                     "submit nothing."),
    ) -> None:
        """Submit a run of FLOW_NAME to the Prefect server (a worker executes it) and follow its logs."""
        from flows.specs import FLOWS

        job_vars = {"env": _parse_env(env)} if env else None
        items = list(overrides or [])
        if flow_name in FLOWS:  # checked before any server is contacted
            from flows.commands._flow import prepare

            prepare(flow_name, preset or FLOWS[flow_name].default_preset, items, dry_run)
            if dry_run:
                return
        else:  # a flow without presets (retrain): its parameters are checked here too, --dry-run included
            from flows import deployments

            if preset is not None:
                raise ConfigError(f"flow {flow_name!r} takes no preset; pass its parameters as key=value "
                                  "(e.g. config.name=nightly)")
            local = deployments.check_parameters(flow_name, items)
            if dry_run:
                console.print(local)
                return
        url = _api_url()  # no server: say so before importing Prefect
        from flows import deployments

        with _prefect_api(url), _server_errors():
            name = f"{flow_name}/{deployment}"
            defaults = {} if flow_name in FLOWS else deployments.deployment_defaults(name)
            params = deployments.run_parameters(flow_name, preset, items, defaults)
            run_id = deployments.submit(name, params, job_variables=job_vars)
            console.print(f"submitted flow run {run_id} of {name} with {params}")
            if not follow:
                return
            final = deployments.follow(run_id, timeout=timeout, on_log=lambda line: console.print(line, markup=False))
        console.print(f"flow run {run_id}: {final}")
        if final != "COMPLETED":
            raise typer.Exit(1)
