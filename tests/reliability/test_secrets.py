"""No secret in any record: a real evaluate flow (Prefect test harness, real MLflow sqlite store) runs with a token in
its config and secrets in the environment; afterwards no file of the MLflow store, the run directory, Prefect's
database or result storage contains their text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

CONFIG_SECRET = "cfg-secret-7c1e9a0d"
ENV_SECRET = "env-secret-3b8d44f2"


def _files_containing(roots: list[Path], needles: list[str]) -> list[str]:
    hits = []
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                hits += [f"{path}: {n}" for n in needles if n.encode() in data]
    return hits


def test_secret_fields_fall_back_to_the_environment_when_masked(monkeypatch) -> None:
    from infra.config import SECRET_MASK, build_config, secret_value
    from training.agent.evaluate import AgentEvalConfig

    cfg = build_config(AgentEvalConfig, {"retrieval": {"url": "http://127.0.0.1:9", "token": CONFIG_SECRET}})
    dumped = cfg.model_dump(mode="json")
    assert dumped["retrieval"]["token"] == SECRET_MASK and CONFIG_SECRET not in repr(cfg) + str(dumped)
    again = AgentEvalConfig.model_validate(dumped)  # what a deployment run gets back from Prefect
    monkeypatch.setenv("SEARCHLOOP_RETRIEVER_TOKEN", ENV_SECRET)
    assert secret_value(again.retrieval.token, "SEARCHLOOP_RETRIEVER_TOKEN") == ENV_SECRET
    assert secret_value(cfg.retrieval.token, "SEARCHLOOP_RETRIEVER_TOKEN") == CONFIG_SECRET


def test_flow_records_hold_no_secret(prefect_harness, tmp_path, tiny_model_dir, monkeypatch, retriever_server) -> None:
    import prefect.settings

    from flows.evaluate import EvaluateConfig, evaluate
    from infra.config import build_config
    from infra.settings import get_settings
    from training.agent.evaluate import open_searcher

    monkeypatch.setenv("SEARCHLOOP_JUDGE_API_KEY", ENV_SECRET)
    monkeypatch.setenv("SEARCHLOOP_GENERATOR_TOKEN", ENV_SECRET)
    url, _ = retriever_server
    data = {
        "protocols": ["research"], "datasets": ["hotpotqa_mini"], "out_dir": str(tmp_path / "ev"),
        "run_name": "secret-check",
        "agent": {"limit": 1, "generator": {"model": str(tiny_model_dir), "batch_size": 2},
                  "retrieval": {"url": url, "token": CONFIG_SECRET},
                  "rollout": {"max_tokens_per_turn": 8, "max_total_tokens": 16, "max_turns": 1}},
    }
    cfg = build_config(EvaluateConfig, data)
    assert open_searcher(cfg.agent.retrieval)._headers == {"Authorization": f"Bearer {CONFIG_SECRET}"}
    # The secret reaches the flow in a preset file (flow parameters, stored by Prefect, hold only its path).
    preset = tmp_path / "secret_preset.yaml"
    preset.write_text(yaml.safe_dump(data))
    result = evaluate(str(preset))
    assert result.run_id and (tmp_path / "ev" / "research" / "hotpotqa_mini" / "manifest.json").exists()

    db = prefect.settings.PREFECT_API_DATABASE_CONNECTION_URL.value().split("///", 1)[1]
    settings = get_settings()
    roots = [tmp_path / "ev", Path(db).parent, Path(os.environ["SEARCHLOOP_HOME"])]
    tracking = settings.tracking_uri
    if tracking.startswith("sqlite:///"):
        roots.append(Path(tracking.removeprefix("sqlite:///")).parent)
    if "://" not in settings.artifact_root:
        roots.append(Path(settings.artifact_root))
    roots = [r for r in roots if r.exists()]
    assert Path(db).exists() and len(roots) >= 3
    assert _files_containing([Path(db).parent], ["secret-check"])  # control: the flow parameters are in there
    assert _files_containing(roots, [CONFIG_SECRET, ENV_SECRET]) == []
    params = _mlflow_params(result.run_id)
    assert params["agent.retrieval.token"] == "**********", params


def _mlflow_params(run_id: str) -> dict[str, str]:
    import mlflow

    return mlflow.get_run(run_id).data.params


@pytest.fixture(autouse=True)
def _no_leftover_env(monkeypatch):
    monkeypatch.delenv("SEARCHLOOP_RETRIEVER_TOKEN", raising=False)


def test_deployment_parameters_refuse_secrets() -> None:
    """A deployment run's parameters land in Prefect's database as sent: a secret there is refused up front."""
    from flows.deployments import refuse_secret_parameters
    from infra.errors import ConfigError

    refuse_secret_parameters({"config": {"agent": {"rollout": {"max_tokens_per_turn": 5},
                                                   "generator": {"tokenizer": "x"}, "retrieval": {"token": None}}}})
    for bad in ({"config": {"agent": {"retrieval": {"token": CONFIG_SECRET}}}}, {"config.judge.api_key": "k"}):
        with pytest.raises(ConfigError, match="environment"):
            refuse_secret_parameters(bad)
