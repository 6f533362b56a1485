"""Per-request seeds (paper-path bug 1): the K copies of a question must not share a seed on engines that seed each
request (vLLM offline, OpenAI-compatible servers), and seeds must differ per step while staying reproducible."""

from __future__ import annotations

import json
import sys
import types

import httpx

from training.generation.base import SamplingParams, derive_seed
from training.generation.openai_client import OpenAICompatibleGenerator


def test_derive_seed_is_reproducible_and_unstructured() -> None:
    assert derive_seed(7, 3) == derive_seed(7, 3)
    assert 0 <= derive_seed(7, 3) < 2**31
    # seed + step arithmetic collides across EM iterations (iteration 1 step 0 == iteration 0 step 1); this does not
    assert derive_seed(1, 0) != derive_seed(0, 1)
    seeds = {derive_seed(s, step, i) for s in range(4) for step in range(8) for i in range(16)}
    assert len(seeds) == 4 * 8 * 16


def _seed_echo(calls: list[dict]):
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body)
        choices = [{"index": i * body["n"] + j, "text": f"s{body.get('seed')}-{j}", "finish_reason": "length",
                    "token_ids": [1]} for i, _ in enumerate(body["prompt"]) for j in range(body["n"])]
        return httpx.Response(200, json={"choices": choices})

    return handle


def test_openai_copies_of_a_prompt_get_different_seeds() -> None:
    calls: list[dict] = []
    gen = OpenAICompatibleGenerator("http://127.0.0.1:1/v1", "m", transport=httpx.MockTransport(_seed_echo(calls)))
    sampling = SamplingParams(temperature=1.0, seed=7, max_tokens=4)
    out = gen.generate(["same question"] * 4, sampling)
    assert len({c.text for c in out}) == 4  # a server seeding each request alike would return 4 equal samples
    assert all(len(c["prompt"]) == 1 for c in calls) and len({c["seed"] for c in calls}) == 4
    again = gen.generate(["same question"] * 4, sampling)
    assert [c.text for c in again] == [c.text for c in out]  # reproducible
    calls.clear()
    gen.generate(["a", "b", "c"], SamplingParams(temperature=1.0, max_tokens=4))
    assert len(calls) == 1 and "seed" not in calls[0]  # unseeded calls stay one batched request


def test_vllm_copies_of_a_prompt_get_different_seeds(monkeypatch) -> None:
    seen: list = []

    class FakeSP:
        def __init__(self, **kw) -> None:
            self.__dict__.update(kw)

    class FakeLLM:
        def generate(self, prompts, params, use_tqdm=False):
            seen.extend(params)
            out = types.SimpleNamespace(text="x", token_ids=[1], finish_reason="length", stop_reason=None,
                                        cumulative_logprob=None, logprobs=None)
            return [types.SimpleNamespace(outputs=[out] * p.n) for p in params]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=FakeSP))
    from training.generation.vllm_offline import VLLMGenerator

    tok = types.SimpleNamespace(eos_token="<|im_end|>")
    gen = VLLMGenerator(FakeLLM(), tok)
    gen.generate(["q"] * 5, SamplingParams(temperature=1.0, seed=3, max_tokens=4))
    assert len({p.seed for p in seen}) == 5
    first = [p.seed for p in seen]
    seen.clear()
    gen.generate(["q"] * 5, SamplingParams(temperature=1.0, seed=3, max_tokens=4))
    assert [p.seed for p in seen] == first


def test_rollout_steps_get_unrelated_seeds() -> None:
    from training.agent.rollout import RolloutConfig, _generate_step

    class Proto:
        default_best_of = 1
        default_max_tokens_per_turn = 512

        def stop_strings(self, state):
            return ("</search>",)

        def generation_prompt(self, state):
            return "p"

    class Gen:
        eos_token = None

        def __init__(self) -> None:
            self.seeds: list = []

        def generate(self, prompts, sampling, max_tokens=None):
            self.seeds.append(sampling.seed)
            return [None] * len(prompts)

    gen, state = Gen(), types.SimpleNamespace(generated_tokens=0)
    for base, step in [(0, 1), (1, 0)]:
        _generate_step([state], Proto(), gen, RolloutConfig(seed=base, temperature=1.0), step)
    assert gen.seeds[0] != gen.seeds[1]  # seed+step gave 1 and 1
