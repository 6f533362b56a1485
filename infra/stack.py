"""The local stack behind ``searchloop up``: Prefect server, MLflow server and process workers.

Layout under ``<home>/stack`` (state survives ``down``/``up``):
- ``prefect/``: the Prefect server's home (its sqlite database ``prefect.db``);
- ``mlflow/mlflow.db`` + ``mlflow/artifacts/``: the MLflow backend store and artifact store (or ``s3://``);
- ``run/``: pid and log files of every service (see ``infra.proc``), ``stack.json`` with the URLs.

Workers are ``prefect worker start --type process`` for the ``cpu`` pool and, when CUDA is present, the ``gpu``
pool (pool and tag ``gpu`` concurrency = number of GPUs). Prefect is driven through its CLI and REST API (this is
library code: no Prefect import).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import tenacity
from pydantic import Field

from infra import proc
from infra.config import StrictModel, redact_env
from infra.settings import REPO_ROOT, get_settings, prefect_results_dir

PREFECT = "prefect-server"
MLFLOW = "mlflow-server"
ZOMBIE_AUTOMATION = "searchloop: crash zombie flow runs"
# Prefect's default flow-run heartbeat period (PREFECT_FLOWS_HEARTBEAT_FREQUENCY). Every run against the stack sends
# heartbeats at this period unless its own environment says otherwise (CLI runs included), so the zombie automation
# must allow for it: a shorter window would crash live runs between two heartbeats.
HEARTBEAT_SECONDS = 180
HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"


class StackConfig(StrictModel):
    """Where the local stack lives and how it listens."""

    home: Path = Field(description="Stack directory (databases, artifacts, pid and log files).")
    host: str = Field(default="127.0.0.1", description="Bind address of every server (keep it local).")
    prefect_port: int = Field(default=4200, description="Prefect server (API + UI) port.")
    mlflow_port: int = Field(default=5000, description="MLflow tracking server port.")
    mlflow_artifacts: str | None = Field(
        default=None, description="MLflow artifact destination (path or s3://); default <home>/mlflow/artifacts."
    )
    pools: list[str] | None = Field(
        default=None, description="Work pools to start process workers for; default cpu, plus gpu with CUDA."
    )
    scheduler_loop_seconds: float = Field(default=10, description="How often the Prefect scheduler creates runs.")
    worker_query_seconds: float = Field(default=5, description="How often workers poll for scheduled runs.")
    startup_timeout: float = Field(default=180, description="Seconds to wait for each server to become healthy.")
    extra_env: dict[str, str] = Field(default_factory=dict, description="Extra environment for workers and servers.")

    @property
    def run_dir(self) -> Path:
        """Pid/log directory."""
        return self.home / "run"

    @property
    def prefect_api_url(self) -> str:
        """Prefect API URL (``PREFECT_API_URL`` for clients)."""
        return f"http://{self.host}:{self.prefect_port}/api"

    @property
    def prefect_ui_url(self) -> str:
        """Prefect UI URL."""
        return f"http://{self.host}:{self.prefect_port}"

    @property
    def mlflow_url(self) -> str:
        """MLflow tracking URI (``MLFLOW_TRACKING_URI`` for clients)."""
        return f"http://{self.host}:{self.mlflow_port}"


def default_config(**overrides: object) -> StackConfig:
    """Stack config under the data home (``<SEARCHLOOP_HOME>/stack``) with the standard ports."""
    return StackConfig(home=get_settings().home / "stack", **overrides)  # type: ignore[arg-type]


def _bin(name: str) -> str:
    """A console script installed next to the running interpreter (falls back to PATH)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def cuda_device_count() -> int:
    """Number of CUDA devices torch sees (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def prefect_spec(cfg: StackConfig) -> proc.ServiceSpec:
    """The Prefect server service (its own home and sqlite DB under the stack)."""
    env = {
        "PREFECT_HOME": str(cfg.home / "prefect"),
        "PREFECT_SERVER_MEMO_STORE_PATH": str(cfg.home / "prefect" / "memo_store.toml"),  # not the shared ~/.prefect
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": str(cfg.scheduler_loop_seconds),
        "PREFECT_SERVER_API_HOST": cfg.host,
        "PREFECT_SERVER_API_PORT": str(cfg.prefect_port),
        **cfg.extra_env,
    }
    argv = [_bin("prefect"), "server", "start", "--host", cfg.host, "--port", str(cfg.prefect_port)]
    return proc.ServiceSpec(name=PREFECT, argv=argv, env=env, health_url=f"{cfg.prefect_api_url}/health")


def mlflow_spec(cfg: StackConfig) -> proc.ServiceSpec:
    """The MLflow tracking server (sqlite backend, proxied artifact store)."""
    db = cfg.home / "mlflow" / "mlflow.db"
    artifacts = cfg.mlflow_artifacts or str(cfg.home / "mlflow" / "artifacts")
    argv = [
        _bin("mlflow"), "server", "--backend-store-uri", f"sqlite:///{db}", "--artifacts-destination", artifacts,
        "--host", cfg.host, "--port", str(cfg.mlflow_port), "--workers", "1",
    ]
    return proc.ServiceSpec(name=MLFLOW, argv=argv, env=dict(cfg.extra_env), health_url=f"{cfg.mlflow_url}/health")


def worker_env(cfg: StackConfig) -> dict[str, str]:
    """Environment of workers (and of the flow runs they spawn): where the servers and the code are."""
    pythonpath = os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p)
    return {
        "PREFECT_API_URL": cfg.prefect_api_url,
        "PREFECT_HOME": str(cfg.home / "worker-prefect-home"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(prefect_results_dir()),  # caches shared with CLI runs
        "PREFECT_WORKER_QUERY_SECONDS": str(cfg.worker_query_seconds),
        "MLFLOW_TRACKING_URI": cfg.mlflow_url,
        "SEARCHLOOP_HOME": str(get_settings().home),
        "PYTHONPATH": pythonpath,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "DO_NOT_TRACK": "1",  # Prefect's client telemetry (the servers' is PREFECT_SERVER_ANALYTICS_ENABLED=false)
        # the library's own INFO lines (stage counts, warnings) in the flow-run log a user reads in the UI
        "PREFECT_LOGGING_EXTRA_LOGGERS": "training,retrieval,evaluation",
        **cfg.extra_env,
    }


def worker_spec(cfg: StackConfig, pool: str) -> proc.ServiceSpec:
    """A process worker polling ``pool`` (creates the pool on first start)."""
    argv = [_bin("prefect"), "worker", "start", "--pool", pool, "--type", "process", "--name", worker_name(pool)]
    return proc.ServiceSpec(name=f"worker-{pool}", argv=argv, env=worker_env(cfg), cwd=str(REPO_ROOT))


def worker_name(pool: str) -> str:
    """Name our worker registers under in ``pool``."""
    return f"searchloop-{pool}"


def wait_worker_online(cfg: StackConfig, pool: str, timeout: float = 120.0, since: float | None = None) -> float:
    """Wait until our worker reports a heartbeat to the server; returns seconds waited.

    Args:
        cfg: the stack.
        pool: the worker's pool.
        timeout: seconds to wait.
        since: a restart's time (``time.time()``): wait for a heartbeat sent after it. A worker killed without a
            word stays ONLINE on the server until its heartbeats are missed, so without ``since`` a restart
            would look done before the new process came up.

    Raises:
        proc.ServiceError: with the worker log tail on timeout or worker exit.
    """
    start = time.monotonic()
    name = f"worker-{pool}"
    while time.monotonic() - start < timeout:
        try:
            r = _request("POST", f"{cfg.prefect_api_url}/work_pools/{pool}/workers/filter", json={}, timeout=5)
            if r.is_success and any(_online(w, since) for w in r.json() if w["name"] == worker_name(pool)):
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        if not proc.is_running(proc.read_info(cfg.run_dir, name)):
            raise proc.ServiceError(f"{name} exited; see {proc.log_file(cfg.run_dir, name)}:\n"
                                    f"{proc.log_tail(proc.log_file(cfg.run_dir, name))}")
        time.sleep(0.5)
    raise proc.ServiceError(f"{name} did not come online in {timeout:.0f} s; see {proc.log_file(cfg.run_dir, name)}")


def _online(worker: dict, since: float | None) -> bool:
    """A worker record is ONLINE and, with ``since``, heartbeat after that moment (epoch seconds)."""
    if worker.get("status") != "ONLINE":
        return False
    if since is None:
        return True
    beat = worker.get("last_heartbeat_time")
    return beat is not None and datetime.fromisoformat(beat.replace("Z", "+00:00")).timestamp() >= since


def _request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One call to the Prefect REST API, retried (6 tries, 0.5-4 s apart, ~11 s in all) on a dropped connection or a
    503, which a busy SQLite-backed server answers when a write waits on a lock (Prefect's own client retries these
    too). CI's shared cores once held such a lock past the 3.5 s of 4 tries (2026-11-30, a DELETE of a tag limit)."""
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(6), wait=tenacity.wait_exponential(multiplier=0.5, max=4), reraise=True,
        retry=tenacity.retry_if_exception_type(httpx.TransportError)
        | tenacity.retry_if_result(lambda r: r.status_code == 503),
        retry_error_callback=lambda state: state.outcome.result())  # the last 503 goes to the caller
    return retrying(httpx.request, method, url, **kwargs)


def limit_gpu_concurrency(cfg: StackConfig, n_gpus: int) -> None:
    """One run per GPU: ``gpu`` pool concurrency and the ``gpu`` task-tag concurrency limit both = ``n_gpus``."""
    api = cfg.prefect_api_url
    _request("PATCH", f"{api}/work_pools/gpu", json={"concurrency_limit": n_gpus}, timeout=10).raise_for_status()
    _request("POST", f"{api}/concurrency_limits/", json={"tag": "gpu", "concurrency_limit": n_gpus},
             timeout=10).raise_for_status()


def ensure_zombie_automation(cfg: StackConfig, missed_heartbeats: int = 3,
                             heartbeat_seconds: int = HEARTBEAT_SECONDS) -> str:
    """Create (or update) Prefect's own zombie-run detection on the stack's server: an automation that marks a flow
    run Crashed when it sent no heartbeat for ``missed_heartbeats`` periods of ``heartbeat_seconds`` and did not
    finish (Prefect's documented recipe, docs.prefect.io/v3/advanced/detect-zombie-flows). Returns its id.

    A Crashed run is then retried by its caller like any other crash (a dispatched gpu step: the calling task's
    retries), whoever started it and wherever its worker died.
    """
    return ensure_zombie_automation_at(cfg.prefect_api_url, missed_heartbeats * heartbeat_seconds)


def ensure_zombie_automation_at(api: str, within: int, replace: bool = True) -> str:
    """Make sure the Prefect server at ``api`` has the zombie automation (window ``within`` seconds); returns its id.

    With ``replace`` an existing one with another window is replaced; without, any existing one is kept (what a
    dispatching task does: the stack's owner chose the window).
    """
    found = _request("POST", f"{api}/automations/filter", json={}, timeout=15)
    found.raise_for_status()
    for automation in found.json():
        if automation["name"] == ZOMBIE_AUTOMATION:
            if automation["trigger"].get("within") == within or not replace:
                return automation["id"]
            _request("DELETE", f"{api}/automations/{automation['id']}", timeout=15).raise_for_status()  # outdated
    body = {
        "name": ZOMBIE_AUTOMATION,
        "description": "A Running flow run that stopped sending heartbeats (worker or node killed) becomes Crashed.",
        "enabled": True,
        "trigger": {
            "type": "event", "posture": "Proactive", "threshold": 1,
            "within": within,
            "after": ["prefect.flow-run.heartbeat"],
            "expect": ["prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                       "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"],
            "match": {"prefect.resource.id": ["prefect.flow-run.*"]},
            "for_each": ["prefect.resource.id"],
        },
        "actions": [{"type": "change-flow-run-state", "state": "CRASHED",
                     "message": f"no heartbeat for {within} s: its worker or node is presumed dead"}],
    }
    r = _request("POST", f"{api}/automations/", json=body, timeout=15)
    r.raise_for_status()
    return r.json()["id"]


def write_state(cfg: StackConfig) -> None:
    """Record the stack's URLs in ``run/stack.json`` (read by ``searchloop status`` and ``run --deployment``)."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "stack.json").write_bytes(orjson.dumps(
        {"prefect_api_url": cfg.prefect_api_url, "prefect_ui_url": cfg.prefect_ui_url, "mlflow_url": cfg.mlflow_url,
         "config": {**cfg.model_dump(mode="json"), "extra_env": redact_env(cfg.extra_env)}},
        option=orjson.OPT_INDENT_2))


def read_state(home: Path | None = None) -> dict | None:
    """The recorded stack (URLs and config), or None when ``up`` never ran."""
    run = (home or default_config().home) / "run" / "stack.json"
    return orjson.loads(run.read_bytes()) if run.exists() else None


def live_state(home: Path | None = None, timeout: float = 0.5) -> dict | None:
    """The recorded stack when its Prefect and MLflow servers answer now, else None (never started, or down).

    Used by every command to run against the stack ``searchloop up`` started instead of embedded defaults.
    """
    state = read_state(home)
    if state is None:
        return None
    for url in (f"{state['prefect_api_url']}/health", f"{state['mlflow_url']}/health"):
        try:
            if not httpx.get(url, timeout=timeout).is_success:
                return None
        except httpx.HTTPError:
            return None
    return state


def up(cfg: StackConfig) -> dict[str, float]:
    """Start (or keep) the Prefect server, the MLflow server and the workers; returns seconds per step.

    The two servers start in parallel. Raises ``proc.ServiceError`` naming the failed service and its log.
    """
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    (cfg.home / "mlflow").mkdir(parents=True, exist_ok=True)
    specs = [prefect_spec(cfg), mlflow_spec(cfg)]
    for spec, port in zip(specs, (cfg.prefect_port, cfg.mlflow_port), strict=True):
        if not proc.is_running(proc.read_info(cfg.run_dir, spec.name)) and proc.port_open(cfg.host, port):
            raise proc.ServiceError(f"port {port} on {cfg.host} is taken by another process; stop it or choose "
                                    f"another port (searchloop up --{spec.name.split('-')[0]}-port N)")
    infos = [proc.start_service(s, cfg.run_dir) for s in specs]
    for spec, info in zip(specs, infos, strict=True):
        proc.wait_healthy(spec.health_url or "", cfg.startup_timeout, info)
        timings[spec.name] = time.monotonic() - t0
    pools = cfg.pools if cfg.pools is not None else (["cpu", "gpu"] if cuda_device_count() else ["cpu"])
    for pool in pools:
        proc.start_service(worker_spec(cfg, pool), cfg.run_dir)
    for pool in pools:
        timings[f"worker-{pool}"] = wait_worker_online(cfg, pool)
    if "gpu" in pools:
        limit_gpu_concurrency(cfg, max(1, cuda_device_count()))
    # the window follows the heartbeat period the stack's runs are given (extra_env), else Prefect's default
    ensure_zombie_automation(cfg, heartbeat_seconds=int(cfg.extra_env.get(HEARTBEAT_ENV, HEARTBEAT_SECONDS)))
    write_state(cfg)
    return timings


def service_names(cfg: StackConfig) -> list[str]:
    """Names of every service with a pid file (servers and workers)."""
    return sorted(p.stem for p in cfg.run_dir.glob("*.pid")) if cfg.run_dir.exists() else []


def down(cfg: StackConfig, timeout: float = 15.0) -> list[str]:
    """Stop workers first, then the servers (SIGKILL after ``timeout`` s); data stays. Returns what was running."""
    names = service_names(cfg)
    ordered = [n for n in names if n.startswith("worker-")] + [n for n in names if not n.startswith("worker-")]
    return [n for n in ordered if proc.stop_service(cfg.run_dir, n, timeout=timeout)]


def status(cfg: StackConfig) -> list[dict[str, object]]:
    """One row per known service: name, pid, running, healthy (None without a health URL), log path."""
    rows = []
    for name in service_names(cfg):
        info = proc.read_info(cfg.run_dir, name)
        running = proc.is_running(info)
        healthy = proc.is_healthy(info.health_url) if (running and info and info.health_url) else None
        rows.append({"name": name, "pid": info.pid if info else None, "running": running, "healthy": healthy,
                     "url": info.health_url if info else None, "log": info.log if info else None})
    return rows


COMPOSE_DIR = Path(__file__).resolve().parent / "compose"


def apply_work_pool(api_url: str, name: str, pool_type: str, template: Path | None = None,
                    concurrency_limit: int | None = None) -> dict:
    """Create or update a work pool (e.g. ``gpu-docker`` of type ``docker`` with our base job template).

    The server validates the template (every ``{{ var }}`` must be declared under ``variables``).

    Raises:
        httpx.HTTPStatusError: when the server rejects the pool or template.
    """
    body: dict = {"name": name, "type": pool_type, "concurrency_limit": concurrency_limit}
    if template is not None:
        body["base_job_template"] = orjson.loads(Path(template).read_bytes())
    r = _request("POST", f"{api_url}/work_pools/", json=body, timeout=15)
    if r.status_code == 409:  # exists: update template and limit
        body.pop("name")
        body.pop("type")
        _request("PATCH", f"{api_url}/work_pools/{name}", json=body, timeout=15).raise_for_status()
        r = _request("GET", f"{api_url}/work_pools/{name}", timeout=15)
    r.raise_for_status()
    return r.json()
