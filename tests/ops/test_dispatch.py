"""GPU steps dispatched to the ``gpu`` work pool, against the real stack: a ``build_index`` run on the cpu worker
sends each shard embedding to a process worker of the ``gpu`` pool (``SEARCHLOOP_DISPATCH=pool``). The step's
process is killed (``kill -9``: its worker reports it Crashed), then the whole gpu worker with its child (nobody is
left to report: Prefect's zombie automation marks the run Crashed once its heartbeats stop); the worker is restarted
as a supervisor would; the embed task retries and the flow completes. The stack's runs heartbeat every 30 s
(Prefect's minimum) and the automation's window is three periods (``ops_stack``), so this takes a few minutes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client

from flows import deployments
from infra import artifacts, proc, stack
from tests.ops.conftest import HEARTBEAT, MINI_CORPUS
from tests.ops.helpers import flow_run, task_runs, wait_for

pytestmark = pytest.mark.slow
N_PASSAGES = 1861  # the whole mini corpus


def _step_runs(parent_id: str) -> list:
    """``gpu-step`` flow runs dispatched from a parent flow run, oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[UUID(parent_id)])))
    return sorted((r for r in runs if r.name.startswith("embed-shard-")), key=lambda r: r.created)


def _running_step(parent_id: str, attempt: int):
    """The ``attempt``-th dispatched step once its step task computes and it sent a heartbeat (the zombie
    automation only watches runs that did)."""
    runs = _step_runs(parent_id)
    if len(runs) < attempt or runs[attempt - 1].state.type.value != "RUNNING":
        return None
    run = runs[attempt - 1]
    busy = any(t.state and t.state.type.value == "RUNNING" for t in task_runs(str(run.id)))
    return run if busy and run.infrastructure_pid and _heartbeats(run.id) else None


def _where_things_are(parent_id: str) -> str:
    """The parent's and its step runs' states and the parent's task runs, for a timeout message (CI once waited 300 s
    for step #2 with nothing else to go on)."""
    parent = flow_run(parent_id)
    steps = [(r.name, r.state.name if r.state else None, str(r.created), r.infrastructure_pid)
             for r in _step_runs(parent_id)]
    tasks = [(t.name, t.state.name if t.state else None, t.run_count) for t in task_runs(parent_id)]
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool("gpu")
        workers = [(w.name, w.status, str(w.last_heartbeat_time)) for w in client.read_workers_for_work_pool("gpu")]
        step_tasks = {r.name: [(t.name, t.state.name if t.state else None) for t in task_runs(str(r.id))]
                      for r in _step_runs(parent_id)}
    return (f"parent {parent.state.name if parent.state else None}; step runs {steps}; their task runs {step_tasks}; "
            f"parent task runs {tasks}; gpu pool concurrency {pool.concurrency_limit}, workers {workers}")


def _log_tail(log: Path, lines: int = 40) -> list[str]:
    return log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []


def _kill_when_busy(parent_id: str, attempt: int, worker_log: Path):
    """Wait for the attempt's step to compute for a moment (not mid-request: SQLite-backed servers stall on a
    client killed inside a write), then return it."""
    try:
        run = wait_for(lambda: _running_step(parent_id, attempt), 480, f"dispatched step #{attempt} to run")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {_where_things_are(parent_id)}; gpu worker log tail:\n"
                             + "\n".join(_log_tail(worker_log))) from None
    time.sleep(2)
    assert flow_run(str(run.id)).state.type.value == "RUNNING", f"step #{attempt} ended before it could be killed"
    return run


def _wait_final(run_id: UUID, what: str, timeout: float = 120):
    return wait_for(lambda: (r := flow_run(str(run_id))).state.is_final() and r, timeout, what)


def _heartbeats(run_id: UUID) -> list:
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    flt = EventFilter(event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
                      resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]))
    with get_client(sync_client=True) as client:
        return client.read_events(flt, limit=5).events


def _small_corpus(path: Path, rows: int) -> Path:
    path.write_bytes(b"".join(MINI_CORPUS.read_bytes().splitlines(keepends=True)[:rows]))
    return path


def test_gpu_step_killed_then_worker_killed_task_retries_and_flow_completes(ops_stack, gpu_worker, tmp_path):
    log: list[str] = []

    def say(line: str) -> None:
        log.append(line)
        print(line, flush=True)

    # one shard of the whole mini corpus at 256 tokens: ~20 s of encoding on 2 cores, so a step is still computing
    # when it is killed (128 passages ended in ~3 s on a quiet CI machine: the second kill came after it completed)
    corpus = _small_corpus(tmp_path / "corpus.jsonl", N_PASSAGES)
    params = {"preset": "index_mini_dense", "overrides": [
        "name=dispatch-kill", f"output_dir={tmp_path / 'index'}", "evaluate=false", f"index.corpus={corpus}",
        f"index.shard_size={N_PASSAGES}", "index.encoder.max_length=256"]}
    worker_log = proc.log_file(ops_stack.cfg.run_dir, gpu_worker.name)
    t0 = time.monotonic()
    with ops_stack.client_env():
        pool_env = {"env": {"SEARCHLOOP_DISPATCH": "pool"}}
        run_id = deployments.submit("build-index/default", params, job_variables=pool_env)
        say(f"parent flow run {run_id} submitted to build-index/default (cpu pool) with SEARCHLOOP_DISPATCH=pool")

        # attempt 1: kill -9 the process executing the step; the gpu worker reports it Crashed
        step = _kill_when_busy(run_id, 1, worker_log)
        pid = int(step.infrastructure_pid.rsplit(":", 1)[-1])  # set by the process worker
        os.kill(pid, signal.SIGKILL)
        worker = step.labels["prefect.worker.name"]
        say(f"{time.monotonic() - t0:5.1f}s kill -9 {pid}: step run {step.name} (worker {worker})")
        first = _wait_final(step.id, "the killed step to end")
        say(f"{time.monotonic() - t0:5.1f}s step run {first.name}: {first.state.name}: {first.state.message}")

        # attempt 2 (the embed task's first retry): kill -9 the whole gpu worker with its child, restart it
        step2 = _kill_when_busy(run_id, 2, worker_log)
        info = proc.read_info(ops_stack.cfg.run_dir, gpu_worker.name)
        proc.kill_service(info)
        say(f"{time.monotonic() - t0:5.1f}s kill -9 process group {info.pid}: gpu worker and step run {step2.name}")
        second = _wait_final(step2.id, "the zombie automation to crash the orphaned step", 300)
        say(f"{time.monotonic() - t0:5.1f}s step run {second.name}: {second.state.name}: {second.state.message}")
        restarted = time.time()
        proc.start_service(gpu_worker, ops_stack.cfg.run_dir)  # the supervisor restarts the worker
        # the killed worker stays ONLINE on the server until its heartbeats are missed: wait for the new one's
        waited = stack.wait_worker_online(ops_stack.cfg, "gpu", timeout=120, since=restarted)
        say(f"{time.monotonic() - t0:5.1f}s gpu worker restarted (online after {waited:.1f} s)")

        try:
            final = deployments.follow(run_id, timeout=600, on_log=lambda line: say(f"  | {line}"))
        except TimeoutError as exc:  # CI once waited 400 s for step #3 with nothing else to go on
            raise AssertionError(f"{exc}: {_where_things_are(run_id)}; gpu worker log tail:\n"
                                 + "\n".join(_log_tail(worker_log))) from None
        steps = _step_runs(run_id)
        embed = [t for t in task_runs(run_id) if t.name.startswith("embed-shard")]
    say(f"{time.monotonic() - t0:5.1f}s parent {final}; step runs: {[(r.name, r.state.name) for r in steps]}; "
        f"embed-shard run_count={embed[0].run_count}")
    assert final == "COMPLETED"
    assert [r.state.type.value for r in steps] == ["CRASHED", "CRASHED", "COMPLETED"]
    # the worker reports the first crash (its child's exit code); only the zombie automation is left for the second
    assert "-9" in steps[0].state.message
    assert steps[1].state.message == f"no heartbeat for {3 * HEARTBEAT} s: its worker or node is presumed dead"
    assert len(embed) == 1 and embed[0].state.is_completed() and embed[0].run_count == 3
    manifest = artifacts.read_manifest(tmp_path / "index")
    assert manifest["ref"]["n_passages"] == N_PASSAGES and manifest["ref"]["backend"] == "dense"
