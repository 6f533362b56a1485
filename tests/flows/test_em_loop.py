"""EM loop: presets validate; promotion/early-stop rules; a real micro run of the flow (Prefect + MLflow + LLaMA-Factory
+ SmolLM2) that is then resumed with every step skipped."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from evaluation.metrics import MetricSummary
from infra.config import PRESET_DIR, load_config
from infra.errors import ConfigError
from training.em.config import EMLoopConfig
from training.em.records import StageRef
from training.em.stages import beats_champion, run_stage, should_stop

PRESETS = ["exsearch_cpu_demo", "exsearch_paper", "exsearch_learn_cpu"]


class Counted(StageRef):
    n: int


@pytest.mark.parametrize("name", PRESETS)
def test_presets_validate(name: str) -> None:
    cfg = load_config(EMLoopConfig, name)
    assert (PRESET_DIR / f"{name}.yaml").exists() and cfg.iterations >= 1
    assert cfg.sampling.rollout.n >= 2 and cfg.selection.method == "importance"


def test_paper_preset_has_seed_settings() -> None:
    cfg = load_config(EMLoopConfig, "exsearch_paper")
    a = cfg.alignment
    assert (a.learning_rate, a.num_train_epochs, a.lr_scheduler_type, a.warmup_ratio, a.cutoff_len) == (
        2e-6, 2, "cosine", 0.1, 8192)
    assert cfg.sampling.generator.backend == "vllm" and cfg.sampling.rollout.best_of == 8 and a.deepspeed == "z3"


def test_config_errors_are_collected() -> None:
    with pytest.raises(ConfigError, match="sampling.questions is empty"):
        load_config(EMLoopConfig, None, [])
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(EMLoopConfig, "exsearch_cpu_demo", ["sampling.rollout.k=3"])


def _f1(mean: float, low: float, high: float) -> MetricSummary:
    return MetricSummary(mean=mean, low=low, high=high, n=10)


def test_champion_and_early_stop_rules() -> None:
    champ = _f1(0.30, 0.20, 0.40)
    assert beats_champion(_f1(0.41, 0.3, 0.5), champ)
    assert not beats_champion(_f1(0.39, 0.3, 0.5), champ)  # inside the interval: no move
    assert beats_champion(_f1(0.0, 0.0, 0.0), None)
    assert not should_stop([0.3, 0.2])
    assert should_stop([0.3, 0.2, 0.1])
    assert not should_stop([0.3, 0.2, 0.25, 0.1])
    assert not should_stop([0.3, 0.3, 0.3])


def test_run_stage_skips_complete_and_redoes_incomplete(tmp_path, caplog) -> None:
    calls = []

    def body(out: Path) -> dict:
        calls.append(out)
        (out / "x.txt").write_text("data")
        return {"n": 1}

    stage = tmp_path / "s"
    stage.mkdir()
    (stage / "half-written.tmp").write_text("left by a crash")
    ref = run_stage("demo", stage, body, record=Counted)
    assert ref == Counted(step="demo", path=str(stage), n=1) and not (stage / "half-written.tmp").exists()
    with caplog.at_level(logging.INFO):
        again = run_stage("demo", stage, body, record=Counted)
    assert again == ref and again.numbers() == {"n": 1.0} and len(calls) == 1
    assert f"skipping demo: already complete at {stage}" in caplog.text


MICRO = [
    "iterations=1",
    "warmup.decomposition_files=[{path: data/train/hotpotqa_train_mini.jsonl, limit: 2}]",
    "warmup.fireact_limit=2",
    "warmup.sft.max_steps=1", "warmup.sft.cutoff_len=256", "warmup.sft.per_device_train_batch_size=2",
    "sampling.questions=[{path: data/train/hotpotqa_train_mini.jsonl, limit: 2}]",
    "sampling.rollout.max_turns=1", "sampling.rollout.max_tokens_per_turn=12", "sampling.rollout.max_total_tokens=48",
    "selection.drop_single=false",
    "alignment.max_steps=1", "alignment.cutoff_len=256",
    "evaluation.questions=[{path: hotpotqa_mini, limit: 2}]",
    "evaluation.rollout.max_turns=1", "evaluation.rollout.max_tokens_per_turn=12",
    "evaluation.rollout.max_total_tokens=48", "evaluation.n_resamples=100",
    "experiment=em-micro-test", "registered_model=em-micro-test",
]


@pytest.mark.slow
@pytest.mark.timeout(2400)  # real LLaMA-Factory runs; minutes on a busy 2-core machine
def test_em_loop_micro_run_and_resume(prefect_harness) -> None:
    import mlflow
    from mlflow import MlflowClient

    from flows.em_loop import em_loop
    from infra.paths import experiment_root

    history = em_loop(preset="exsearch_cpu_demo", overrides=MICRO)
    assert [h.iteration for h in history] == [0, 1]
    assert all(0.0 <= h.f1.low <= h.f1.mean <= h.f1.high <= 1.0 for h in history)
    cfg = load_config(EMLoopConfig, "exsearch_cpu_demo", MICRO)
    root = experiment_root("em", cfg.experiment, cfg.key())
    for stage in ("warmup/data", "warmup/sft", "iter_00/eval", "iter_01/sample", "iter_01/score", "iter_01/select",
                  "iter_01/train", "iter_01/eval"):
        assert (root / stage / "manifest.json").exists(), stage

    client = MlflowClient()
    exp = client.get_experiment_by_name("em-micro-test")
    runs = {r.data.tags["mlflow.runName"]: r for r in client.search_runs([exp.experiment_id], max_results=100)}
    parent = runs["em-micro-test"].info.run_id
    assert runs["iteration-1"].data.tags["mlflow.parentRunId"] == parent
    it1 = runs["iteration-1"].info.run_id
    stage_parents = {n: r.data.tags.get("mlflow.parentRunId") for n, r in runs.items()}
    assert {stage_parents[s] for s in ("sample", "score", "select")} == {it1}
    select_run = next(r for r in client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{it1}'")
                      if r.data.tags["mlflow.runName"] == "select")
    names = {a.path for a in client.list_artifacts(select_run.info.run_id, "select")}
    assert {"select/weights.jsonl", "select/stats.json", "select/weights_hist.png"} <= names
    versions = client.search_model_versions("name='em-micro-test'")
    assert sorted(v.tags["iteration"] for v in versions) == ["0", "1"]
    assert client.get_model_version_by_alias("em-micro-test", "champion").version in {v.version for v in versions}
    assert mlflow.get_tracking_uri().startswith("sqlite")

    # resume: the same experiment again does no work; every stage logs that it is complete. (A handler on the
    # library logger itself: Prefect's logging setup replaces the root handlers, which caplog relies on.)
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    lib = logging.getLogger("training")
    old_level = lib.level
    lib.addHandler(handler)
    lib.setLevel(logging.INFO)
    try:
        again = em_loop(preset="exsearch_cpu_demo", overrides=MICRO)
    finally:
        lib.removeHandler(handler)
        lib.setLevel(old_level)
    assert [h.f1 for h in again] == [h.f1 for h in history]
    text = "\n".join(lines)
    for step in ("sample", "score", "evaluate", "train_sft"):
        assert f"skipping {step}: already complete" in text
    assert len(client.search_model_versions("name='em-micro-test'")) == 2


def test_select_stage_writes_weighted_training_file_with_gold(tmp_path) -> None:
    from infra import artifacts
    from training.em.stages import select_stage

    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<QUERY> x"},
            {"role": "user", "content": "<SEARCH> d"}, {"role": "assistant", "content": "wrong"}]
    rows = [
        {"trajectory_id": "a", "question_id": "q1", "sum_logprob": -1.0, "n_tokens": 3, "f1": 0.0, "correct": 0.0,
         "gold": "Paris", "messages": chat},
        {"trajectory_id": "b", "question_id": "q1", "sum_logprob": -2.0, "n_tokens": 3, "f1": 1.0, "correct": 1.0,
         "gold": "Paris", "messages": chat},
        {"trajectory_id": "c", "question_id": "q2", "sum_logprob": None, "n_tokens": 3, "f1": 0.0, "correct": 0.0,
         "gold": "Rome", "messages": chat},
    ]
    artifacts.write_jsonl(tmp_path / "scores.jsonl", rows)
    cfg = load_config(EMLoopConfig, "exsearch_cpu_demo")
    ref = select_stage(cfg, str(tmp_path / "scores.jsonl"), tmp_path / "select")
    train = artifacts.read_jsonl(ref.train)
    # q1: softmax([-1, -2]) = [0.7311, 0.2689], training weight = 2 * w; q2 (score NaN) dropped and counted
    assert [round(r["weight"], 4) for r in train] == [1.4621, 0.5379]
    assert all(r["messages"][-1] == {"role": "assistant", "content": "Paris"} for r in train)
    assert ref.stats.dropped == {"nonfinite": 1}
    assert (tmp_path / "select" / "manifest.json").exists() and (tmp_path / "select" / "histogram.json").exists()
