"""Background services: start a process with a log file and a pid file, wait until it is healthy, stop it.

A service is a long-running command (Prefect server, MLflow server, a Prefect worker, the retriever). Each one
gets ``<run_dir>/<name>.pid`` (JSON: pid, process start time, argv, health URL, log path) and
``<run_dir>/<name>.log``. The process starts in its own session so stopping it also stops its children (MLflow
spawns uvicorn and job-runner processes). A pid file whose process is gone, or whose pid now belongs to another
process, counts as stopped. Plain library code: no Prefect import.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import orjson
from pydantic import Field

from infra.config import StrictModel
from infra.errors import SearchloopError

LOG_TAIL_CHARS = 2000


class ServiceError(SearchloopError):
    """A service failed to start, did not become healthy in time, or could not be stopped."""


class ServiceSpec(StrictModel):
    """What to run for one background service."""

    name: str = Field(description="Service name; names the pid and log files (e.g. 'prefect-server').")
    argv: list[str] = Field(description="Command and arguments (no shell).")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the process.")
    cwd: str | None = Field(default=None, description="Working directory (default: the caller's).")
    health_url: str | None = Field(default=None, description="URL answering 2xx when the service is ready.")


class ServiceInfo(StrictModel):
    """A started service as recorded in its pid file."""

    name: str = Field(description="Service name.")
    pid: int = Field(description="Process id of the service's main process (also its process-group id).")
    create_time: float = Field(description="Process start time (psutil), guards against pid reuse.")
    argv: list[str] = Field(description="The command that was run.")
    health_url: str | None = Field(default=None, description="Health URL, if any.")
    log: str = Field(description="Path of the log file (stdout and stderr).")


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def pid_file(run_dir: str | os.PathLike[str], name: str) -> Path:
    """Path of a service's pid file."""
    return Path(run_dir) / f"{name}.pid"


def log_file(run_dir: str | os.PathLike[str], name: str) -> Path:
    """Path of a service's log file."""
    return Path(run_dir) / f"{name}.log"


def log_tail(path: str | os.PathLike[str], chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``chars`` characters of a log file ('' when absent)."""
    p = Path(path)
    if not p.exists():
        return ""
    with p.open("rb") as fh:
        fh.seek(max(0, p.stat().st_size - chars))
        return fh.read().decode("utf-8", errors="replace")


def read_info(run_dir: str | os.PathLike[str], name: str) -> ServiceInfo | None:
    """The recorded service, or None when no pid file exists."""
    p = pid_file(run_dir, name)
    if not p.exists():
        return None
    return ServiceInfo.model_validate(orjson.loads(p.read_bytes()))


def is_running(info: ServiceInfo | None) -> bool:
    """True if the recorded process is alive and is the same process (same start time)."""
    import psutil

    if info is None:
        return False
    try:
        proc = psutil.Process(info.pid)
        return abs(proc.create_time() - info.create_time) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def is_healthy(url: str, timeout: float = 2.0) -> bool:
    """True if GET ``url`` answers with a 2xx status."""
    import httpx

    try:
        return httpx.get(url, timeout=timeout).is_success
    except httpx.HTTPError:
        return False


def wait_healthy(url: str, timeout: float, info: ServiceInfo | None = None, interval: float = 0.25) -> float:
    """Poll ``url`` until it answers 2xx; return the seconds waited.

    Args:
        url: health endpoint.
        timeout: seconds to wait before giving up.
        info: the service being waited for; if its process exits, fail at once with its log tail.
        interval: seconds between polls.

    Raises:
        ServiceError: on timeout or when the process died, with the end of its log.
    """
    start = time.monotonic()
    while True:
        if is_healthy(url):
            return time.monotonic() - start
        if info is not None and not is_running(info):
            raise ServiceError(
                f"service {info.name!r} exited before {url} became healthy; see {info.log}:\n{log_tail(info.log)}"
            )
        if time.monotonic() - start > timeout:
            where = f"; see {info.log}:\n{log_tail(info.log)}" if info else ""
            raise ServiceError(f"{url} not healthy after {timeout:.0f} s (raise the timeout or check the port){where}")
        time.sleep(interval)


def start_service(spec: ServiceSpec, run_dir: str | os.PathLike[str]) -> ServiceInfo:
    """Start ``spec`` in the background (own session, output appended to its log) and write its pid file.

    An already running service of the same name is returned as is (idempotent ``up``).

    Raises:
        ServiceError: if the command cannot be executed.
    """
    import psutil

    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    current = read_info(run, spec.name)
    if is_running(current):
        return current  # type: ignore[return-value]
    log = log_file(run, spec.name)
    env = {**os.environ, **spec.env}
    with log.open("ab") as fh:
        fh.write(f"\n--- start {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: {spec.argv}\n".encode())
        fh.flush()
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
                spec.argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=spec.cwd, start_new_session=True,
            )
        except OSError as exc:
            raise ServiceError(f"cannot start {spec.name!r} ({spec.argv[0]}): {exc}; is it installed?") from exc
    info = ServiceInfo(name=spec.name, pid=proc.pid, create_time=psutil.Process(proc.pid).create_time(),
                       argv=spec.argv, health_url=spec.health_url, log=str(log))
    tmp = pid_file(run, spec.name).with_suffix(".pid.tmp")
    tmp.write_bytes(orjson.dumps(info.model_dump()))
    tmp.replace(pid_file(run, spec.name))
    return info


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to process group ``pid``; a group already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def kill_service(info: ServiceInfo, sig: signal.Signals = signal.SIGKILL) -> None:
    """Send ``sig`` to the service's whole process group at once (used to simulate crashes)."""
    signal_group(info.pid, sig)


def stop_service(run_dir: str | os.PathLike[str], name: str, timeout: float = 15.0) -> bool:
    """Stop a service (SIGTERM to its process group, SIGKILL after ``timeout``) and remove its pid file.

    Returns:
        True if a running process was stopped, False if it was not running.
    """
    import psutil

    info = read_info(run_dir, name)
    running = is_running(info)
    if info is not None and running:
        procs = []
        for pid in [info.pid, *_children(info.pid)]:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
        signal_group(info.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        signal_group(info.pid, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)
    pid_file(run_dir, name).unlink(missing_ok=True)
    return running


def ensure_started(spec: ServiceSpec, run_dir: str | os.PathLike[str], timeout: float = 120.0) -> ServiceInfo:
    """Start ``spec`` if needed and wait until its health URL answers (when it has one)."""
    info = start_service(spec, run_dir)
    if spec.health_url:
        wait_healthy(spec.health_url, timeout, info)
    return info


def exit_on_sigterm(code: int = 143) -> None:
    """Turn SIGTERM into ``SystemExit(code)`` in the main thread, so ``finally`` blocks, context managers and
    ``atexit`` handlers run: a CLI stopped by ``kill`` then stops the services it started (Prefect's temporary
    API server, a retriever or generator subprocess) instead of orphaning them, as the default handler did."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def _raise(signum: int, frame: object) -> None:
        raise SystemExit(code)

    signal.signal(signal.SIGTERM, _raise)
