"""SmartSearch presets validate; the verl command of stage 3 renders; the whole smartsearch_curriculum flow runs at
micro size under Prefect's harness (SmolLM2 policy, a scripted OpenAI-compatible judge/refiner over real HTTP, real
BM25, real LLaMA-Factory SFT, TRL GRPO, MLflow) and a re-run comes back from the stage manifests."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from infra.config import load_config
from training.smartsearch.config import SmartSearchConfig


def test_smartsearch_presets_validate() -> None:
    demo = load_config(SmartSearchConfig, "smartsearch_cpu_demo")
    assert demo.model == "smollm2" and demo.endpoint.serve_model == "smollm2" and demo.stage3.engine == "trl"
    paper = load_config(SmartSearchConfig, "smartsearch_paper")
    v = paper.stage3.verl
    assert (v.n, v.lr, v.train_batch_size, v.ppo_mini_batch_size) == (8, 1e-6, 256, 64)
    assert (v.max_prompt_length, v.max_response_length, v.max_turns, paper.stage3.max_turns) == (8192, 8192, 5, 5)
    assert (v.kl_coef, v.kl_loss_type, v.use_kl_loss) == (0.001, "low_var_kl", True)
    assert paper.stage1.screen.min_f1 == 0.8 and paper.stage2.dpo.lora_rank == 8 and paper.stage2.dpo.beta == 0.1
    with pytest.raises(Exception, match="stage3.verl"):
        load_config(SmartSearchConfig, "smartsearch_paper", ["stage3.verl=null"])


def test_stage3_verl_command_renders(tmp_path) -> None:
    from training.smartsearch.grpo import render_verl_command

    cfg = load_config(SmartSearchConfig, "smartsearch_paper", [
        "stage3.questions=[{path: data/train/musique_train_mini.jsonl, limit: 4}]", "verl_python=/opt/verl/bin/python"])
    cmd = render_verl_command(cfg, "Qwen/Qwen2.5-3B-Instruct", tmp_path)
    o = dict(a.split("=", 1) for a in cmd[3:])
    assert cmd[:3] == ["/opt/verl/bin/python", "-m", "verl.trainer.main_ppo"]
    assert o["actor_rollout_ref.rollout.n"] == "8" and o["actor_rollout_ref.actor.optim.lr"] == "1e-06"
    assert o["actor_rollout_ref.actor.kl_loss_type"] == "low_var_kl" and o["data.max_response_length"] == "8192"
    assert o["reward.custom_reward_function.name"] == "compute_score_smartsearch"
    assert o["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-3B-Instruct" and (tmp_path / "command.txt").exists()


class ScriptedJudge(BaseHTTPRequestHandler):
    """A fake OpenAI-compatible chat endpoint: the judge's verdict is a hash of the prompt (deterministic, both
    values occur), one reply in five is junk (a failed call); the refiner always answers a query."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._send({"data": [{"id": "judge"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        h = int(hashlib.sha1(prompt.encode()).hexdigest(), 16)
        if "query-refine assistant" in prompt:
            text = "<search> Ed Wood film director </search><explanation>more specific</explanation>"
        elif h % 5 == 0:
            text = "hmm, hard to say"
        else:
            text = f"<answer> {h % 2} </answer><explanation>scripted</explanation>"
        self._send({"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": "stop"}]})

    def _send(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def judge_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedJudge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def micro(url: str) -> list[str]:
    return [
        f"endpoint.base_url={url}", "endpoint.serve_model=null", "endpoint.mode=chat", "judge.response_prefix=",
        "judge.kind=model", "refiner.kind=model",  # the scripted LLM judge/refiner, not the demo's rule stand-ins
        "refiner.response_prefix=", "stage1.questions=[{path: data/train/hotpotqa_train_mini.jsonl, limit: 2}]",
        "stage1.sampling.n=1", "stage1.sampling.max_total_tokens=48", "stage1.sampling.max_tokens_per_turn=24",
        "stage1.teacher.decomposition_files=[{path: data/train/hotpotqa_train_mini.jsonl, limit: 4}]",
        "stage1.teacher.fireact_file=null", "stage1.sft.max_steps=1", "stage1.sft.gradient_accumulation_steps=1",
        "stage2.questions=[{path: data/train/hotpotqa_train_mini.jsonl, limit: 3}]", "stage2.regenerations=1",
        "stage2.sampling.max_total_tokens=48", "stage2.sampling.max_tokens_per_turn=24", "stage2.dpo.max_steps=1",
        "stage3.questions=[{path: data/train/musique_train_mini.jsonl, limit: 1}]", "stage3.trl.max_steps=1",
        "stage3.trl.num_generations=2", "stage3.trl.max_completion_length=48", "stage3.trl.max_tokens_per_turn=24",
        "eval.limit=1", "eval.max_new_tokens=24",
        "top_k=1", "stage1.sft.cutoff_len=640", "stage3.max_turns=2",  # the demo's top-3 settings cost time here
        "stage1.policy_warmup_steps=1", "stage2.sampling.n=1",  # the demo's warm-up and sibling samples, smaller
    ]


@pytest.mark.slow
def test_smartsearch_flow_micro(prefect_harness, judge_url) -> None:
    import mlflow

    from flows.smartsearch_curriculum import smartsearch_curriculum

    result = smartsearch_curriculum(preset="smartsearch_cpu_demo", overrides=micro(judge_url))
    sft, dpo, grpo = result.stages
    c1 = sft.counts
    assert c1["sampled_policy"] == 2 and c1["sampled_teacher"] >= 1 and c1["rounds_judged"] >= 1
    assert c1["warmup_steps"] == 1 and c1["warmup_rows"] == c1["kept_teacher"]  # the policy sampled the warm-up
    assert c1["verdict_1"] + c1["verdict_0"] + c1["verdict_failed"] == c1["rounds_judged"]
    assert c1["kept"] == c1["kept_policy"] + c1["kept_teacher"]
    screen = [json.loads(x) for x in Path(sft.dir, "screen.jsonl").read_text().splitlines()]
    assert len(screen) == c1["sampled_policy"] + c1["sampled_teacher"]
    assert sum(r["decision"] == "kept" for r in screen) == c1["kept"]
    assert sft.trained == (c1["kept"] > 0) and Path(sft.model, "config.json").exists()
    c2 = dpo.counts
    assert c2["sampled"] == 3 and c2["refined"] == c2["regenerations"] and c2["pairs"] == (
        c2["pairs_original_correct"] + c2["pairs_regeneration_correct"])
    refinements = Path(dpo.dir, "refinements.jsonl").read_text().splitlines()
    assert len(refinements) == c2["refine_requests"]
    assert all(json.loads(r)["refined_query"] == "Ed Wood film director" for r in refinements)
    assert dpo.trained == (c2["pairs"] > 0)
    c3 = grpo.counts
    assert grpo.trained and c3["steps"] == 1 and c3["groups"] == 1
    assert c3["on_policy"] + c3["branches"] == 2 and Path(grpo.model, "config.json").exists()
    assert "initial" in result.scores and "grpo" in result.scores
    row = result.scores["grpo"].row("hotpotqa_mini")
    assert row.n == 1 and row.metrics["f1"].low <= row.metrics["f1"].mean <= row.metrics["f1"].high
    assert result.registered["grpo"].version == "1"
    client = mlflow.MlflowClient()
    children = client.search_runs(client.get_run(result.run_id).info.experiment_id,
                                  f"tags.mlflow.parentRunId = '{result.run_id}'")
    names = {r.info.run_name for r in children}
    assert {"stage1-sft", "stage2-dpo", "stage3-grpo", "eval-initial", "eval-grpo", "register-grpo"} <= names
    s1 = next(r for r in children if r.info.run_name == "stage1-sft")
    assert s1.data.metrics["counts/rounds_judged"] == c1["rounds_judged"]
    assert {a.path for a in client.list_artifacts(s1.info.run_id, "data")} >= {"data/verdicts.jsonl",
                                                                                "data/screen.jsonl"}
    # a re-run comes back from the manifests (no stage is redone)
    mtime = Path(grpo.dir, "manifest.json").stat().st_mtime_ns
    again = smartsearch_curriculum(preset="smartsearch_cpu_demo", overrides=micro(judge_url))
    assert [s.counts for s in again.stages] == [s.counts for s in result.stages]
    assert Path(grpo.dir, "manifest.json").stat().st_mtime_ns == mtime
