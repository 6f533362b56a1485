"""One MLflow style: explicit-run and active-run logging through the same functions, and registered-model
aliases, used by the EM loop and RL stages. Uses the session's MLflow store (tests/conftest.py)."""

from __future__ import annotations

from infra import tracking


def test_explicit_and_active_runs_log_the_same_way() -> None:
    import mlflow

    parent = tracking.create_run("parent", "t-exp")
    child = tracking.create_run("child", "t-exp", parent_id=parent, tags={"stage": "x"})
    tracking.log_params({"a": {"b": 1}, "big": list(range(3))}, run_id=child, prefix="sl.")
    tracking.log_params({f"p{i}": i for i in range(150)}, run_id=child)  # more than one MLflow batch
    tracking.log_metrics({"f1": 0.5, "bad": float("nan"), "txt": "x", "r@5": 1.0}, step=2, run_id=child)
    tracking.finish_run(child)
    run = tracking.client().get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags["stage"] == "x"
    assert run.data.params["sl.a.b"] == "1" and run.data.params["p149"] == "149"
    assert run.data.metrics == {"f1": 0.5, "r_at_5": 1.0} and run.info.status == "FINISHED"
    with tracking.stage_run("active", params={"k": 3}, experiment="t-exp") as active:
        tracking.log_metrics({"m": 1.0})
    logged = tracking.client().get_run(active.info.run_id).data
    assert logged.params == {"k": "3"} and logged.metrics == {"m": 1.0}
    assert mlflow.active_run() is None


def test_aliases_move_between_registered_versions(tmp_path) -> None:
    c = tracking.client()
    name = "test-tracking-aliases"
    c.create_registered_model(name)
    v1 = c.create_model_version(name, str(tmp_path / "a"), tags={"iteration": "0"}).version
    v2 = c.create_model_version(name, str(tmp_path / "b"), tags={"iteration": "1"}).version
    assert tracking.get_alias(name, "champion") is None
    tracking.set_alias(name, "champion", str(v1))
    tracking.set_alias(name, "champion", str(v2))
    got = tracking.get_alias(name, "champion")
    assert str(got.version) == str(v2) and got.tags["iteration"] == "1"


def test_child_run_is_tagged_with_its_parent(tmp_path) -> None:
    """``child_run`` (the one way the loops open runs): nested under the given parent by tag, with its params and
    extra tags, on the session's temporary sqlite store; it is the active run inside the block only."""
    import mlflow

    parent = tracking.create_run("loop-parent", tracking.DEFAULT_EXPERIMENT)
    with tracking.child_run(parent, "stage-1", params={"lr": 1e-6, "nested": {"k": 2}},
                            tags={"searchloop.flow": "rl_finetune"}) as run:
        assert tracking.active_run_id() == run.info.run_id
        tracking.log_metrics({"reward": 0.25}, step=1)
    assert mlflow.active_run() is None
    got = tracking.client().get_run(run.info.run_id)
    assert got.data.tags["mlflow.parentRunId"] == parent
    assert got.data.tags["searchloop.flow"] == "rl_finetune" and got.data.tags["mlflow.runName"] == "stage-1"
    assert got.data.params == {"lr": "1e-06", "nested.k": "2"} and got.data.metrics == {"reward": 0.25}
    assert got.info.status == "FINISHED"
    with tracking.child_run(None, "top") as top:
        pass
    assert "mlflow.parentRunId" not in tracking.client().get_run(top.info.run_id).data.tags


def test_resume_run_and_run_id_artifacts_write_to_that_run(tmp_path) -> None:
    """``resume_run`` reopens a run for the fluent API; ``log_artifact(run_id=...)`` needs no active run."""
    run_id = tracking.create_run("resumed", tracking.DEFAULT_EXPERIMENT)
    with tracking.resume_run(run_id):
        tracking.log_metrics({"em": 0.5})
    note = tmp_path / "note.txt"
    note.write_text("x")
    tracking.log_artifact(note, artifact_path="learning", run_id=run_id)
    c = tracking.client()
    assert c.get_run(run_id).data.metrics == {"em": 0.5}
    assert [a.path for a in c.list_artifacts(run_id, "learning")] == ["learning/note.txt"]
