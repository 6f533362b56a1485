"""Ray fan-out: ``build_index`` with ``parallel.task_runner=ray`` sends its shard-embedding tasks through
``prefect_ray.RayTaskRunner`` to a local Ray cluster (2 CPUs), each task a Prefect task run reported to the real
Prefect server of the test stack; Ray's state API shows the tasks ran in Ray worker processes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from flows.fanout import FanOutConfig, make_task_runner, ray_env
from infra import proc
from tests.ops.conftest import MINI_CORPUS
from tests.ops.helpers import task_runs, wait_for

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray", reason="prefect-ray/ray not installed (pip install prefect-ray==0.6.0 ray==2.60.0)")


def test_make_task_runner_local_instance_options():
    runner = make_task_runner(FanOutConfig(task_runner="ray", ray_num_cpus=2))
    assert runner.address is None and runner.init_kwargs["num_cpus"] == 2
    assert runner.init_kwargs["include_dashboard"] is False and runner.init_kwargs["_node_ip_address"] == "127.0.0.1"
    assert runner.init_kwargs["runtime_env"]["env_vars"]["PYTHONPATH"].startswith(str(Path(__file__).parents[2]))
    remote = make_task_runner(FanOutConfig(task_runner="ray", ray_address="ray://10.0.0.5:10001"))
    assert remote.address == "ray://10.0.0.5:10001" and "num_cpus" not in remote.init_kwargs


@pytest.fixture()
def local_ray():
    """A local Ray cluster with 2 CPUs and its state API (bound to 127.0.0.1); the flow's runner reuses it."""
    ctx = ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=True, dashboard_host="127.0.0.1",
                   dashboard_port=proc.free_port(), log_to_driver=False, runtime_env={"env_vars": ray_env()})
    yield ctx
    ray.shutdown()


def test_build_index_fans_shard_embeddings_out_over_ray(ops_stack, local_ray, tmp_path):
    import yaml
    from ray.util.state import list_tasks

    from flows.build_index import build_index_flow
    from infra import artifacts

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b"".join(MINI_CORPUS.read_bytes().splitlines(keepends=True)[:192]))
    preset = tmp_path / "ray-fan-out.yaml"
    preset.write_text(yaml.safe_dump({
        "name": "ray-fan-out", "output_dir": str(tmp_path / "index"), "evaluate": False,
        "index": {"corpus": str(corpus), "backend": "dense", "shard_size": 64, "encoder": {"max_length": 128}},
        "parallel": {"task_runner": "ray", "num_cpus": 1},
    }))
    start = time.monotonic()
    with ops_stack.client_env():
        state = build_index_flow(str(preset), return_state=True)
        result = state.result()
        parent_tasks = task_runs(str(state.state_details.flow_run_id))
    seconds = time.monotonic() - start
    def ray_tasks_finished() -> list:
        tasks = list(list_tasks(filters=[("name", "=", "embed-shard")], detail=True))
        return tasks if len(tasks) == 3 and {t.state for t in tasks} == {"FINISHED"} else []

    # Ray's state API catches up with its workers asynchronously: a task that returned can still read RUNNING for a
    # moment (seen once under load), so poll before asserting
    try:
        ray_tasks = wait_for(ray_tasks_finished, 60, "Ray's state API to list 3 finished embed-shard tasks")
    except AssertionError:
        ray_tasks = list(list_tasks(filters=[("name", "=", "embed-shard")], detail=True))
    print(f"ray fan-out build of 192 passages in 3 shards: {seconds:.1f} s; ray tasks "
          f"{[(t.state, t.worker_pid) for t in ray_tasks]}; test pid {os.getpid()}")
    assert state.is_completed() and result.index.n_passages == 192
    assert artifacts.read_manifest(tmp_path / "index")["ref"]["n_passages"] == 192
    assert len(ray_tasks) == 3 and {t.state for t in ray_tasks} == {"FINISHED"}
    assert os.getpid() not in {t.worker_pid for t in ray_tasks}
    assert not [t for t in parent_tasks if t.name.startswith("embed-shard")]  # they ran in the fan-out subflow
