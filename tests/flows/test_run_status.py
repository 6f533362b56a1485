"""A flow's parent MLflow run follows the flow run: RUNNING while it runs (the child runs of its tasks end only
themselves), FAILED when the flow fails, FINISHED when it completes (``tasks/run_status.py``).

Found in a real run: ``smartsearch_cpu_demo`` failed in stage 3 (TypeError), the flow run was Failed and both
``stage3-grpo`` child runs FAILED, yet the parent ``smartsearch-smartsearch_cpu_demo`` said FINISHED: the parent was
opened in a ``with`` block that ended it at once. Real flows under Prefect's test harness, real MLflow store; the
model stages are unit-test fakes (seconds per flow).
"""

from __future__ import annotations

import pytest

from infra import tracking
from infra.config import load_config

SMART = ["endpoint.base_url=http://127.0.0.1:9/v1", "endpoint.serve_model=null", "eval.benchmarks=[]",
         "register_models=false"]
RL = ["init.warmup=null", "eval.compare_start=false", "eval.benchmarks=[]", "register_model=false",
      "difficulty=null"]


def _status(run_id: str) -> str:
    return tracking.client().get_run(run_id).info.status


def _children(parent: str) -> dict[str, list[str]]:
    """{run name: [statuses]} of the runs tagged with ``parent`` as their parent."""
    c = tracking.client()
    exp = c.get_experiment_by_name(tracking.DEFAULT_EXPERIMENT)
    out: dict[str, list[str]] = {}
    for r in c.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'"):
        out.setdefault(r.data.tags["mlflow.runName"], []).append(r.info.status)
    return out


def _runs_named(name: str) -> list[str]:
    c = tracking.client()
    exp = c.get_experiment_by_name(tracking.DEFAULT_EXPERIMENT)
    runs = c.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.runName` = '{name}'")
    return [r.info.run_id for r in runs]


def _parent_of_active() -> str:
    import mlflow

    return mlflow.active_run().data.tags["mlflow.parentRunId"]


def test_open_parent_runs_stay_running_through_child_blocks() -> None:
    """The library's parent runs are created RUNNING and a child block (ending well or not) leaves them RUNNING."""
    from training.rl.config import RLConfig
    from training.rl.stages import open_parent_run as open_rl
    from training.smartsearch.config import SmartSearchConfig
    from training.smartsearch.session import open_parent_run as open_smart

    smart = open_smart(load_config(SmartSearchConfig, "smartsearch_cpu_demo", SMART))
    rl = open_rl(load_config(RLConfig, "research_grpo_cpu_demo", RL))
    assert _status(smart) == "RUNNING" and _status(rl) == "RUNNING"
    assert tracking.client().get_run(rl).data.params["engine"] == "trl"  # the preset as params
    assert "endpoint.api_key_env" not in tracking.client().get_run(smart).data.params
    with tracking.child_run(smart, "stage1-sft"):
        pass
    with pytest.raises(TypeError), tracking.child_run(smart, "stage3-grpo"):
        raise TypeError("boom")
    assert _status(smart) == "RUNNING"
    assert _children(smart) == {"stage1-sft": ["FINISHED"], "stage3-grpo": ["FAILED"]}


def test_resume_run_leaves_the_status_as_it_was() -> None:
    """``resume_run`` (the evaluation logging's block) neither finishes nor fails the run it reopens."""
    run_id = tracking.create_run("resumed-parent")
    with tracking.resume_run(run_id):
        tracking.log_metrics({"m": 1.0})
    assert _status(run_id) == "RUNNING"
    with pytest.raises(RuntimeError), tracking.resume_run(run_id):
        raise RuntimeError("logging failed")
    assert _status(run_id) == "RUNNING"
    tracking.finish_run(run_id)
    with tracking.resume_run(run_id):
        pass
    assert _status(run_id) == "FINISHED"


def test_finish_tagged_runs_ends_only_running_runs_with_the_tag() -> None:
    mine = tracking.create_run("tagged", tags={"prefect.flow_run_id": "fr-1"})
    done = tracking.create_run("tagged-done", experiment="t-status", tags={"prefect.flow_run_id": "fr-1"})
    tracking.finish_run(done)
    other = tracking.create_run("other", tags={"prefect.flow_run_id": "fr-2"})
    assert tracking.finish_tagged_runs({"prefect.flow_run_id": "fr-1"}, "FAILED") == [mine]
    assert (_status(mine), _status(done), _status(other)) == ("FAILED", "FINISHED", "RUNNING")
    with pytest.raises(ValueError, match="at least one tag"):
        tracking.finish_tagged_runs({})


def _fake_smartsearch(monkeypatch, fail_stage3: bool, seen: list[str]) -> None:
    """Stage library calls replaced by fakes; stage 2 records the parent's status while the flow runs."""
    import tasks.smartsearch as ts
    from training.smartsearch import session
    from training.smartsearch.stages import StageResult

    def stage(name: str):  # noqa: ANN202
        def run(cfg, *args, **kwargs):  # noqa: ANN001, ANN202, ARG001
            seen.append(_status(_parent_of_active()))
            if name == "grpo" and fail_stage3:
                raise TypeError("run_stage3() got an unexpected keyword argument")  # the observed failure
            return StageResult(stage=name, dir=args[-1] if name != "sft" else args[2], model=f"model-{name}",
                               trained=True, counts={"kept": 1.0})
        return run

    monkeypatch.setattr(session, "open_judge", lambda cfg, url: (None, None))
    monkeypatch.setattr(session, "open_searcher", lambda cfg: None)
    monkeypatch.setattr(ts, "run_stage1", stage("sft"))
    monkeypatch.setattr(ts, "run_stage2", stage("dpo"))
    monkeypatch.setattr(ts, "run_stage3", stage("grpo"))


def test_smartsearch_failure_marks_parent_failed(prefect_harness, monkeypatch) -> None:
    from flows.smartsearch_curriculum import smartsearch_curriculum

    seen: list[str] = []
    _fake_smartsearch(monkeypatch, fail_stage3=True, seen=seen)
    state = smartsearch_curriculum(preset="smartsearch_cpu_demo", overrides=[*SMART, "name=status_fail"],
                                   return_state=True)
    assert state.is_failed()
    with pytest.raises(TypeError):
        state.result()
    [parent] = _runs_named("smartsearch-status_fail")
    assert seen == ["RUNNING"] * 4  # sft, dpo, grpo and its retry: each after earlier child blocks had ended
    assert _status(parent) == "FAILED"
    assert _children(parent) == {"stage1-sft": ["FINISHED"], "stage2-dpo": ["FINISHED"],
                                 "stage3-grpo": ["FAILED", "FAILED"]}


def test_smartsearch_success_marks_parent_finished(prefect_harness, monkeypatch) -> None:
    from flows.smartsearch_curriculum import smartsearch_curriculum

    seen: list[str] = []
    _fake_smartsearch(monkeypatch, fail_stage3=False, seen=seen)
    result = smartsearch_curriculum(preset="smartsearch_cpu_demo", overrides=[*SMART, "name=status_ok"])
    assert [s.stage for s in result.stages] == ["sft", "dpo", "grpo"] and seen == ["RUNNING"] * 3
    assert _status(result.run_id) == "FINISHED"
    assert set(_children(result.run_id)) == {"stage1-sft", "stage2-dpo", "stage3-grpo"}


def _fake_rl(monkeypatch, fail: bool, seen: list[str]) -> None:
    from training.refs import CheckpointRef
    from training.rl import stages
    from training.rl.data import RLDataRef

    def train(cfg, stage, data, init_model, out_uri):  # noqa: ANN001, ANN202, ARG001
        seen.append(_status(_parent_of_active()))
        if fail:
            raise TypeError("train_rl_stage failed")
        return CheckpointRef(uri=f"{out_uri}/model", stage=stage.name, engine="trl", stage_dir=out_uri, steps=1)

    monkeypatch.setattr(stages, "prepare_data", lambda cfg, out: RLDataRef(uri=out, splits={"train": 1}))
    monkeypatch.setattr(stages, "train_rl_stage", train)


@pytest.mark.parametrize("fail", [True, False])
def test_rl_finetune_parent_follows_the_flow(prefect_harness, monkeypatch, fail: bool) -> None:
    from flows.rl_finetune import rl_finetune

    seen: list[str] = []
    _fake_rl(monkeypatch, fail, seen)
    name = f"status_{'fail' if fail else 'ok'}"
    state = rl_finetune(preset="research_grpo_cpu_demo", overrides=[*RL, f"name={name}"], return_state=True)
    [parent] = _runs_named(f"rl-{name}")
    assert seen and set(seen) == {"RUNNING"}
    if fail:
        assert state.is_failed() and _status(parent) == "FAILED"
        assert _children(parent) == {"train-grpo": ["FAILED", "FAILED"]}
    else:
        assert state.is_completed() and state.result().run_id == parent and _status(parent) == "FINISHED"


def test_em_loop_failure_marks_parent_and_iteration_failed_also_on_resume(prefect_harness, monkeypatch) -> None:
    """The EM loop's explicit runs: a failing warm-up leaves the parent and iteration 0 FAILED (they stayed RUNNING
    before), and a resumed run that reattaches them and fails again marks them FAILED again."""
    import json
    from pathlib import Path

    from flows.em_loop import em_loop
    from training.em import stages as em
    from training.generation import models

    def boom(cfg, out):  # noqa: ANN001, ANN202, ARG001
        raise TypeError("build_warmup_data failed")

    monkeypatch.setattr(models, "resolve_model", lambda name: Path("/nonexistent/model"))
    monkeypatch.setattr(em, "build_warmup_data", boom)
    overrides = ["experiment=status_em", "iterations=1"]
    first = em_loop(preset="exsearch_cpu_demo", overrides=overrides, return_state=True)
    second = em_loop(preset="exsearch_cpu_demo", overrides=overrides, return_state=True)
    assert first.is_failed() and second.is_failed()
    from infra.paths import experiment_root
    from training.em.config import EMLoopConfig

    cfg = load_config(EMLoopConfig, "exsearch_cpu_demo", overrides)
    runs = json.loads((experiment_root("em", cfg.experiment, cfg.key()) / "mlflow_runs.json").read_text())
    for key in ("parent", "iter_00"):
        run = tracking.client().get_run(runs[key])
        assert run.info.status == "FAILED", key
        assert run.data.tags["prefect.flow_run_id"] == str(second.state_details.flow_run_id)  # re-tagged on resume
