"""Generation backends: stop-string cutting, best-of selection, the transformers backend with the real SmolLM2,
the OpenAI-compatible client against a mock transport, and vLLM on a GPU worker."""

from __future__ import annotations

import json

import httpx
import pytest

from infra.errors import ConfigError
from training.generation.base import Completion, SamplingParams, cut_at_stop, load_generator, regroup, select_best
from training.generation.openai_client import GenerationServerError, OpenAICompatibleGenerator


def test_cut_at_stop_picks_the_earliest_end() -> None:
    assert cut_at_stop("a </search> b </answer>", ["</answer>", "</search>"]) == ("a </search>", "</search>")
    assert cut_at_stop("no stop", ["</search>"]) == ("no stop", None)
    assert cut_at_stop("x<|end_of_query|>", ["<|end_of_query|>", ""]) == ("x<|end_of_query|>", "<|end_of_query|>")


def test_best_of_selection_and_params() -> None:
    cands = [Completion("a", cumulative_logprob=-3.0), Completion("b", cumulative_logprob=-1.0),
             Completion("c", cumulative_logprob=None), Completion("d", cumulative_logprob=-2.0)]
    assert [c.text for c in select_best(cands, 2)] == ["b", "d"]
    sampling = SamplingParams(n=1, best_of=2)
    assert [c.text for c in regroup(cands, 2, sampling)] == ["b", "d"]
    with pytest.raises(ValueError, match="best_of"):
        SamplingParams(n=3, best_of=2)
    with pytest.raises(ConfigError, match="unknown generation backend"):
        load_generator("nope", "smollm2")


@pytest.mark.slow
def test_transformers_stop_strings_budgets_and_eos(smol_generator) -> None:
    prompts = ["<|im_start|>user\nCount from one to ten in words.<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\n"]
    out = smol_generator.generate(prompts, SamplingParams(max_tokens=24, stop=["4.", "5."]), max_tokens=[24, 6])
    assert len(out) == 2
    first, second = out
    assert first.finish_reason == "stop" and first.stop in {"4.", "5."} and first.text.endswith(first.stop)
    assert "6" not in first.text and first.text.count("\n") == 3
    assert second.finish_reason in {"eos", "length", "stop"} and len(second.token_ids) <= 6
    assert "<|im_end|>" not in second.text
    again = smol_generator.generate(prompts[:1], SamplingParams(max_tokens=24, stop=["4.", "5."]))
    assert again[0].text == first.text  # greedy is deterministic and batch-independent here


@pytest.mark.slow
def test_transformers_seeded_sampling_and_best_of(smol_generator) -> None:
    prompt = ["<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n"]
    s = SamplingParams(temperature=1.0, n=3, best_of=3, seed=7, max_tokens=6, logprobs=True)
    three = smol_generator.generate(prompt, s)
    assert len(three) == 3
    lps = [c.cumulative_logprob for c in three]
    assert all(lp is not None and lp <= 0 for lp in lps) and lps == sorted(lps, reverse=True)
    best = smol_generator.generate(prompt, SamplingParams(temperature=1.0, n=1, best_of=3, seed=7, max_tokens=6))
    assert best[0].text == three[0].text and best[0].cumulative_logprob == pytest.approx(lps[0], abs=1e-3)


def _openai_handler(calls: list[dict]):
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append({"path": request.url.path, **body})
        if body.get("max_tokens") == 99:
            return httpx.Response(400, json={"error": "bad max_tokens"})
        prompts = body.get("prompt") or ["chat"]
        choices = []
        for i, p in enumerate(prompts):
            for j in range(body["n"]):
                idx = i * body["n"] + j
                if "search" in p:
                    choice = {"text": f" q{j} </search>", "finish_reason": "stop", "stop_reason": "</search>"}
                elif "bare" in p:  # a server that drops the stop string from the text
                    choice = {"text": " q", "finish_reason": "stop", "stop_reason": "</search>"}
                elif "long" in p:
                    choice = {"text": "x" * 10, "finish_reason": "length", "stop_reason": None}
                else:
                    choice = {"text": "done", "finish_reason": "stop", "stop_reason": None}
                choice.update(index=idx, logprobs={"token_logprobs": [-1.0 * (j + 1), -0.5]}, token_ids=[5, 6])
                if "message" in request.url.path or request.url.path.endswith("chat/completions"):
                    choice = {"index": idx, "message": {"content": choice["text"]}, "finish_reason": "stop"}
                choices.append(choice)
        return httpx.Response(200, json={"choices": choices})

    return handle


def test_openai_completions_client_parses_and_batches() -> None:
    calls: list[dict] = []
    gen = OpenAICompatibleGenerator("http://127.0.0.1:1/v1", "m", transport=httpx.MockTransport(_openai_handler(calls)),
                                    eos_token="<|im_end|>")
    prompts = ["please search", "bare", "long", "plain"]
    out = gen.generate(prompts, SamplingParams(stop=["</search>"], max_tokens=8), max_tokens=[8, 8, 8, 4])
    assert [c.finish_reason for c in out] == ["stop", "stop", "length", "eos"]
    assert out[0].text == " q0 </search>" and out[1].text == " q</search>" and out[1].stop == "</search>"
    assert len(calls) == 2 and sorted(len(c["prompt"]) for c in calls) == [1, 3]
    assert all(c["include_stop_str_in_output"] and c["stop"] == ["</search>"] for c in calls)
    best = gen.generate(["please search"], SamplingParams(n=1, best_of=3))
    assert best[0].text == " q0 </search>" and best[0].cumulative_logprob == pytest.approx(-1.5)
    assert calls[-1]["n"] == 3 and calls[-1]["logprobs"] == 1


def test_openai_chat_mode_and_errors() -> None:
    calls: list[dict] = []
    transport = httpx.MockTransport(_openai_handler(calls))
    chat = OpenAICompatibleGenerator("http://127.0.0.1:1/v1", "m", mode="chat", transport=transport)
    out = chat.generate(["hi", "there"], SamplingParams())
    assert [c.text for c in out] == ["done", "done"] and calls[0]["messages"][0]["content"] == "hi"
    with pytest.raises(GenerationServerError, match="400"):
        chat.generate(["x"], SamplingParams(max_tokens=99))
    dead = OpenAICompatibleGenerator("http://127.0.0.1:9/v1", "m", retries=1, timeout=2)
    with pytest.raises(GenerationServerError, match="cannot reach"):
        dead.generate(["x"], SamplingParams())
    assert not dead.health()


@pytest.mark.gpu
def test_vllm_engine_stop_strings(smol_path) -> None:
    from training.generation.vllm_offline import VLLMGenerator

    gen = VLLMGenerator.from_model(str(smol_path), gpu_memory_utilization=0.3)
    out = gen.generate(["Count: one, two, three, four, five"], SamplingParams(max_tokens=16, stop=[","]))
    assert out[0].text.endswith(",") and out[0].finish_reason == "stop"


def test_length_buckets_limit_padding() -> None:
    from training.generation.hf import length_buckets

    assert length_buckets([10, 100, 12, 110, 11, 400], 16, 1.5) == [[0, 4, 2], [1, 3], [5]]
    assert length_buckets([1, 2, 3, 4, 5], 2, None) == [[0, 1], [2, 3], [4]]


@pytest.mark.slow
def test_transformers_respects_the_context_limit(smol_generator, monkeypatch) -> None:
    from training.generation.hf import TransformersGenerator

    monkeypatch.setattr(TransformersGenerator, "context_limit", property(lambda self: 24))
    long_prompt = "word " * 40
    short = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    n_short = len(smol_generator.tokenizer(short, add_special_tokens=False)["input_ids"])
    full, ok = smol_generator.generate([long_prompt, short], SamplingParams(max_tokens=50))
    assert full.text == "" and full.finish_reason == "length"
    assert len(ok.token_ids) <= 24 - n_short
