"""Run inside ``.venv-verl`` by ``test_verl_env.py`` (not a test module): verl 0.9.1's own code on our pieces.

``python tests/training/rl/verl_env_checks.py <check> <input.json>`` prints one JSON line:
- ``compose``: our rendered overrides for every algorithm against verl's Hydra ``ppo_trainer`` config;
- ``reward``: our reward module loaded by verl's ``get_custom_reward_fn`` and called through verl's reward-loop
  ``NaiveRewardManager.run_single`` on ``DataProto`` items built from rollout records;
- ``agent_loop``: our tag agent loop instantiated and run through verl's ``AgentLoopBase`` against a live
  OpenAI-compatible server and retriever;
- ``smartsearch_group``: SmartSearch's loop (``training.smartsearch.verl_loop``) registered from its rendered YAML
  entry the way verl's ``AgentLoopWorker`` does (``OmegaConf.load`` + ``hydra.utils.instantiate`` per sample), the
  ``n`` copies of one prompt run as concurrent tasks sharing a ``uid`` with a scripted policy (in-process server
  manager), a scripted judge/refiner over real HTTP and the live retriever; then each sample scored by verl's
  ``NaiveRewardManager`` with the loop's ``extra_fields`` as ``tool_extra_fields``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _compose(overrides: list[str]) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _overrides(algorithm: str, reward_name: str = "compute_score", **kw: Any) -> list[str]:
    from training.rl.verl.config import VerlConfig, render_overrides
    from training.rl.verl.launch import REWARD_MODULE

    return render_overrides(
        VerlConfig(algorithm=algorithm, **kw), model_path="/models/m", train_files="/d/train.parquet",
        val_files="/d/val.parquet", tool_config_path="/d/tool.yaml", agent_loop_config_path="/d/loop.yaml",
        reward_path=str(REWARD_MODULE), reward_name=reward_name, output_dir="/ckpt", experiment="searchloop",
        run_name="cpu-check", rollout_dump_dir="/ckpt/dump")


def check_compose(_: dict) -> dict:
    from omegaconf import OmegaConf

    out = {}
    for algo in ("grpo", "reinforce_pp", "ppo"):
        cfg = _compose(_overrides(algo))
        out[algo] = {k: OmegaConf.select(cfg, k) for k in (
            "algorithm.adv_estimator", "reward.custom_reward_function.path", "reward.custom_reward_function.name",
            "actor_rollout_ref.rollout.multi_turn.enable", "actor_rollout_ref.rollout.agent.default_agent_loop")}
    return out


def check_reward(inp: dict) -> dict:
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    tok = AutoTokenizer.from_pretrained(inp["model"])
    cfg = _compose(_overrides("grpo", reward_name=f"compute_score_{inp['reward']}"))
    fn = get_custom_reward_fn(cfg)
    manager = NaiveRewardManager(cfg, tok, fn)
    scores = []
    for row in inp["rows"]:
        p = tok.encode(row["prompt"], add_special_tokens=False)
        r = tok.encode(row["response"], add_special_tokens=False)
        data = DataProto.from_dict(
            tensors={"prompts": torch.tensor([p]), "responses": torch.tensor([r]),
                     "attention_mask": torch.ones(1, len(p) + len(r), dtype=torch.long)},
            non_tensors={"data_source": np.array(["musique"], dtype=object),
                         "reward_model": np.array([{"ground_truth": row["golds"]}], dtype=object),
                         "extra_info": np.array([{}], dtype=object),
                         "tool_extra_fields": np.array([row["extra_fields"]], dtype=object)})
        result = manager.loop.run_until_complete(manager.run_single(data))
        scores.append({"score": result["reward_score"], "extra": result["reward_extra_info"]})
    return {"scores": scores, "reward_fn": str(cfg.reward.custom_reward_function.path)}


def check_agent_loop(inp: dict) -> dict:
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from training.rl.verl.agent_loop import OpenAIServerManager, make_tag_agent_loop

    tok = AutoTokenizer.from_pretrained(inp["model"])
    cfg = _compose(_overrides("grpo", max_response_length=inp["response_length"], max_prompt_length=1024))
    manager = OpenAIServerManager(inp["base_url"], inp["served_name"], tok, api_key=inp.get("token"))
    loop = make_tag_agent_loop(
        trainer_config=DictConfigWrap(cfg), server_manager=manager, tokenizer=tok, processor=None,
        dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data), protocol=inp["protocol"], top_k=2,
        max_turns=inp["max_turns"], template="instruct", retriever_url=inp["retriever_url"],
        max_tokens_per_turn=inp["per_turn"])
    out = loop.loop.run_until_complete(loop.run(
        {"temperature": 0.0, "top_p": 1.0},
        extra_info={"id": "q1", "question": inp["question"]}, reward_model={"ground_truth": inp["golds"]}))
    return {"class": type(loop).__mro__[1].__name__, "prompt_ids": list(out.prompt_ids),
            "response_ids": list(out.response_ids), "response_mask": list(out.response_mask),
            "num_turns": out.num_turns, "extra_fields": out.extra_fields,
            "response_text": tok.decode(out.response_ids)}


ORIGINAL_QUERY = "who directed ed wood"
REFINED_QUERY = "Ed Wood film director"


class ScriptedPolicy:
    """verl's ``server_manager.generate`` for a scripted policy: search once (the original query), then answer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.calls = tokenizer, 0

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **_: Any) -> Any:
        import asyncio
        from types import SimpleNamespace

        await asyncio.sleep(0.01)  # a real suspension, as a remote server call
        self.calls += 1
        response = self.tokenizer.decode(prompt_ids).rsplit("<|im_start|>assistant", 1)[-1]
        if "</search>" not in response:
            text, eos = f" I should search. </think>\n<search> {ORIGINAL_QUERY} </search> tail", []
        else:
            eos = [self.tokenizer.eos_token_id]
            text = "<think> found it </think> <answer> \\boxed{Tim Burton} </answer>"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + eos
        return SimpleNamespace(token_ids=ids, log_probs=None, stop_reason="completed")


def _judge_server() -> Any:
    import re
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt = body["messages"][0]["content"]
            if "query-refine assistant" in prompt:
                text = f"<search> {REFINED_QUERY} </search><explanation>the film, not the person</explanation>"
            else:
                last = re.findall(r"<search>([^<]*)</search>", prompt)[-1].strip()
                text = f"<answer> {0 if last == ORIGINAL_QUERY else 1} </answer><explanation>scripted</explanation>"
            data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def check_smartsearch_group(inp: dict) -> dict:
    import asyncio

    import hydra
    import numpy as np
    import torch
    import yaml
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from training.smartsearch.config import EndpointSpec, LoopSpec
    from training.smartsearch.verl_loop import COORDINATOR, smartsearch_loop_entry

    tok = AutoTokenizer.from_pretrained(inp["model"])
    cfg = _compose(_overrides("grpo", max_response_length=inp["response_length"], max_prompt_length=1024,
                              reward_name="compute_score_smartsearch"))
    server = _judge_server()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    spec = LoopSpec(endpoint=EndpointSpec(base_url=url, model="judge", mode="chat"))
    entry = smartsearch_loop_entry("smartsearch", 2, 4, "instruct", inp["retriever_url"], 48, spec)
    path = Path(inp["dir"]) / "agent_loop.yaml"
    path.write_text(yaml.safe_dump([entry]))
    [loop_cfg] = OmegaConf.load(path)  # as AgentLoopWorker.__init__ registers agent_loop_config_path
    policy = ScriptedPolicy(tok)
    info = {"index": 0, "id": "q1", "question": inp["question"], "split": "train"}
    n = inp["n"]

    async def one(kwargs: dict) -> Any:  # AgentLoopWorker._run_agent_loop: a fresh loop object per sample
        loop = hydra.utils.instantiate(config=loop_cfg, trainer_config=DictConfigWrap(config=cfg),
                                       server_manager=policy, tokenizer=tok, processor=None,
                                       dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data))
        return type(loop).__mro__[2].__name__, await loop.run({"temperature": 1.0, "top_p": 1.0}, **kwargs)

    async def group() -> list[Any]:  # AgentLoopWorker.generate_sequences: one task per sample, then gather
        rows = [{"uid": "u1", "index": 0, "extra_info": dict(info),
                 "reward_model": {"ground_truth": inp["golds"]}} for _ in range(n)]
        return await asyncio.gather(*[asyncio.create_task(one(r)) for r in rows])

    outs = asyncio.new_event_loop().run_until_complete(group())
    server.shutdown()
    fn = get_custom_reward_fn(cfg)
    manager = NaiveRewardManager(cfg, tok, fn)
    samples = []
    for cls, out in outs:
        ids, mask = list(out.response_ids), list(out.response_mask)
        p = list(out.prompt_ids)
        data = DataProto.from_dict(
            tensors={"prompts": torch.tensor([p]), "responses": torch.tensor([ids]),
                     "attention_mask": torch.ones(1, len(p) + len(ids), dtype=torch.long)},
            non_tensors={"data_source": np.array(["musique"], dtype=object),
                         "reward_model": np.array([{"ground_truth": inp["golds"]}], dtype=object),
                         "extra_info": np.array([dict(info)], dtype=object),
                         "tool_extra_fields": np.array([dict(out.extra_fields)], dtype=object)})
        result = manager.loop.run_until_complete(manager.run_single(data))
        samples.append({
            "class": cls, "response_text": tok.decode(ids), "n_ids": len(ids), "n_mask": len(mask),
            "generated_text": tok.decode([i for i, m in zip(ids, mask, strict=True) if m]),
            "inserted_text": tok.decode([i for i, m in zip(ids, mask, strict=True) if not m]),
            "extra_fields": out.extra_fields, "score": result["reward_score"], "reward": result["reward_extra_info"]})
    return {"samples": samples, "groups_left": len(COORDINATOR), "policy_calls": policy.calls}


if __name__ == "__main__":
    checks = {"compose": check_compose, "reward": check_reward, "agent_loop": check_agent_loop,
              "smartsearch_group": check_smartsearch_group}
    payload = json.loads(Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else {}
    print(json.dumps(checks[sys.argv[1]](payload), default=str))
