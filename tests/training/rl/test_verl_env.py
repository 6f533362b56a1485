"""verl 0.9.1's CPU-runnable parts on our pieces, in ``.venv-verl`` (``tests/training/rl/verl_env_checks.py`` runs
there by subprocess): our overrides compose against verl's real Hydra config, verl's reward loop calls our reward
module on rollout records (ReSearch's finished flag included), and our tag agent loop runs through verl's
``AgentLoopBase`` against a live OpenAI-compatible server and retriever. Skipped when ``.venv-verl`` is absent
(``make verl-env``). What cannot run here: ``main_ppo`` itself (Ray actors with FSDP workers and vLLM/SGLang rollout
replicas: verl's ``[vllm]`` pins torch 2.11 and CUDA kernels)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from infra.engine_envs import engine_env, engine_python
from training.rewards.adapters import score_response

pytestmark = [pytest.mark.verl, pytest.mark.slow]
SCRIPT = Path(__file__).with_name("verl_env_checks.py")


def _run(check: str, payload: dict, tmp_path: Path) -> dict:
    exe = engine_python("verl")
    if exe is None:
        pytest.skip(".venv-verl not built (make verl-env)")
    path = tmp_path / f"{check}.json"
    path.write_text(json.dumps(payload))
    out = subprocess.run([str(exe), str(SCRIPT), check, str(path)], env=engine_env(), capture_output=True,
                         text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_overrides_compose_against_verls_hydra_config(tmp_path) -> None:
    out = _run("compose", {}, tmp_path)
    assert {v["algorithm.adv_estimator"] for v in out.values()} == {"grpo", "reinforce_plus_plus_baseline", "gae"}
    for v in out.values():  # verl 0.9 reads the reward function only from reward.custom_reward_function
        assert v["reward.custom_reward_function.path"].endswith("training/rewards/adapters.py")
        assert v["actor_rollout_ref.rollout.multi_turn.enable"] is True
        assert v["actor_rollout_ref.rollout.agent.default_agent_loop"] == "searchloop_tags"


def test_verl_reward_loop_scores_our_rollouts(tmp_path, scripted, bm25, questions, smol_path) -> None:
    from training.agent.rollout import RolloutConfig, run_rollouts

    trajs = run_rollouts(questions, "research", scripted("research"), bm25, RolloutConfig(max_total_tokens=256))
    rows, expected = [], []
    for t in trajs:
        for finished in (True, False):  # verl's decoded text never shows EOS: the flag must carry it
            response = t.response.removesuffix("<|im_end|>")
            rows.append({"prompt": t.prompt, "response": response, "golds": t.golden_answers,
                         "extra_fields": {"finished": finished, "n_searches": t.n_searches}})
            expected.append(score_response("research", response, t.golden_answers, finished=finished).score)
    out = _run("reward", {"model": str(smol_path), "reward": "research", "rows": rows}, tmp_path)
    assert [s["score"] for s in out["scores"]] == pytest.approx(expected)
    assert max(expected) > 0 and expected[1::2] == [0.0] * len(trajs)  # unfinished responses score 0


def test_our_agent_loop_runs_through_verls_interface(tmp_path, smol_path, smol_generator, live_retriever) -> None:
    from retrieval.server import serve_in_thread
    from training.generation.server import GenerationServerConfig, create_generation_app

    app = create_generation_app(smol_generator, GenerationServerConfig(served_name="smol", token="tok"))
    with serve_in_thread(app) as url:
        out = _run("agent_loop", {
            "model": str(smol_path), "base_url": f"{url}/v1", "served_name": "smol", "token": "tok",
            "retriever_url": live_retriever.base_url, "protocol": "exsearch", "max_turns": 2, "per_turn": 32,
            "response_length": 160, "question": "Who directed the film Ed Wood?", "golds": ["Tim Burton"]},
            tmp_path)
    assert out["class"] == "AgentLoopBase"
    assert 0 < len(out["response_ids"]) == len(out["response_mask"]) <= 160
    assert set(out["extra_fields"]) == {"finished", "n_searches"}
    if out["extra_fields"]["n_searches"]:  # inserted documents are masked out of the loss
        assert 0 in out["response_mask"] and 1 in out["response_mask"]


def test_smartsearch_group_branches_and_judge_reward_through_verl(tmp_path, smol_path, live_retriever) -> None:
    from training.rewards.adapters import compute_score_smartsearch

    n = 4
    out = _run("smartsearch_group", {
        "model": str(smol_path), "retriever_url": live_retriever.base_url, "response_length": 256, "n": n,
        "dir": str(tmp_path), "question": "Who directed the film Ed Wood?", "golds": ["Tim Burton"]}, tmp_path)
    samples = out["samples"]
    assert len(samples) == n and {s["class"] for s in samples} == {"AgentLoopBase"}
    # the seed's group mix (issue 23 fix 1): copy 2k is on-policy, copy 2k+1 branches from copy 2k's refined prefix
    leaders, branches = samples[0::2], samples[1::2]
    leader = leaders[0]
    for lead in leaders:  # each on-policy copy: its one round judged not useful (scripted judge), refined, kept
        lf = lead["extra_fields"]
        assert lf["branch"] == 0 and lf["group_size"] == n and lf["round_useful"] == [0]
        assert (lf["refined"], lf["refine_failed"], lf["skipped_length"], lf["kept_prefixes"]) == (1, 0, 0, 1)
        assert "who directed ed wood" in lead["response_text"]
    for s in branches:  # each branch continued from its own leader's refined prefix, the refined query generated
        f = s["extra_fields"]
        assert f["branch"] == 1 and f["branch_round"] == 0 and f["round_useful"] == [1] and f["judge_failed"] == 0
        assert "Ed Wood film director" in s["generated_text"] and "who directed ed wood" not in s["response_text"]
        assert "\\boxed{Tim Burton}" in s["generated_text"]
    for s in samples:  # inserted documents masked out of the loss, generated text in
        assert s["n_ids"] == s["n_mask"] > 0
        assert "<result>" in s["inserted_text"] and "<result>" not in s["generated_text"]
        assert "<search>" in s["generated_text"] and "<search>" not in s["inserted_text"]
        assert set(s["extra_fields"]) >= {"finished", "n_searches", "round_useful", "judge_failed", "max_redundancy"}
    assert out["groups_left"] == 0  # the coordinator dropped the group once every copy took its share
    # verl's reward loop scored each sample with the judge's verdicts: the leader's bad round costs 0.1
    assert all(lead["reward"]["bad_rounds"] == 1.0 for lead in leaders)
    assert all(s["reward"]["bad_rounds"] == 0.0 for s in branches)
    assert leader["score"] == pytest.approx(branches[0]["score"] - 0.1)
    info = {"question": "Who directed the film Ed Wood?"}
    for s in samples:
        text = s["response_text"].replace("<|im_end|>", "")
        expect = compute_score_smartsearch("musique", text, ["Tim Burton"], {**info, **s["extra_fields"]})
        assert s["score"] == pytest.approx(expect["score"])
    redundancy_only = compute_score_smartsearch("musique", leader["response_text"].replace("<|im_end|>", ""),
                                                ["Tim Burton"], info)
    assert redundancy_only["bad_rounds"] == 0 and leader["score"] < redundancy_only["score"]
