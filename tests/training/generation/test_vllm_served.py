"""vLLM's own OpenAI-compatible server from ``.venv-vllm`` (``serve generator --engine vllm``) driven by our
``openai`` backend: token ids and logprobs come back, K seeded copies differ, a rollout runs over HTTP against a
live retriever, and the server stops cleanly. Skipped when ``.venv-vllm`` is absent (``make vllm-env``)."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from infra.engine_envs import engine_python
from training.agent.rollout import RolloutConfig, run_rollouts
from training.generation.base import SamplingParams
from training.generation.openai_client import OpenAICompatibleGenerator
from training.generation.vllm_server import VLLMServer, VLLMServerConfig, serve_command

PROMPT = "<|im_start|>user\nCount from one to ten in words.<|im_end|>\n<|im_start|>assistant\n"
COLOR = "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n"


def test_config_binds_loopback_unless_a_token_is_set() -> None:
    with pytest.raises(ValidationError, match="not loopback"):
        VLLMServerConfig(host="0.0.0.0")
    assert VLLMServerConfig(host="0.0.0.0", token="t").host == "0.0.0.0"
    cmd = serve_command(VLLMServerConfig(token="secret", max_model_len=2048), "/m", "/py")
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"] and "--enforce-eager" in cmd
    assert "secret" not in " ".join(cmd)  # the token travels by environment (VLLM_API_KEY)


@pytest.mark.parametrize("native", [True, False])
def test_cpu_dtype_is_bf16_only_with_native_bf16_matmuls(monkeypatch, native: bool) -> None:
    # emulated bf16 (AVX2 only) made vLLM's CPU runner ~19x slower than fp32: 419.5 s vs 21.9 s for 6 x 24 tokens
    import training.generation.base as base
    from training.generation.vllm_offline import cpu_defaults

    monkeypatch.setattr(base, "cpu_native_bf16", lambda: native)
    want = "bfloat16" if native else "float32"
    assert cpu_defaults({}, on_cpu=True)["dtype"] == want
    assert cpu_defaults({"dtype": "auto"}, on_cpu=True)["dtype"] == want
    assert cpu_defaults({"dtype": "float16"}, on_cpu=True)["dtype"] == "float16"  # an explicit choice stays
    cmd = serve_command(VLLMServerConfig(), "/m", "/py")
    assert cmd[cmd.index("--dtype") + 1] == want
    cmd = serve_command(VLLMServerConfig(dtype="bfloat16"), "/m", "/py")
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(smol_path):
    if engine_python("vllm") is None:
        pytest.skip(".venv-vllm not built (make vllm-env)")
    server = VLLMServer(str(smol_path), VLLMServerConfig(port=_free_port(), served_name="smol", token="tok",
                                                         max_model_len=2048))
    with server:
        yield server
    assert server.proc is None


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_served_vllm_returns_ids_logprobs_and_distinct_seeded_samples(served, smol_tokenizer) -> None:
    gen = OpenAICompatibleGenerator(served.base_url, "smol", api_key="tok", tokenizer=smol_tokenizer, retries=1,
                                    timeout=1500)
    a, b = gen.generate([PROMPT, PROMPT], SamplingParams(max_tokens=32, stop=["3."], logprobs=True),
                        max_tokens=[32, 3])
    assert a.finish_reason == "stop" and a.text.endswith("3.") and "4" not in a.text
    assert smol_tokenizer.decode(a.token_ids) == a.text  # vLLM's ids are ours
    assert a.token_logprobs is not None and len(a.token_logprobs) == len(a.token_ids)
    assert b.finish_reason == "length" and len(b.token_ids) == 3
    eos = gen.generate(["<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\n"],
                       SamplingParams(max_tokens=64, logprobs=True))[0]
    # as every backend: ids end before the EOS the engine stopped on (vLLM's server returns it; parity counted it)
    assert eos.finish_reason == "eos" and eos.token_ids and smol_tokenizer.eos_token_id not in eos.token_ids
    assert len(eos.token_logprobs) == len(eos.token_ids)
    k = gen.generate([COLOR] * 4, SamplingParams(temperature=1.0, seed=11, max_tokens=12))
    assert len({tuple(c.token_ids) for c in k}) == 4
    # a seed fixes the sampler's draws, not the batch: concurrent requests batch differently from call to call and
    # vLLM is not batch-invariant (CI: copy 2 of 4 left the first sample at token 4), so the replay is sent one at
    # a time, as the first call's copies are compared with it
    serial = OpenAICompatibleGenerator(served.base_url, "smol", api_key="tok", tokenizer=smol_tokenizer, retries=1,
                                       timeout=1500, max_concurrency=1)
    once = serial.generate([COLOR] * 4, SamplingParams(temperature=1.0, seed=11, max_tokens=12))
    again = serial.generate([COLOR] * 4, SamplingParams(temperature=1.0, seed=11, max_tokens=12))
    assert [c.token_ids for c in again] == [c.token_ids for c in once]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_rollouts_over_served_vllm_and_a_live_retriever(served, smol_tokenizer, live_retriever, questions) -> None:
    gen = OpenAICompatibleGenerator(served.base_url, "smol", api_key="tok", tokenizer=smol_tokenizer, retries=1,
                                    timeout=1500)
    cfg = RolloutConfig(n=2, temperature=1.0, seed=5, max_tokens_per_turn=24, max_total_tokens=48, max_turns=2)
    trajs = run_rollouts(questions, "exsearch", gen, live_retriever, cfg, tokenizer=smol_tokenizer)
    assert len(trajs) == 2 * len(questions)
    assert all(t.turns and len(t.token_ids) == len(t.loss_mask) > 0 for t in trajs)
