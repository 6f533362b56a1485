"""Rendered verl overrides per preset: known keys only, seed hyperparameters, search tool, reward, MLflow."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from training.rl.verl.config import VERL_KEYS, VerlConfig, parse_overrides, render_overrides, render_search_tool_config

PRESETS = Path(__file__).resolve().parents[3] / "flows" / "configs"


def _render(cfg: VerlConfig) -> list[str]:
    return render_overrides(
        cfg, model_path="/models/qwen", train_files="/d/train.parquet", val_files="/d/val.parquet",
        tool_config_path="/d/search_tool.yaml", agent_loop_config_path="/d/agent_loop.yaml",
        reward_path="/repo/training/rewards.py",
        reward_name="compute_score", output_dir="/ckpt", experiment="searchloop", run_name="rl-test",
        rollout_dump_dir="/ckpt/rollouts")


def _preset_verl_configs() -> list[tuple[str, VerlConfig]]:
    from infra.config import load_config
    from training.rl.config import RLConfig

    out = []
    for path in sorted(PRESETS.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if data.get("engine") != "verl":
            continue
        for stage in load_config(RLConfig, path).stages:
            out.append((f"{path.stem}:{stage.name}", stage.verl))
    return out


def test_every_rendered_key_is_a_verl_key() -> None:
    for algo, loop in (("grpo", "tags"), ("reinforce_pp", "tags"), ("ppo", "tool_agent")):
        keys = parse_overrides(_render(VerlConfig(algorithm=algo, agent_loop=loop)))
        unknown = set(keys) - VERL_KEYS
        assert not unknown, f"{algo}: keys not in verl's ppo_trainer config: {unknown}"


def test_grpo_overrides_match_research_seed() -> None:
    cfg = VerlConfig(algorithm="grpo", n=5, lr=1e-6, kl_coef=0.001, train_batch_size=256, ppo_mini_batch_size=256,
                     max_prompt_length=512, max_response_length=8192, max_turns=8)
    o = parse_overrides(_render(cfg))
    assert o["algorithm.adv_estimator"] == "grpo"
    assert o["actor_rollout_ref.rollout.n"] == "5"
    assert o["actor_rollout_ref.actor.use_kl_loss"] == "True"
    assert o["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl"
    assert o["actor_rollout_ref.rollout.multi_turn.enable"] == "True"
    assert o["actor_rollout_ref.rollout.multi_turn.max_assistant_turns"] == "8"
    assert o["actor_rollout_ref.rollout.agent.default_agent_loop"] == "searchloop_tags"
    assert o["actor_rollout_ref.rollout.agent.agent_loop_config_path"] == "/d/agent_loop.yaml"
    t = parse_overrides(_render(cfg.model_copy(update={"agent_loop": "tool_agent"})))
    assert t["actor_rollout_ref.rollout.agent.default_agent_loop"] == "tool_agent"
    assert t["actor_rollout_ref.rollout.multi_turn.tool_config_path"] == "/d/search_tool.yaml"
    assert o["reward.custom_reward_function.path"] == "/repo/training/rewards.py"
    assert o["reward.custom_reward_function.name"] == "compute_score"
    assert o["trainer.logger"] == "['console','mlflow']"
    assert o["trainer.rollout_data_dir"] == "/ckpt/rollouts"
    assert o["trainer.resume_mode"] == "auto"
    assert "critic.optim.lr" not in o


def test_reinforce_and_ppo_estimators() -> None:
    o = parse_overrides(_render(VerlConfig(algorithm="reinforce_pp")))
    assert o["algorithm.adv_estimator"] == "reinforce_plus_plus_baseline"
    o = parse_overrides(_render(VerlConfig(algorithm="ppo", use_kl_loss=False, kl_in_reward=True, critic_lr=1e-5)))
    assert o["algorithm.adv_estimator"] == "gae"
    assert o["algorithm.use_kl_in_reward"] == "True"
    assert o["critic.optim.lr"] == "1e-05" and o["critic.model.path"] == "/models/qwen"


def test_search_tool_config_uses_search_r1_retrieve() -> None:
    tool = render_search_tool_config("http://127.0.0.1:8000", VerlConfig(retrieval_timeout=12), 3)["tools"][0]
    assert tool["class_name"] == "verl.tools.search_tool.SearchTool"
    assert tool["config"]["retrieval_service_url"] == "http://127.0.0.1:8000/retrieve"
    assert tool["config"]["topk"] == 3 and tool["config"]["timeout"] == 12
    assert tool["tool_schema"]["function"]["name"] == "search"


def test_verl_top_k_is_refused_with_where_it_moved() -> None:
    """verl.top_k used to be overwritten silently by the stage's top-k; a preset still setting it is told where."""
    with pytest.raises(ValueError, match=r"verl.top_k was removed.*stages.<name>.top_k"):
        VerlConfig(top_k=3)


def test_values_with_special_characters_are_quoted() -> None:
    o = parse_overrides(render_overrides(
        VerlConfig(), model_path="/m", train_files="/a b/train.parquet", val_files="/v", tool_config_path="/t",
        agent_loop_config_path="/l", reward_path="/r", reward_name="f", output_dir="/o", experiment="e", run_name="r"))
    assert o["data.train_files"] == "'/a b/train.parquet'"


def test_presets_render_with_seed_hyperparameters() -> None:
    rendered = dict(_preset_verl_configs())
    assert {"research_grpo:grpo", "searchr1_grpo:grpo", "r1searcher_two_stage:stage1",
            "r1searcher_two_stage:stage2"} <= set(rendered)
    r1 = parse_overrides(_render(rendered["r1searcher_two_stage:stage2"]))
    assert r1["algorithm.adv_estimator"] == "reinforce_plus_plus_baseline"
    assert r1["actor_rollout_ref.rollout.n"] == "16" and r1["actor_rollout_ref.actor.optim.lr"] == "2e-06"
    sr1 = parse_overrides(_render(rendered["searchr1_grpo:grpo"]))
    assert sr1["data.train_batch_size"] == "512"
    assert sr1["actor_rollout_ref.rollout.multi_turn.max_assistant_turns"] == "4"
    for name, cfg in rendered.items():
        assert set(parse_overrides(_render(cfg))) <= VERL_KEYS, name


def test_overrides_compose_with_verl_hydra_config() -> None:
    """On a machine with verl (GPU worker env): verl's own hydra config accepts every override."""
    verl = pytest.importorskip("verl")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    for algo in ("grpo", "reinforce_pp", "ppo"):
        overrides = _render(VerlConfig(algorithm=algo))
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
        assert OmegaConf.select(cfg, "reward.custom_reward_function.name") == "compute_score"
        assert OmegaConf.select(cfg, "actor_rollout_ref.rollout.multi_turn.enable") is True


def test_tag_agent_loop_entry_and_completion_cut(smol_tokenizer) -> None:
    from training.rl.verl.agent_loop import AGENT_NAME, _completion, agent_loop_entry

    entry = agent_loop_entry("research", 5, 8, "instruct", "http://127.0.0.1:8000", 256)
    assert entry["name"] == AGENT_NAME and entry["_target_"].endswith("make_tag_agent_loop")
    ids = smol_tokenizer.encode("<search> Ed Wood </search> trailing text", add_special_tokens=False)
    comp = _completion(ids, smol_tokenizer, ("</search>",), budget=64)
    assert comp.finish_reason == "stop" and comp.text.endswith("</search>")
    assert smol_tokenizer.decode(comp.token_ids).endswith("</search>")
    eos = ids[:3] + [smol_tokenizer.eos_token_id, 5]
    assert _completion(eos, smol_tokenizer, ("</search>",), budget=64).finish_reason == "eos"


def test_one_effective_top_k_per_stage() -> None:
    """``RLConfig.stage_top_k`` is the one reading of documents per search: the stage's, else the preset's."""
    from infra.config import load_config
    from training.rl.config import RLConfig

    cfg = load_config(RLConfig, "research_grpo", ["top_k=4", "stages.grpo.top_k=2"])
    assert cfg.stage_top_k(cfg.stages[0]) == 2 and cfg.eval_top_k() == 2
    cfg = load_config(RLConfig, "research_grpo", ["top_k=4", "stages.grpo.top_k=null", "eval.top_k=6"])
    assert cfg.stage_top_k(cfg.stages[0]) == 4 and cfg.eval_top_k() == 6
    tool = render_search_tool_config("http://x", cfg.stages[0].verl, cfg.stage_top_k(cfg.stages[0]))["tools"][0]
    assert tool["config"]["topk"] == 4
