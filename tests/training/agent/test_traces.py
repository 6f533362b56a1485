"""Trajectories as MLflow traces (spans per step and search, documents, rewards as assessments), question sets as
MLflow datasets, per-question tables; a real MLflow store."""

from __future__ import annotations

from training.agent.records import Trajectory, Turn
from training.agent.traces import TraceConfig, log_dataset_evaluation, sample_indices


def _traj(qid: str, answer: str | None) -> Trajectory:
    return Trajectory(
        question_id=qid, question=f"who is {qid}?", golden_answers=["Ada"], dataset="toy", protocol="searchr1",
        prompt="p", response="r", final_answer=answer, finish_reason="answer", n_searches=1, format_ok=True,
        timings={"total": 0.5},
        turns=[Turn(generated="<search> ada </search>", query="ada", doc_ids=["d1", "d2"],
                    doc_texts=["Ada Lovelace was a mathematician.", "Ada is a language."], scores=[2.5, 1.0],
                    finish_reason="stop", tokens=7),
               Turn(generated="<answer> Ada </answer>", finish_reason="stop", tokens=5)])


def test_sample_indices_is_seeded_and_capped() -> None:
    assert sample_indices(3, 5, 0) == [0, 1, 2]
    a = sample_indices(100, 10, 1)
    assert len(a) == 10 and a == sorted(a) and a == sample_indices(100, 10, 1) != sample_indices(100, 10, 2)


def test_dataset_evaluation_fills_mlflow_agent_views() -> None:
    import mlflow

    from infra.tracking import configure

    configure("traces-test")
    trajs = [_traj("q1", "Ada"), _traj("q2", "Bob"), _traj("q3", None)]
    examples = [{"id": t.question_id, "dataset": "toy", "sample": 0, "em": float(t.final_answer == "Ada"),
                 "f1": float(t.final_answer == "Ada"), "format_ok": 1.0} for t in trajs]
    with mlflow.start_run() as run:
        counts = log_dataset_evaluation("searchr1/toy", "/data/toy.jsonl", trajs, examples,
                                        TraceConfig(max_per_dataset=2))
    assert counts == {"traces": 2, "trajectories": 3, "rows": 3}
    traces = mlflow.search_traces(run_id=run.info.run_id, return_type="list")
    assert len(traces) == 2
    trace = traces[0]
    qid = trace.data.spans[0].inputs["question_id"]
    spans = {s.name: s for s in trace.data.spans}
    assert set(spans) == {f"searchr1/toy:{qid}", "generate 0", "search 0", "generate 1"}
    assert spans["search 0"].span_type == "RETRIEVER" and spans["search 0"].inputs == {"query": "ada"}
    docs = spans["search 0"].outputs
    assert [d["metadata"]["doc_id"] for d in docs] == ["d1", "d2"] and docs[0]["page_content"].startswith("Ada L")
    assert spans["generate 1"].outputs["generated"] == "<answer> Ada </answer>"
    answer = {"q1": "Ada", "q2": "Bob", "q3": None}[qid]
    assert spans[f"searchr1/toy:{qid}"].outputs["final_answer"] == answer
    feedback = {a.name: a.value for a in trace.info.assessments}
    assert feedback == {"em": float(answer == "Ada"), "f1": float(answer == "Ada"), "format_ok": 1.0}
    logged = mlflow.get_run(run.info.run_id)
    (ds,) = logged.inputs.dataset_inputs
    assert ds.dataset.name == "searchr1/toy" and ds.tags[0].value == "eval"
    table = mlflow.load_table("eval_results/searchr1/toy.json", run_ids=[run.info.run_id])
    assert list(table["question_id"]) == ["q1", "q2", "q3"] and list(table["em"]) == [1.0, 0.0, 0.0]


def test_no_traces_when_disabled() -> None:
    import mlflow

    from infra.tracking import configure

    configure("traces-test")
    with mlflow.start_run() as run:
        counts = log_dataset_evaluation("searchr1/toy", "x", [_traj("q1", "Ada")], [], TraceConfig(max_per_dataset=0))
    assert counts["traces"] == 0 and mlflow.search_traces(run_id=run.info.run_id, return_type="list") == []
