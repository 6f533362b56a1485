"""A stage's generator is released afterwards (the vLLM worker holds an engine), and ``vllm_served`` drives
vLLM's server through our OpenAI client for one session (server and load mocked here; the real server is tested
in ``test_vllm_served.py``)."""

from __future__ import annotations

import pytest

from infra.errors import ConfigError
from training.generation import spec as S


class _Gen:
    eos_token = None

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_offline_vllm_generator_is_closed_after_the_session(monkeypatch) -> None:
    made: list[_Gen] = []
    monkeypatch.setattr(S, "_load", lambda spec: made.append(_Gen()) or made[-1])
    with S.generator_session(S.GeneratorSpec(model="/m", backend="vllm")) as gen:
        assert gen is made[0] and not gen.closed
    assert made[0].closed
    with pytest.raises(RuntimeError), S.generator_session(S.GeneratorSpec(model="/m", backend="vllm")):
        raise RuntimeError("sampling failed")
    assert made[1].closed  # released on failure too


def test_served_vllm_backend_starts_and_stops_a_server(monkeypatch) -> None:
    events: list[str] = []

    class FakeServer:
        def __init__(self, model, cfg) -> None:
            self.cfg, self.base_url = cfg, "http://127.0.0.1:9/v1"
            events.append(f"init {model} port={cfg.port}")

        def __enter__(self):
            events.append("start")
            return self

        def __exit__(self, *exc) -> None:
            events.append("stop")

    monkeypatch.setattr("training.generation.vllm_server.VLLMServer", FakeServer)
    monkeypatch.setattr(S, "served_tokenizer", lambda model, tokenizer: None)
    with S.generator_session(S.GeneratorSpec(model="/ckpt", backend="vllm_served")) as gen:
        assert gen.base_url == "http://127.0.0.1:9/v1" and gen.model == "policy"
    assert events == ["init /ckpt port=0", "start", "stop"]
    with pytest.raises(ConfigError, match="starts a server per session"):
        S.open_generator(S.GeneratorSpec(model="/ckpt", backend="vllm_served"))
