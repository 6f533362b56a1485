"""Fast tests of the dispatch and fan-out building blocks (no server): step table, JSON round trip of pydantic
refs, mode selection, in-process default, task runner choice, sequential fan-out."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.fanout import FanOutConfig, make_task_runner, task_gpus
from infra.errors import ConfigError
from retrieval.encoders import EncoderConfig
from retrieval.store import ShardSpec
from tasks import dispatch


def test_encode_decode_roundtrip_keeps_pydantic_refs():
    spec = ShardSpec.model_validate({"index": 0, "start": 0, "stop": 64, "content_hash": "ab" * 32})
    kwargs = {"store_dir": Path("/x/store"), "spec": spec, "encoder": EncoderConfig(max_length=64), "k": [1, 2]}
    wire = dispatch.encode(kwargs)
    assert wire["store_dir"] == "/x/store" and wire["spec"]["__model__"] == "retrieval.store:ShardSpec"
    back = dispatch.decode(wire)
    assert back["spec"] == spec and back["encoder"] == EncoderConfig(max_length=64) and back["k"] == [1, 2]


def test_decode_refuses_classes_outside_our_packages():
    with pytest.raises(ConfigError, match="refusing to rebuild 'os:system'"):
        dispatch.decode({"__model__": "os:system", "data": {}})
    with pytest.raises(ConfigError, match="is not a pydantic model"):
        dispatch.decode({"__model__": "infra.errors:ConfigError", "data": {}})


def test_unknown_step_is_refused_with_the_known_names():
    with pytest.raises(ConfigError, match=r"unknown step 'rm_rf'; choose one of: embed-shard, evaluate-dataset"):
        dispatch.resolve_step("rm_rf")


def test_dispatch_mode_defaults_local_and_validates(monkeypatch):
    monkeypatch.delenv(dispatch.DISPATCH_ENV, raising=False)
    assert dispatch.dispatch_mode() == "local"
    monkeypatch.setenv(dispatch.DISPATCH_ENV, "gpu")
    with pytest.raises(ConfigError, match="use 'local' \\(default\\) or 'pool'"):
        dispatch.dispatch_mode()
    monkeypatch.setenv(dispatch.DISPATCH_ENV, "pool")
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: None}), pytest.raises(ConfigError, match="needs a Prefect"):
        dispatch.dispatch_mode()
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:1/api"}):
        assert dispatch.dispatch_mode() == "pool"


PROBE_CALLS: list[dict] = []


def _probe(**kwargs) -> str:
    PROBE_CALLS.append(kwargs)
    return "done"


def test_run_step_local_calls_the_library_function(monkeypatch):
    monkeypatch.delenv(dispatch.DISPATCH_ENV, raising=False)
    monkeypatch.setitem(dispatch.STEPS, "probe", f"{__name__}:_probe")
    assert dispatch.run_step("probe", a=1) == "done" and PROBE_CALLS == [{"a": 1}]


def test_fan_out_runner_choice_and_gpu_default():
    assert type(make_task_runner(FanOutConfig(task_runner="threads", max_workers=3))).__name__ == "ThreadPoolTaskRunner"
    with pytest.raises(ConfigError, match="runs in the flow itself"):
        make_task_runner(FanOutConfig())
    assert task_gpus(FanOutConfig(num_gpus=0.5)) == 0.5
    from infra.stack import cuda_device_count

    assert task_gpus(FanOutConfig()) == (1.0 if cuda_device_count() else 0.0)


def test_sequential_fan_out_calls_in_order(prefect_harness):
    from prefect import flow, task

    from flows.fanout import map_task

    @task
    def double(x: int) -> int:
        return 2 * x

    @flow
    def parent(mode: str) -> list[int]:
        return map_task(double, [{"x": i} for i in range(4)], FanOutConfig(task_runner=mode))

    assert parent("sequential") == [0, 2, 4, 6]
    assert parent("threads") == [0, 2, 4, 6]


def test_pool_dispatch_ensures_the_zombie_automation_once_per_server(monkeypatch):
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from infra import stack

    calls = []
    monkeypatch.setattr(stack, "ensure_zombie_automation_at", lambda api, within, replace: calls.append(
        (api, within, replace)) or "id")
    monkeypatch.setattr(dispatch, "_AUTOMATION_CHECKED", set())
    settings = {PREFECT_API_URL: "http://127.0.0.1:1/api/", PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}
    with temporary_settings(updates=settings):
        dispatch.ensure_crash_detection()
        dispatch.ensure_crash_detection()
    assert calls == [("http://127.0.0.1:1/api", 90, False)]


def test_deploy_run_env_and_up_dispatch_options_are_checked():
    from flows.commands.ops import _parse_env

    assert _parse_env(["SEARCHLOOP_DISPATCH=pool", "A=b=c"]) == {"SEARCHLOOP_DISPATCH": "pool", "A": "b=c"}
    with pytest.raises(ConfigError, match="must be KEY=VALUE"):
        _parse_env(["SEARCHLOOP_DISPATCH"])


class _Runs:
    """A fake Prefect client whose flow run reads Running ``running_reads`` times, then ``final`` (or Running on)."""

    def __init__(self, running_reads: int, final: str | None):
        from prefect.client.schemas.objects import FlowRun

        self.run = FlowRun(name="embed-shard-x", flow_id="00000000-0000-0000-0000-000000000001")
        self.running_reads, self.final, self.reads, self.set_states = running_reads, final, 0, []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def read_flow_run(self, flow_run_id):
        from prefect.states import Crashed, Running

        self.reads += 1
        ended = self.final is not None and self.reads > self.running_reads
        return self.run.model_copy(update={"state": Crashed(message="infrastructure exited") if ended else Running()})

    def set_flow_run_state(self, flow_run_id, state, force=False):
        self.set_states.append(state.type.value)


def _events_never_arrive(monkeypatch, runs: _Runs) -> list[int]:
    """Prefect's event-driven wait times out every window (the final-state event is lost); the client is ``runs``."""
    import prefect.client.orchestration
    import prefect.flow_runs
    from prefect.exceptions import FlowRunWaitTimeout

    windows: list[int] = []

    async def wait(flow_run_id, timeout=None):
        windows.append(timeout)
        raise FlowRunWaitTimeout("no event")

    monkeypatch.setattr(prefect.flow_runs, "wait_for_flow_run", wait)
    monkeypatch.setattr(prefect.client.orchestration, "get_client", lambda sync_client=False: runs)
    return windows


def test_wait_for_run_reads_the_state_when_its_final_event_never_arrives(monkeypatch, caplog):
    """CI once waited 480 s on a step run the server had marked Crashed: the event-driven wait never returned."""
    import uuid

    runs = _Runs(running_reads=2, final="CRASHED")
    windows = _events_never_arrive(monkeypatch, runs)
    with caplog.at_level("WARNING"):
        final = dispatch.wait_for_run(uuid.uuid4(), timeout=None, poll_seconds=0.01)
    assert final.state.type.value == "CRASHED" and runs.reads == 3 and windows == [1, 1, 1]
    assert "found by reading its state after 3 waits" in caplog.text


def test_wait_for_run_cancels_a_run_still_unfinished_at_the_timeout(monkeypatch):
    import uuid

    runs = _Runs(running_reads=0, final=None)
    _events_never_arrive(monkeypatch, runs)
    with pytest.raises(dispatch.StepFailed, match=r"still RUNNING after 0 s; is a worker polling its pool"):
        dispatch.wait_for_run(uuid.uuid4(), timeout=0.05, poll_seconds=0.01)
    assert runs.set_states == ["CANCELLED"] and runs.reads >= 2
