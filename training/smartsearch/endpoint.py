"""The judge/refiner endpoint: a batched OpenAI-compatible client (httpx timeouts, tenacity retries) and our own
generation server started as a background service when the preset names a model instead of a URL.

``EndpointClient.complete(prompts)`` sends one request per prompt (``concurrency`` in flight) in ``chat`` mode
(``POST /chat/completions`` with one user message: the server renders it with *its own* chat template, the request
names *its* model, discovered from ``GET /models`` when the preset names none, and carries
``chat_template_kwargs.enable_thinking`` when the preset sets it: the seed's judge and refiner run Qwen3 in
non-thinking mode) or ``completions`` mode (the prompt rendered with the judge model's chat template plus a
response prefix, so a small judge starts right at the verdict; the default only for our own served model).
A reasoning block (``<think>...</think>``) at the start of a reply is removed before parsing. A request that still
fails after the retries becomes a :class:`Reply` with ``error`` set: callers count it as a failed call, it never
raises mid-batch. The bearer token is read from the environment variable the preset names and never stored.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from infra.config import StrictModel
from training.smartsearch.config import EndpointSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    """One answer of the endpoint: ``text`` (empty on failure) and ``error`` (None on success)."""

    text: str
    error: str | None = None


_REASONING = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


def strip_reasoning(text: str) -> str:
    """The reply without a leading ``<think>...</think>`` block (a thinking model's reasoning, or the empty block a
    non-thinking Qwen3 reply may echo); other text unchanged."""
    return _REASONING.sub("", text, count=1)


class _Retryable(Exception):
    """A 429/5xx answer (retried)."""


class EndpointClient:
    """Batched client of an OpenAI-compatible server for single-turn prompts.

    Args:
        spec: endpoint settings (URL, model, mode, timeouts, retries, concurrency).
        base_url: the URL to use (a started server's URL when ``spec.base_url`` is None).
        tokenizer: chat-template tokenizer for ``completions`` mode (loaded from ``spec.tokenizer`` when None).
        transport: httpx transport (tests).
    """

    def __init__(self, spec: EndpointSpec, base_url: str | None = None, tokenizer: Any | None = None,
                 transport: Any | None = None) -> None:
        import httpx

        url = base_url or spec.base_url
        if not url:
            raise ValueError("no endpoint URL: set endpoint.base_url or start the server (endpoint.serve_model)")
        self.spec, self.base_url = spec, url.rstrip("/")
        key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(timeout=httpx.Timeout(spec.timeout_s), headers=headers, transport=transport)
        self.mode = spec.resolved_mode()
        self.tokenizer = tokenizer
        if self.mode == "completions" and tokenizer is None:
            from training.generation.models import load_tokenizer

            name = spec.tokenizer or spec.serve_model or spec.model
            if not name:
                raise ValueError("endpoint.mode=completions renders the chat template locally: set endpoint.tokenizer "
                                 "(or endpoint.model) to the judge model's tokenizer, or use endpoint.mode=chat")
            self.tokenizer = load_tokenizer(name)
        self._model: str | None = spec.served_name() if spec.served else spec.model
        self._model_lock = threading.Lock()
        self.calls = 0
        self.failures = 0

    @property
    def model(self) -> str:
        """The ``model`` request field: the preset's name, else the first id of the server's ``GET /models``."""
        with self._model_lock:
            if self._model is None:
                r = self.client.get(f"{self.base_url}/models")
                if r.status_code != 200:
                    raise ValueError(f"GET {self.base_url}/models answered HTTP {r.status_code}; set endpoint.model "
                                     "to the name the server serves")
                ids = [m.get("id") for m in r.json().get("data", []) if m.get("id")]
                if not ids:
                    raise ValueError(f"{self.base_url}/models lists no model; set endpoint.model")
                self._model = str(ids[0])
            return self._model

    def render(self, user: str, response_prefix: str = "") -> str:
        """The completions-mode prompt: the user message through the chat template, then the response prefix."""
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            return f"{user}\n\n{response_prefix}"
        extra = {} if self.spec.enable_thinking is None else {"enable_thinking": self.spec.enable_thinking}
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                                  add_generation_prompt=True, **extra)
        return text + response_prefix

    def body(self, user: str, response_prefix: str, temperature: float, max_tokens: int,
             stop: list[str] | None = None) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) of one request in the endpoint's mode (``max_tokens`` after the served-model cap)."""
        body: dict[str, Any] = {"model": self.model, "temperature": temperature,
                                "max_tokens": self.spec.reply_budget(max_tokens)}
        if stop:
            body["stop"] = list(stop)
        if self.mode == "chat":
            body["messages"] = [{"role": "user", "content": user}]
            if self.spec.enable_thinking is not None:
                body["chat_template_kwargs"] = {"enable_thinking": self.spec.enable_thinking}
            return "/chat/completions", body
        body["prompt"] = self.render(user, response_prefix)
        return "/completions", body

    def _request(self, user: str, response_prefix: str, temperature: float, max_tokens: int,
                 stop: list[str] | None = None) -> str:
        import httpx
        from tenacity import (
            retry,
            retry_if_exception_type,
            retry_if_not_exception_type,
            stop_after_attempt,
            wait_exponential,
        )

        path, body = self.body(user, response_prefix, temperature, max_tokens, stop)

        # connection errors, 429 and 5xx are retried; a read timeout is not (the server is still working on it, and
        # a resend would only queue the same work again): it is a failed call
        retryable = retry_if_exception_type((httpx.TransportError, _Retryable)) & retry_if_not_exception_type(
            httpx.ReadTimeout)

        @retry(stop=stop_after_attempt(self.spec.retries), wait=wait_exponential(multiplier=0.5, max=8),
               retry=retryable, reraise=True)
        def post() -> str:
            r = self.client.post(f"{self.base_url}{path}", json=body)
            if r.status_code == 429 or r.status_code >= 500:
                raise _Retryable(f"HTTP {r.status_code}: {r.text[:200]}")
            if r.status_code != 200:
                raise ValueError(f"HTTP {r.status_code}: {r.text[:200]}")
            choice = r.json()["choices"][0]
            text = choice.get("text") if self.mode == "completions" else choice["message"]["content"]
            return strip_reasoning(text or "")

        return post()

    def complete(self, prompts: list[str], response_prefix: str = "", temperature: float = 0.0,
                 max_tokens: int = 256, stop: list[str] | None = None) -> list[Reply]:
        """One reply per prompt, in order; failures become replies with ``error`` set (and are counted)."""

        def one(user: str) -> Reply:
            try:
                return Reply(self._request(user, response_prefix, temperature, max_tokens, stop))
            except Exception as exc:  # noqa: BLE001 - every failure is reported as a failed call, never raised
                return Reply("", f"{type(exc).__name__}: {exc}"[:300])

        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.spec.concurrency, len(prompts))) as pool:
            replies = list(pool.map(one, prompts))
        self.calls += len(replies)
        self.failures += sum(r.error is not None for r in replies)
        return replies


class ServedEndpoint(StrictModel):
    """Our generation server started for the judge/refiner."""

    url: str = Field(description="Base URL ending in /v1.")
    run_dir: str = Field(description="Directory holding the pid and log files.")
    name: str = Field(description="Service name.")
    log: str = Field(description="Server log file.")


def start_endpoint(spec: EndpointSpec, run_dir: str, name: str = "smartsearch-judge") -> ServedEndpoint:
    """Start ``searchloop serve generator`` over ``spec.serve_model`` on a free loopback port; wait for /health."""
    from infra.proc import ServiceSpec, ensure_started, free_port

    if not spec.serve_model:
        raise ValueError("endpoint.serve_model is not set; nothing to start (endpoint.base_url is used as is)")
    port = free_port()
    argv = [sys.executable, "-m", "flows.cli", "serve", "generator", "--model", spec.serve_model, "--host",
            "127.0.0.1", "--port", str(port), "--served-name", spec.served_name()]
    service = ServiceSpec(name=name, argv=argv, health_url=f"http://127.0.0.1:{port}/health",
                          cwd=str(Path(__file__).resolve().parents[2]))
    info = ensure_started(service, run_dir, timeout=spec.startup_timeout_s)
    url = (info.health_url or "").removesuffix("/health")
    return ServedEndpoint(url=f"{url}/v1", run_dir=run_dir, name=name, log=info.log)


def stop_endpoint(served: ServedEndpoint) -> bool:
    """Stop a server started by :func:`start_endpoint`; True when it was running."""
    from infra.proc import stop_service

    return stop_service(served.run_dir, served.name)
