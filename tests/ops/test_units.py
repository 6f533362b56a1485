"""Fast unit tests for the ops building blocks: gate, corpus diff, service manager, CLI parsing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from evaluation.gate import decide_promotion, recall_gate_value
from infra import proc
from infra.errors import ConfigError
from retrieval import sync
from retrieval.types import Passage


def test_gate_promotes_without_incumbent_and_respects_min_delta():
    assert decide_promotion("r@5", 0.5, None).promote
    assert decide_promotion("r@5", 0.79, 0.80, min_delta=-0.02).promote
    rejected = decide_promotion("r@5", 0.70, 0.80, min_delta=-0.02)
    assert not rejected.promote and "fails the gate" in rejected.reason and "-0.1000" in rejected.reason
    assert not decide_promotion("f1", 0.81, 0.80, min_delta=0.05).promote


def test_recall_gate_value_averages_scored_datasets():
    from retrieval.recall import DatasetRecall, RecallReport

    def ds(name: str, n: int, r5: float) -> DatasetRecall:
        return DatasetRecall(dataset=name, n=n, skipped=0, any_gold={5: r5}, all_gold={5: 0.0},
                             mean_fraction={5: 0.0})

    report = RecallReport(index="x", ks=[5], datasets=[ds("a", 10, 0.8), ds("b", 5, 0.4), ds("bamboogle", 0, 0.0)])
    assert recall_gate_value(report, 5) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="recall@10 not available"):
        recall_gate_value(report, 10)


def test_diff_passages_sorts_added_changed_deleted():
    old = sync.passage_hashes([Passage(id="1", text="a"), Passage(id="2", text="b"), Passage(id="3", text="c")])
    new = sync.passage_hashes([Passage(id="1", text="a"), Passage(id="2", text="B"), Passage(id="4", text="d")])
    diff = sync.diff_passages(old, new)
    assert (diff.added, diff.changed, diff.deleted, diff.unchanged, diff.total) == (["4"], ["2"], ["3"], 1, 3)


def test_check_and_commit_state_roundtrip(tmp_path: Path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "text": "a"}\n')
    check = sync.check_corpus(corpus, tmp_path / "state")
    assert check.changed and check.previous_sha256 is None
    sync.commit_state(tmp_path / "state", check, [Passage(id="1", text="a")], "idx", {"champion_index": "idx"})
    again = sync.check_corpus(corpus, tmp_path / "state")
    assert not again.changed and again.previous_index == "idx"


def test_service_start_health_stop(tmp_path: Path):
    port = proc.free_port()
    spec = proc.ServiceSpec(name="http", argv=[sys.executable, "-m", "http.server", str(port), "-b", "127.0.0.1"],
                            health_url=f"http://127.0.0.1:{port}/", cwd=str(tmp_path))
    info = proc.ensure_started(spec, tmp_path / "run", timeout=30)
    assert proc.is_running(info) and proc.start_service(spec, tmp_path / "run").pid == info.pid  # idempotent
    assert proc.stop_service(tmp_path / "run", "http")
    assert not proc.is_running(info) and proc.read_info(tmp_path / "run", "http") is None
    assert not proc.stop_service(tmp_path / "run", "http")


def test_service_that_dies_reports_its_log(tmp_path: Path):
    spec = proc.ServiceSpec(name="bad", argv=[sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
                            health_url=f"http://127.0.0.1:{proc.free_port()}/")
    with pytest.raises(proc.ServiceError, match="(?s)exited before .*boom"):
        proc.ensure_started(spec, tmp_path / "run", timeout=30)


def test_wait_healthy_times_out_with_hint():
    with pytest.raises(proc.ServiceError, match="not healthy after"):
        proc.wait_healthy(f"http://127.0.0.1:{proc.free_port()}/health", timeout=0.5)


def test_schedule_option_parsing():
    from flows.commands.ops import _parse_schedules

    assert _parse_schedules(["retrain=3600", "evaluate=0 3 * * *"]) == {"retrain": 3600.0, "evaluate": "0 3 * * *"}
    with pytest.raises(ConfigError, match="flow=SECONDS"):
        _parse_schedules(["retrain"])


def test_up_refuses_a_port_taken_by_someone_else(tmp_path: Path):
    import socket

    from infra import stack

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        cfg = stack.StackConfig(home=tmp_path, prefect_port=s.getsockname()[1], mlflow_port=proc.free_port())
        with pytest.raises(proc.ServiceError, match="is taken by another process"):
            stack.up(cfg)
    assert not list(tmp_path.glob("run/*.pid"))  # nothing was started


def test_trainer_hook_points_the_trainer_at_the_new_corpus(monkeypatch):
    import types

    from flows.retrain import RetrainConfig, _model_hook

    calls = []

    def fake_em_loop(preset: str = "x", overrides: list[str] | None = None) -> list:
        calls.append((preset, overrides))
        return [types.SimpleNamespace(promoted=False), types.SimpleNamespace(promoted=True)]

    monkeypatch.setitem(sys.modules, "flows.em_loop", types.SimpleNamespace(em_loop=fake_em_loop))
    cfg = RetrainConfig(corpus="/data/c.jsonl", trainer="em-loop", preset="exsearch_cpu_demo",
                        trainer_overrides=["iterations=1"])
    note = _model_hook(cfg)
    assert calls == [("exsearch_cpu_demo", ["retrieval.corpus=['/data/c.jsonl']", "iterations=1"])]
    assert "champion moved: True" in note
    monkeypatch.setitem(sys.modules, "flows.em_loop", None)  # as if the EM branch were absent
    assert "not available in this build" in _model_hook(cfg)
    assert "trainer=none" in _model_hook(RetrainConfig(trainer="none"))  # the default trains now (issue 25)


def test_worker_online_since_a_restart_needs_a_newer_heartbeat():
    from datetime import datetime, timezone

    from infra.stack import _online

    beat = datetime(2026, 11, 28, 5, 0, 0, tzinfo=timezone.utc)
    record = {"name": "searchloop-gpu", "status": "ONLINE", "last_heartbeat_time": beat.isoformat()}
    assert _online(record, None) and _online(record, beat.timestamp() - 1)
    assert not _online(record, beat.timestamp() + 1)  # the killed worker's last heartbeat, before the restart
    assert _online({**record, "last_heartbeat_time": "2026-11-28T05:00:02Z"}, beat.timestamp() + 1)
    assert not _online({**record, "status": "OFFLINE"}, None)
    assert not _online({**record, "last_heartbeat_time": None}, beat.timestamp())


def test_stack_requests_retry_a_busy_server(monkeypatch):
    import httpx

    from infra import stack

    answers = iter([httpx.ConnectError("refused"), httpx.Response(503), httpx.Response(200, json={"ok": True})])
    calls = []

    def fake(method: str, url: str, **kwargs):
        calls.append((method, url))
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(httpx, "request", fake)
    monkeypatch.setattr("time.sleep", lambda s: None)
    assert stack._request("GET", "http://127.0.0.1:1/api/x").json() == {"ok": True}
    assert len(calls) == 3
    monkeypatch.setattr(httpx, "request", lambda *a, **k: httpx.Response(503))
    assert stack._request("GET", "http://127.0.0.1:1/api/x").status_code == 503  # given up: the caller raises
    monkeypatch.setattr(httpx, "request", lambda *a, **k: httpx.Response(404))
    assert stack._request("GET", "http://127.0.0.1:1/api/x").status_code == 404  # not retried
