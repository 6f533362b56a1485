"""LLM judge against a real local HTTP server (FastAPI + uvicorn on 127.0.0.1) speaking chat completions.

The server is a fake *judge model* (it decides by looking for the gold in the predicted-answer line), but the
HTTP path, retries, auth header and parsing are the real ones.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from evaluation.judge import (
    SKIP_MESSAGE,
    JudgeConfig,
    JudgeItem,
    build_prompt,
    judge_answers,
    judge_config_from_env,
    parse_verdict,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def judge_server() -> Iterator[dict]:
    state: dict = {"requests": [], "fail_next": 0}
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        state["requests"].append({"body": body, "auth": request.headers.get("authorization")})
        if state["fail_next"] > 0:
            state["fail_next"] -= 1
            return JSONResponse({"error": "busy"}, status_code=503)
        prompt = body["messages"][-1]["content"]
        pred = re.search(r"predicted answer: (.*)", prompt, re.IGNORECASE).group(1).strip().lower()
        golds = re.search(r"(?:ground-truth answers|golden answer): (.*)", prompt, re.IGNORECASE).group(1).lower()
        ok = bool(pred) and pred in golds
        if "json" in prompt.lower():
            verdict = '{"rationale": "compared", "judgement": "%s"}' % ("correct" if ok else "incorrect")
            content = f"```json\n{verdict}\n```"
        else:
            content = "True" if ok else "False, it does not match."
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        return {"id": "x", "object": "chat.completion", "model": body["model"], "choices": [choice]}

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "judge test server did not start"
    state["base_url"] = f"http://127.0.0.1:{port}/v1"
    yield state
    server.should_exit = True
    thread.join(timeout=10)


ITEMS = [
    JudgeItem(question="Capital of France?", golden_answers=["Paris"], prediction="Paris"),
    JudgeItem(question="Capital of Italy?", golden_answers=["Rome", "Roma"], prediction="Milan"),
    JudgeItem(question="Largest ocean?", golden_answers=["Pacific Ocean"], prediction="pacific"),
]


@pytest.mark.slow
@pytest.mark.parametrize("prompt", ["research", "r1searcher"])
def test_judge_against_live_server(judge_server: dict, prompt: str) -> None:
    cfg = JudgeConfig(base_url=judge_server["base_url"], model="judge-mini", api_key="k", prompt=prompt)
    result = judge_answers(ITEMS, cfg)
    assert not result.skipped
    assert [v.correct for v in result.verdicts] == [True, False, True]
    assert result.scores == [1.0, 0.0, 1.0]
    assert result.accuracy == pytest.approx(2 / 3)
    last = judge_server["requests"][-1]
    assert last["auth"] == "Bearer k" and last["body"]["temperature"] == 0.0 and last["body"]["model"] == "judge-mini"
    assert ("response_format" in last["body"]) is (prompt == "research")


@pytest.mark.slow
def test_judge_retries_server_errors(judge_server: dict) -> None:
    judge_server["fail_next"] = 2
    cfg = JudgeConfig(base_url=judge_server["base_url"], model="m", concurrency=1)
    result = judge_answers(ITEMS[:1], cfg)
    assert result.verdicts[0].correct is True  # two 503s, then an answer


@pytest.mark.slow
def test_judge_unreachable_endpoint_gives_no_verdict() -> None:
    cfg = JudgeConfig(base_url=f"http://127.0.0.1:{_free_port()}/v1", model="m", max_retries=1, timeout_s=2)
    result = judge_answers(ITEMS[:1], cfg)
    assert result.verdicts[0].correct is None and "ConnectError" in (result.verdicts[0].error or "")
    assert result.accuracy == 0.0


def test_judge_skipped_without_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEARCHLOOP_JUDGE_BASE_URL", raising=False)
    monkeypatch.delenv("SEARCHLOOP_JUDGE_MODEL", raising=False)
    assert judge_config_from_env() is None
    result = judge_answers(ITEMS)
    assert result.skipped and result.message == SKIP_MESSAGE and result.accuracy is None
    assert "SEARCHLOOP_JUDGE_BASE_URL" in SKIP_MESSAGE
    monkeypatch.setenv("SEARCHLOOP_JUDGE_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("SEARCHLOOP_JUDGE_MODEL", "m")
    assert judge_config_from_env("r1searcher").prompt == "r1searcher"


def test_prompts_and_parsing() -> None:
    text = build_prompt(ITEMS[1], "research")
    assert '["Rome", "Roma"]' in text and "Milan" in text and "judgement" in text
    assert "Golden Answer: Rome; Roma" in build_prompt(ITEMS[1], "r1searcher")
    assert parse_verdict('{"rationale": "r", "judgement": "Correct"}', "research") is True
    assert parse_verdict('noise {"judgement": "incorrect"} noise', "research") is False
    assert parse_verdict('{"judgement": "maybe"}', "research") is None
    assert parse_verdict("not json", "research") is None
    assert parse_verdict("The answer is False.", "r1searcher") is False
    assert parse_verdict("I cannot tell", "r1searcher") is None
