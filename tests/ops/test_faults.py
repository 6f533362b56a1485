"""Faults against the real stack: the live retriever killed mid-run (the task retries, the flow completes); the
MLflow server down (the run fails clearly, nothing built is lost, a rerun after restart logs without rebuilding);
the Prefect server restarted (deployments, runs and the worker survive)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flows import deployments
from infra import artifacts, proc, stack
from retrieval import sync
from retrieval.index import IndexBuildConfig, build_index
from tests.ops.helpers import flow_run, mlflow_runs, task_runs, wait_for

pytestmark = pytest.mark.slow


def _champion_index(corpus: Path, out: Path) -> str:
    return build_index(IndexBuildConfig(corpus=str(corpus)), out).uri


def test_retriever_killed_mid_run_task_retries_and_flow_completes(ops_stack, corpus_copy, tmp_path,
                                                                  retriever_service):
    index = _champion_index(corpus_copy, tmp_path / "champion")
    spec, run_dir = retriever_service(index)
    url = spec.health_url.removesuffix("/health")
    params = {"config": {"corpus": str(corpus_copy), "state_root": str(tmp_path / "state"), "name": "fault",
                         "retriever_url": url, "trainer": "none"}}
    with ops_stack.client_env():
        run_id = deployments.submit("retrain/default", params)
        # the worker has taken the run: kill the retriever the run depends on (SIGKILL, whole process group)
        wait_for(lambda: flow_run(run_id).state.type.value in {"PENDING", "RUNNING"}, 60, "the worker to start it")
        proc.kill_service(proc.read_info(run_dir, "retriever"))

        def live_task_failed_once():
            runs = [t for t in task_runs(run_id) if t.name.startswith("evaluate-live-retriever")]
            return runs and runs[0].state and runs[0].state.name in {"AwaitingRetry", "Retrying"}

        wait_for(live_task_failed_once, 90, "the live-retriever task to fail and schedule a retry")
        retriever_service(index, port=int(url.rsplit(":", 1)[1]))  # restart on the same port
        final = deployments.follow(run_id, timeout=120, on_log=lambda _: None)
        live = [t for t in task_runs(run_id) if t.name.startswith("evaluate-live-retriever")][0]
    assert final == "COMPLETED"
    assert live.state.is_completed() and live.run_count >= 2


def test_mlflow_down_fails_clearly_keeps_artifacts_and_rerun_resumes(ops_stack, corpus_copy, tmp_path):
    from flows.retrain import RetrainConfig, retrain
    from tasks.ops import TrackingUnavailable

    down_uri = f"http://127.0.0.1:{proc.free_port()}"  # an MLflow server that is down: nothing listens there
    cfg = RetrainConfig(trainer="none", corpus=str(corpus_copy), state_root=str(tmp_path / "state"), name="mlflow-down")
    with ops_stack.client_env(mlflow_uri=down_uri), pytest.raises(TrackingUnavailable, match="is not reachable"):
        retrain(cfg)
    state_dir = tmp_path / "state" / "mlflow-down"
    built = list((state_dir / "indexes").iterdir())
    assert len(built) == 1 and artifacts.read_manifest(built[0])["ref"]["n_passages"] == 1861  # the index survived
    assert sync.read_state(state_dir) is None  # corpus not marked processed: the rerun will log it

    with ops_stack.client_env():  # the tracking server is back
        result = retrain(cfg)
    assert result.status == "promoted" and result.index_reused and result.index_dir == str(built[0])
    assert result.mlflow_run_id in {r.info.run_id for r in mlflow_runs(ops_stack.cfg.mlflow_url)}


def test_prefect_server_restart_keeps_deployments_runs_and_worker(ops_stack):
    from prefect.client.orchestration import get_client

    with ops_stack.client_env(), get_client(sync_client=True) as client:
        runs_before = {r.id for r in client.read_flow_runs()}
    assert runs_before
    assert proc.stop_service(ops_stack.cfg.run_dir, stack.PREFECT)
    start = time.monotonic()
    proc.ensure_started(stack.prefect_spec(ops_stack.cfg), ops_stack.cfg.run_dir, timeout=120)
    restart_s = time.monotonic() - start
    with ops_stack.client_env(), get_client(sync_client=True) as client:
        assert runs_before <= {r.id for r in client.read_flow_runs()}
        assert client.read_deployment_by_name("retrain/default").entrypoint == "flows.retrain.retrain"
    stack.wait_worker_online(ops_stack.cfg, "cpu", timeout=60)
    print(f"prefect server warm restart: {restart_s:.1f} s")
