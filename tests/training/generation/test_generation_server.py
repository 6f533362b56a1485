"""The OpenAI-compatible generation server with the real SmolLM2 model: our OpenAI client and the rollout engine
against it over HTTP, request batching, and 4xx errors."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from infra.http import serve_in_thread
from training.agent.rollout import RolloutConfig, run_rollouts
from training.generation.base import SamplingParams
from training.generation.openai_client import GenerationServerError, OpenAICompatibleGenerator
from training.generation.server import GenerationServerConfig, create_generation_app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(smol_generator):
    app = create_generation_app(smol_generator, GenerationServerConfig(served_name="smol", token="tok",
                                                                       max_tokens_cap=64, max_wait_ms=20))
    with serve_in_thread(app) as url:
        yield f"{url}/v1", app


def _client(url: str, tokenizer=None, mode: str = "completions") -> OpenAICompatibleGenerator:
    return OpenAICompatibleGenerator(url, "smol", mode=mode, api_key="tok", tokenizer=tokenizer, retries=1)


def test_greedy_completions_match_the_local_generator(served, smol_generator) -> None:
    url, _ = served
    prompts = ["The capital of France is", "<think> I will search. </think> <search> Ed Wood"]
    sampling = SamplingParams(max_tokens=12, stop=["</search>", "\n\n"])
    remote = _client(url).generate(prompts, sampling)
    local = smol_generator.generate(prompts, sampling)
    assert [c.text for c in remote] == [c.text for c in local]
    assert [c.finish_reason for c in remote] == [c.finish_reason for c in local]
    assert [c.token_ids for c in remote] == [c.token_ids for c in local]  # vLLM's return_token_ids


def test_concurrent_requests_share_generate_calls_and_return_logprobs(served) -> None:
    url, app = served
    client = _client(url)
    before = app.state.batcher.calls
    prompts = [f"Question {i}: who wrote Hamlet? Answer:" for i in range(6)]
    sampling = SamplingParams(max_tokens=6, logprobs=True)
    with ThreadPoolExecutor(6) as pool:
        out = list(pool.map(lambda p: client.generate([p], sampling)[0], prompts))
    calls = app.state.batcher.calls - before
    assert calls < len(prompts), f"{calls} generate calls for {len(prompts)} concurrent requests"
    for comp in out:  # per-token log-probs came back and add up (bf16 greedy paths may differ from a solo call)
        assert comp.cumulative_logprob is not None and comp.cumulative_logprob <= 0
        assert len(comp.token_ids) <= 6


def test_chat_completions_and_models(served) -> None:
    url, _ = served
    chat = _client(url, mode="chat").generate(["Say hello."], SamplingParams(max_tokens=8))
    assert chat[0].text.strip() and chat[0].finish_reason in {"length", "eos"}
    with httpx.Client(headers={"Authorization": "Bearer tok"}) as http:
        assert http.get(f"{url}/models").json()["data"][0]["id"] == "smol"


def test_rollout_over_http_generator_and_retriever(served, smol_tokenizer, live_retriever, questions) -> None:
    """The whole agent loop with both model and retriever behind HTTP servers (how a GPU deployment runs)."""
    url, _ = served
    gen = _client(url, tokenizer=smol_tokenizer)
    trajs = run_rollouts(questions, "research", gen, live_retriever, RolloutConfig(max_tokens_per_turn=16,
                                                                                   max_total_tokens=32))
    assert len(trajs) == len(questions)
    for t in trajs:
        assert t.turns[0].generated and len(t.token_ids) == len(t.loss_mask) > 0


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"model": "other", "prompt": "x"}, 404, "not served here"),
    ({"model": "smol", "prompt": "x", "max_tokens": 65}, 400, "cap of 64"),
    ({"model": "smol", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "smol", "prompt": []}, 400, "prompt list is empty"),
    ({"model": "smol", "prompt": 3}, 400, "prompt"),
    ({"model": "smol", "prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x"}, 400, "model"),
])
def test_bad_requests_get_4xx_openai_errors(served, body, status, needle) -> None:
    url, _ = served
    with httpx.Client(headers={"Authorization": "Bearer tok"}) as http:
        r = http.post(f"{url}/completions", json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def test_token_is_required(served) -> None:
    url, _ = served
    with httpx.Client() as http:
        r = http.post(f"{url}/completions", json={"model": "smol", "prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(GenerationServerError, match="401"):
        OpenAICompatibleGenerator(url, "smol", api_key="wrong", retries=1).generate(["x"], SamplingParams())


def test_eval_openai_backend_gets_the_served_models_tokenizer(served) -> None:
    """``agent.generator.backend=openai`` with a local model name loads its tokenizer (chat templates work); an
    unknown served name (e.g. a hosted API model) gets none."""
    from training.generation.spec import served_tokenizer

    assert served_tokenizer("smollm2", None).chat_template
    assert served_tokenizer("gpt-4o-mini", None) is None


def test_oversize_body_gets_413_even_without_content_length(served) -> None:
    """The limit counts received bytes (a chunked upload declares no length), with OpenAI's error shape."""
    url, _ = served

    def chunks():
        for _ in range(9):
            yield b"x" * 1_000_000

    with httpx.Client(headers={"Authorization": "Bearer tok", "Content-Type": "application/json"}) as http:
        r = http.post(f"{url}/completions", content=chunks())
    assert r.status_code == 413 and "exceeds" in r.json()["error"]["message"]
