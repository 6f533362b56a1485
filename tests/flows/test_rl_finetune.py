"""RL presets validate; the verl command renders from a preset; a real rl_finetune flow run (1-step warm-up SFT,
1 GRPO step) with MLflow metrics, evaluation and registration, then a crash-resume from the saved checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.config import PRESET_DIR, load_config
from training.rl.config import RLConfig

RL_PRESETS = sorted(p.stem for p in PRESET_DIR.glob("*.yaml")
                    if {"engine", "stages", "protocol"} <= set(yaml.safe_load(p.read_text())))

TINY = [
    "data.train_limit=2", "stages.grpo.trl.max_steps=1", "stages.grpo.trl.save_steps=1",
    "stages.grpo.trl.prompts_per_step=1", "stages.grpo.trl.max_tokens_per_turn=12",
    "stages.grpo.trl.max_completion_length=24", "stages.grpo.max_turns=1", "eval.limit=1", "eval.max_new_tokens=12",
    # warm-up SFT: two decomposition questions, one LLaMA-Factory step
    "init.warmup.decomposition_files=[{path: data/train/hotpotqa_train_mini.jsonl, limit: 2}]",
    "init.warmup.fireact_file=null", "init.warmup.sft.max_steps=1", "init.warmup.sft.gradient_accumulation_steps=1",
    "init.fit_rollout_budget=false",  # the 24-token budget above fits no warm-up trajectory
]


def test_every_rl_preset_validates() -> None:
    assert {"research_grpo", "r1searcher_two_stage", "searchr1_grpo", "research_grpo_cpu_demo",
            "r1searcher_two_stage_cpu_demo", "searchr1_grpo_cpu_demo"} <= set(RL_PRESETS)
    for name in RL_PRESETS:
        cfg = load_config(RLConfig, name)
        if name.endswith(("_cpu_demo", "_learn_cpu", "_learn_demo")):
            assert cfg.engine == "trl" and cfg.model == "smollm2" and cfg.init.warmup is not None
        else:
            assert cfg.engine == "verl" and all(s.verl is not None for s in cfg.stages)
    from flows.demo import DemoConfig

    demo = load_config(RLConfig, DemoConfig().train_preset)  # the main job's closing training stage
    assert demo.eval.compare_start and demo.engine == "trl" and demo.stages[0].trl.max_steps <= 6
    tiny = load_config(RLConfig, "research_grpo_cpu_demo", TINY)
    assert tiny.stages[0].name == "grpo" and tiny.stages[0].trl.max_steps == 1 and tiny.stages[0].max_turns == 1
    two = load_config(RLConfig, "r1searcher_two_stage")
    assert [s.reward for s in two.stages] == ["r1searcher_stage1", "r1searcher_stage2_llama"]
    assert [s.verl.algorithm for s in two.stages] == ["grpo", "reinforce_pp"]


def test_verl_command_from_preset(tmp_path) -> None:
    from training.rl.data import RLDataRef
    from training.rl.verl.launch import build_command, convert_rollout_dumps, verl_env

    cfg = load_config(RLConfig, "research_grpo", ["verl_python=/opt/verl/bin/python"])
    data = RLDataRef(uri=str(tmp_path / "data"), splits={"train": 4, "val": 2})
    cmd = build_command(cfg, cfg.stages[0], data, "Qwen/Qwen2.5-7B-Instruct", tmp_path)
    assert cmd[:3] == ["/opt/verl/bin/python", "-m", "verl.trainer.main_ppo"]
    o = dict(a.split("=", 1) for a in cmd[3:])
    assert o["reward.custom_reward_function.name"] == "compute_score_research"
    assert o["reward.custom_reward_function.path"].endswith("training/rewards/adapters.py")
    assert Path(o["reward.custom_reward_function.path"]).is_file()  # verl imports the reward module from this path
    assert o["data.val_files"].endswith("val.parquet")
    tool = yaml.safe_load((tmp_path / "search_tool.yaml").read_text())["tools"][0]["config"]
    assert tool["retrieval_service_url"] == "http://127.0.0.1:8000/retrieve" and tool["topk"] == 5
    env = verl_env("abc123")
    assert env["MLFLOW_RUN_ID"] == "abc123" and env["MLFLOW_TRACKING_URI"].startswith("sqlite:")
    dumps = tmp_path / "dump"
    dumps.mkdir()
    (dumps / "1.jsonl").write_text('{"input": "Q?", "output": "<think>x</think><answer> \\\\boxed{y} </answer>", '
                                   '"gts": ["y"], "score": 1.0, "step": 1}\n')
    [traj] = convert_rollout_dumps(dumps, "research")
    assert traj.final_answer == "y" and traj.golden_answers == ["y"] and traj.timings["score"] == 1.0


@pytest.mark.slow
def test_rl_flow_runs_registers_and_resumes(prefect_harness) -> None:
    import mlflow

    from flows.rl_finetune import rl_finetune

    result = rl_finetune(preset="research_grpo_cpu_demo", overrides=TINY)
    [ckpt] = result.checkpoints
    assert ckpt.steps == 1 and Path(ckpt.uri, "config.json").exists()
    assert result.registered.version == "1" and result.scores.row("musique_mini").metrics["searches"].mean >= 0
    client = mlflow.MlflowClient()
    children = client.search_runs(client.get_run(result.run_id).info.experiment_id,
                                  f"tags.mlflow.parentRunId = '{result.run_id}'")
    train = next(r for r in children if r.info.run_name == "train-grpo")
    for key in ("health/reward", "health/searches_per_traj", "train/loss"):
        assert client.get_metric_history(train.info.run_id, key), key
    assert any(a.path == "stage" for a in client.list_artifacts(train.info.run_id))
    # the stage started from the warm-up SFT's merged folder; the warm-up run logged validator survival
    warm = next(r for r in children if r.info.run_name == "warmup")
    assert warm.data.metrics["warmup/rows"] == 2 and warm.data.metrics["warmup/decomposition_hotpotqa/valid"] == 2
    stage_manifest = yaml.safe_load((Path(ckpt.stage_dir) / "manifest.json").read_text())
    assert "/warmup/research-" in stage_manifest["init_model"] and stage_manifest["init_model"].endswith("sft/model")

    # crash after the checkpoint was saved: the stage has no manifest and no final model -> the re-run resumes
    stage = Path(ckpt.stage_dir)
    (stage / "manifest.json").unlink()
    warm_manifest = Path(stage_manifest["init_model"]).parent / "manifest.json"
    warm_mtime = warm_manifest.stat().st_mtime_ns
    again = rl_finetune(preset="research_grpo_cpu_demo", overrides=TINY)
    manifest = yaml.safe_load((stage / "manifest.json").read_text())
    assert manifest["resumed_from"].endswith("checkpoint-1") and again.checkpoints[0].steps == 1
    assert manifest["init_model"] == stage_manifest["init_model"]
    assert warm_manifest.stat().st_mtime_ns == warm_mtime  # the warm-up SFT was reused, not redone


def test_bucket_data_mixes_by_rollouts_to_first_correct(tmp_path, monkeypatch) -> None:
    """The difficulty step's plumbing (rollouts replaced by fixed correctness flags): buckets, mix, new data dir."""
    from training.rl import stages as rl
    from training.rl.data import read_parquet

    cfg = load_config(RLConfig, "r1searcher_two_stage_cpu_demo", ["data.train_limit=8"])
    data = rl.prepare_data(cfg, str(tmp_path / "data"))
    ids = [r["extra_info"]["id"] for r in read_parquet(data.split_uri("train"))]
    flags = {qid: [[True], [False, True], [False, False]][i % 3] for i, qid in enumerate(ids)}
    monkeypatch.setattr(rl, "estimate_difficulty", lambda cfg, questions, model: flags)
    mixed = rl.bucket_data(cfg, data, "smollm2", str(tmp_path / "bucketed"))
    buckets = yaml.safe_load((tmp_path / "bucketed" / "buckets.json").read_text())
    assert {k: len(v) for k, v in buckets.items()} == {"easy": 3, "medium": 3, "difficult": 2}
    train = {r["extra_info"]["id"] for r in read_parquet(mixed.split_uri("train"))}
    assert mixed.splits["train"] == len(train) == 5 and not train & set(buckets["easy"])
    assert rl.bucket_data(cfg, data, "smollm2", str(tmp_path / "bucketed")) == mixed, "manifest -> reused"


SHARED = load_config(RLConfig, "r1searcher_two_stage")  # noqa: E305 - used by the R1-Searcher tests below


def _shared_file(rel: str) -> Path:
    from infra.settings import get_settings

    path = get_settings().shared_data_dir / rel
    if not path.exists():
        pytest.skip(f"needs the shared data set ({path})")
    return path


def test_r1searcher_stages_train_on_the_seeds_own_stage_questions(tmp_path) -> None:
    """The seed trains stage 1 on its 350 stage-1 questions and stage 2 on the 8,148 stage-2 ones."""
    from training.rl import stages as rl
    from training.rl.data import read_parquet

    _shared_file("train/r1searcher_train.jsonl")
    assert SHARED.difficulty is None and [s.question_stage for s in SHARED.stages] == [1, 2]
    data = rl.prepare_data(SHARED, str(tmp_path / "data"))
    assert data.splits["train_stage1"] == 350 and data.splits["train_stage2"] == 8148
    for stage, prefix in zip(SHARED.stages, ("r1s_stage1_", "r1s_stage2_"), strict=True):
        split = rl.train_split(stage, data)
        ids = [r["extra_info"]["id"] for r in read_parquet(data.split_uri(split))]
        assert split == f"train_{stage.name}" and all(i.startswith(prefix) for i in ids)
    with pytest.raises(ValueError, match="set one of the two"):
        load_config(RLConfig, "r1searcher_two_stage", ["difficulty={easy_below: 10}"])


def test_r1searcher_eval_follows_the_seed() -> None:
    """Fixed 500-question subsets, top-5 documents (training keeps top-3), the seed's normalization for cover-EM."""
    from evaluation.benchmarks import load_benchmark
    from training.rl.heldout import eval_config

    _shared_file("eval/r1searcher/hotpotqa_500.jsonl")
    subsets = [b for b in SHARED.eval.benchmarks if "r1searcher/" in b]
    assert len(subsets) == 3 and SHARED.eval.limit is None
    assert all(len(load_benchmark(b)) == 500 for b in subsets)
    ecfg = eval_config(SHARED, "some/model")
    assert ecfg.rollout.top_k == 5 and SHARED.top_k == 3 and ecfg.normalization == "r1searcher"
