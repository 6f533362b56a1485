"""The evaluate flow end to end: real SmolLM2, real BM25 retriever, real Prefect run, real MLflow run."""

from __future__ import annotations

import pytest

from infra import artifacts
from infra.config import build_config, load_config


def test_eval_preset_validates() -> None:
    from flows.evaluate import EvaluateConfig

    cfg = load_config(EvaluateConfig, "eval_mini")
    assert set(cfg.protocols) == {"research", "searchr1", "r1searcher", "exsearch", "smartsearch"}
    assert len(cfg.datasets) == 4


def test_retriever_spec_needs_exactly_one() -> None:
    from infra.errors import ConfigError
    from training.agent.evaluate import AgentEvalConfig

    with pytest.raises(ConfigError, match="exactly one"):
        build_config(AgentEvalConfig, {"retrieval": {"url": "http://127.0.0.1:1", "corpus": "x.jsonl"}})


def test_old_retriever_key_says_where_it_moved() -> None:
    """One spelling of the retriever field: an old ``agent.retriever:`` section is refused with the new name."""
    from infra.errors import ConfigError
    from training.agent.evaluate import AgentEvalConfig

    with pytest.raises(ConfigError, match=r"`retriever:` is now `retrieval:`"):
        build_config(AgentEvalConfig, {"retriever": {"corpus": "data/corpus/mini.jsonl"}})
    assert build_config(AgentEvalConfig, {"retrieval": {"corpus": "data/corpus/mini.jsonl"}}).retrieval.kind == "corpus"


@pytest.mark.slow
def test_evaluate_flow_runs_and_logs(prefect_harness, tmp_path) -> None:
    import mlflow

    from flows.evaluate import evaluate

    result = evaluate("eval_mini", (
        "protocols=[research, r1searcher]", "datasets=[hotpotqa_mini]", f"out_dir={tmp_path / 'ev'}",
        "agent.limit=2", "agent.generator.batch_size=4", "agent.rollout.max_tokens_per_turn=24",
        "agent.rollout.max_total_tokens=48", "agent.rollout.max_turns=1"))
    assert set(result.table) == {"research/hotpotqa", "r1searcher/hotpotqa", "ALL"}
    for row in result.table.values():
        assert 0.0 <= row["f1"] <= 1.0 and 0.0 <= row["format_ok"] <= 1.0
    for proto in ("research", "r1searcher"):
        d = tmp_path / "ev" / proto / "hotpotqa_mini"
        assert artifacts.read_manifest(d)["count"] == 2
        assert len(artifacts.read_jsonl(d / "predictions.jsonl")) == 2
    assert (tmp_path / "ev" / "report" / "report.md").read_text().count("hotpotqa") >= 2
    run = mlflow.get_run(result.run_id)
    assert "research/hotpotqa/f1" in run.data.metrics
    names = {a.path for a in mlflow.MlflowClient().list_artifacts(result.run_id, "report")}
    assert "report/report.md" in names
    assert run.data.params["agent.protocol"] == "research,r1searcher"  # what ran, not the agent default
    assert run.data.tags["prefect.flow_name"] == "evaluate"  # linked to its flow run
