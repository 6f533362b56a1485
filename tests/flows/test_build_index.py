"""build_index flow under the Prefect test harness (BM25 + small real dense), MLflow run, presets, CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import PRESET_DIR, load_config

REPO = Path(__file__).resolve().parents[2]


def test_every_index_preset_validates() -> None:
    from flows.build_index import BuildIndexFlowConfig

    presets = sorted(PRESET_DIR.glob("index_*.yaml"))
    assert {p.stem for p in presets} >= {"index_mini_bm25", "index_mini_dense", "index_mini_colbert",
                                          "index_mini_hybrid", "index_multihop_wiki_bm25"}
    for path in presets:
        cfg = load_config(BuildIndexFlowConfig, path)
        assert cfg.index.backend in path.stem


def _task_states(flow_run_id, task: str, expected: list[str], timeout_s: float = 30.0) -> list[str]:
    """States of one task's runs in a flow run, sorted. Prefect 3 records task-run states through events, which
    the server writes a moment after the flow returns (CI once read a state of None), so this polls until the
    expected states are there or ``timeout_s`` passes, and returns the last read for the assertion."""
    import time

    import anyio
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        return sorted(r.state.name if r.state else "None" for r in runs if r.name.rsplit("-", 1)[0] == task)

    deadline = time.monotonic() + timeout_s
    while True:
        states = anyio.run(read)
        if states == sorted(expected) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


@pytest.mark.slow
def test_flow_builds_evaluates_and_logs(prefect_harness, mini_corpus_path, data_dir, tmp_path) -> None:
    import mlflow
    import yaml

    from flows.build_index import build_index_flow

    evaluation = {"files": [str(data_dir / "eval" / "hotpotqa_mini.jsonl"),
                            str(data_dir / "eval" / "bamboogle_mini.jsonl")], "ks": [1, 5]}
    result = build_index_flow("index_mini_bm25", (f"output_dir={tmp_path / 'bm25'}",
                                                  f"evaluation.files={evaluation['files']}", "evaluation.ks=[1, 5]"))
    assert result.index.backend == "bm25" and (tmp_path / "bm25" / "manifest.json").exists()
    hot = result.recall.datasets[0]
    assert hot.dataset == "hotpotqa" and hot.any_gold[5] >= 0.9 and result.recall.datasets[1].n == 0
    run = mlflow.get_run(result.mlflow_run_id)
    assert run.data.metrics["recall.hotpotqa.any_gold_at_5"] == pytest.approx(hot.any_gold[5])
    assert run.data.metrics["n_passages"] == 1861 and run.data.params["index.backend"] == "bm25"

    dense = tmp_path / "small_dense.yaml"  # a preset file of one's own
    dense.write_text(yaml.safe_dump({
        "name": "small_dense", "output_dir": str(tmp_path / "dense"), "evaluation": evaluation,
        "index": {"corpus": str(mini_corpus_path), "backend": "dense", "limit": 120, "shard_size": 40},
    }))
    first = build_index_flow(str(dense))
    assert first.index.n_passages == 120 and first.index.params["ntotal"] == 120
    assert mlflow.get_run(first.mlflow_run_id).data.metrics["time.embed_s"] > 0

    (tmp_path / "dense" / "manifest.json").unlink()  # as if the first run had died after embedding
    state = build_index_flow(str(dense), return_state=True)
    again = state.result()
    cached = ["Cached"] * 3  # the content-hash cache
    assert _task_states(state.state_details.flow_run_id, "embed-shard", cached) == cached
    assert again.index.n_passages == 120 and not again.index.reused
    forced = build_index_flow(str(dense), ("force=true",), return_state=True)
    assert _task_states(forced.state_details.flow_run_id, "embed-shard", ["Completed"] * 3) == ["Completed"] * 3
    assert forced.result().index.shards_reused == 3  # the library still reused the files

    import shutil

    shutil.rmtree(tmp_path / "dense")  # the user deletes the index and builds it again: the cache is stale
    healed = build_index_flow(str(dense), return_state=True)
    both = ["Cached"] * 3 + ["Completed"] * 3
    assert _task_states(healed.state_details.flow_run_id, "embed-shard", both) == both
    assert healed.result().index.n_passages == 120 and healed.result().index.shards_reused == 0


def test_prefect_results_stay_in_the_data_home(monkeypatch) -> None:
    """Prefect's own default (~/.prefect/storage, whatever PREFECT_HOME says) would let a later session hit this
    one's caches; searchloop keeps them under its data home."""
    from prefect.settings import get_current_settings

    from infra.settings import embedded_environment, get_settings

    assert Path(os.environ["SEARCHLOOP_HOME"]) in get_current_settings().results.local_storage_path.parents
    monkeypatch.delenv("PREFECT_RESULTS_LOCAL_STORAGE_PATH")
    env = embedded_environment(get_settings().model_copy(update={"home": Path("/data/home")}))
    assert env["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] == "/data/home/prefect/storage"


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_cli_rejects_bad_input_with_exit_2(tmp_path) -> None:
    env = {**os.environ, "SEARCHLOOP_HOME": str(tmp_path)}
    bad_preset = subprocess.run([sys.executable, "-m", "flows.cli", "index", "build", "--preset", "nope"],
                                cwd=REPO, capture_output=True, text=True, env=env)
    assert bad_preset.returncode == 2 and "preset 'nope' not found" in _flat(bad_preset.stderr)
    bad_key = subprocess.run([sys.executable, "-m", "flows.cli", "index", "build", "index.backend=sparse",
                              "index.shard_size=0"], cwd=REPO, capture_output=True, text=True, env=env)
    assert bad_key.returncode == 2 and "2 configuration error(s)" in _flat(bad_key.stderr)
    no_index = subprocess.run([sys.executable, "-m", "flows.cli", "index", "eval", str(tmp_path / "none")],
                              cwd=REPO, capture_output=True, text=True, env=env)
    assert no_index.returncode == 2 and "is missing or incomplete" in _flat(no_index.stderr)


@pytest.mark.slow
def test_cli_eval_prints_recall_table(mini_corpus_path, data_dir, tmp_path, capsys) -> None:
    from flows.cli import main
    from retrieval.index import IndexBuildConfig, build_index

    build_index(IndexBuildConfig(corpus=str(mini_corpus_path), backend="bm25"), tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["index", "eval", str(tmp_path), "--eval", str(data_dir / "eval" / "musique_mini.jsonl"), "-k", "5"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "musique" in out and "any-gold" in out
