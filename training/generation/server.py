"""An OpenAI-compatible generation server over any ``Generator``: ``searchloop serve generator``.

What vLLM's or SGLang's ``serve`` is on a GPU worker, this is for the transformers backend on any machine: one
process holds the model, many clients (evaluation workers, the LLM judge, ``OpenAICompatibleGenerator`` rollouts)
share it over HTTP. Endpoints:

- ``POST /v1/completions``: ``prompt`` (string or list), ``max_tokens``, ``temperature``, ``top_p``, ``n``,
  ``seed``, ``stop``, ``logprobs`` (per-token log-probabilities of the sampled tokens); the vLLM extensions
  ``include_stop_str_in_output`` and ``return_token_ids``; each choice carries ``finish_reason`` (``stop`` /
  ``length``) and vLLM's ``stop_reason`` (the matched stop string, None for EOS).
- ``POST /v1/chat/completions``: ``messages`` rendered with the model's chat template (generation prompt added).
- ``GET /v1/models``, ``GET /health`` (liveness and saturation: requests, rows and tokens still to generate).

Requests are checked in full before they are queued (:mod:`training.generation.server_wire`; prompts longer than
the model's context too), then scheduled fairly in chunks (:mod:`training.generation.scheduler`); a request whose
client disconnects stops at the next chunk. Each request may ask for at most ``max_request_tokens`` new tokens in
all (prompts x n x max_tokens). Errors use OpenAI's shape ``{"error": {"message", "type", "code"}}``: 400 for
invalid bodies, 401 for a missing/wrong bearer token (checked before the body is read), 404 for an unknown model
name or path, 405, 408 for a body that does not arrive in time, 413 for oversize bodies, 503 when the generator
fails on a request (only that request) or too many are in flight. Binds 127.0.0.1 by default. Model output is
returned as text, never executed.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import Field, SecretStr
from starlette.exceptions import HTTPException as StarletteHTTPException

from infra.config import StrictModel
from infra.http import GuardMiddleware, warn_if_exposed
from training.generation.base import Completion, Generator, SamplingParams
from training.generation.scheduler import GenerationFailed, GenerationScheduler, Job
from training.generation.server_wire import ApiError, ChatRequest, CompletionRequest, _Sampling, choice, error

log = logging.getLogger(__name__)


class GenerationServerConfig(StrictModel):
    """Generation server settings."""

    host: str = Field(default="127.0.0.1", description="Bind address; keep loopback unless a token is set.")
    port: int = Field(default=8001, ge=0, le=65535, description="TCP port.")
    served_name: str = Field(default="smollm2", description="Model name clients send (``model`` field).")
    token: SecretStr | None = Field(default=None, description="Bearer token required on /v1 endpoints if set.")
    max_tokens_cap: int = Field(default=4096, ge=1, description="Largest max_tokens a request may ask for.")
    max_prompts: int = Field(default=256, ge=1, description="Most prompts x n in one request.")
    max_request_tokens: int = Field(
        default=32_768, ge=1, description="Most new tokens one request may ask for in all (prompts x n x max_tokens).")
    max_body_bytes: int = Field(default=8_000_000, ge=1024, description="Largest request body.")
    max_wait_ms: float = Field(default=5.0, ge=0, description="Wait after the first request for others to batch.")
    max_batch_rows: int = Field(default=64, ge=1, description="Rows (prompts x n) per generate call.")
    chunk_tokens: int = Field(
        default=64, ge=1, description="New tokens per row per generate call; longer completions continue in later "
        "calls, round-robin with the other requests (a short request waits at most one chunk).")
    body_timeout_s: float = Field(default=10.0, gt=0, description="Seconds to receive a whole body (408 after).")
    max_in_flight: int = Field(
        default=128, ge=1, description="Requests handled or queued at once (503 + Retry-After above).")
    max_buffered_bytes: int = Field(
        default=256 * 2**20, ge=1024, description="Body bytes all requests in flight may hold together (503 + "
        "Retry-After beyond): stalled or slow uploads cannot grow memory past it.")
    max_connections: int = Field(default=1024, ge=1, description="Open connections (uvicorn limit_concurrency).")


_ids = itertools.count(1)


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), 200, media_type="application/json")


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(request: Request, work: Callable[[Callable[[Job], None]], Awaitable[list[Completion]]]
                       ) -> list[Completion] | None:
    """Run ``work``; cancel its job and return None if the client disconnects first."""
    jobs: list[Job] = []
    task = asyncio.ensure_future(work(jobs.append))
    watch = asyncio.ensure_future(_until_disconnect(request))
    done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        watch.cancel()
        return task.result()
    for job in jobs:
        job.cancel()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        parts = [f"{'.'.join(str(x) for x in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in exc.errors()]
        return error(400, f"invalid request ({'; '.join(parts[:5])})")

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> Response:
        return error(exc.status, exc.message, exc.kind)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        hint = {404: "; the endpoints are /v1/completions, /v1/chat/completions, /v1/models and /health",
                405: "; see the allowed methods in the Allow header"}.get(exc.status_code, "")
        return error(exc.status_code, f"{exc.detail}{hint}", headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> Response:
        log.error("unhandled generation server error", exc_info=exc)
        return error(500, f"internal server error ({type(exc).__name__}); this is a bug, please report it")


def create_generation_app(generator: Generator, config: GenerationServerConfig | None = None) -> FastAPI:
    """The FastAPI app serving ``generator`` (start with :func:`serve_generator` or an ASGI server)."""
    config = config or GenerationServerConfig()
    scheduler = GenerationScheduler(generator, config.max_wait_ms / 1000, config.max_batch_rows, config.chunk_tokens)
    expected = config.token.get_secret_value().encode() if config.token else None
    # the request checks count tokens on the event loop while the generator's thread encodes batches: a fast
    # tokenizer's encode mutates its padding state, so sharing one raised "Already borrowed" (a 503 for a valid
    # request). The checks get their own copy.
    tokenizer = copy.deepcopy(getattr(generator, "tokenizer", None))
    context = getattr(generator, "context_limit", None)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await scheduler.start()
        try:
            yield
        finally:
            await scheduler.close()

    app = FastAPI(title="searchloop generator", version="1.0", lifespan=lifespan,
                  description="OpenAI-compatible completions over a local model. Errors: {error: {message, type}}.")
    app.state.scheduler = app.state.batcher = scheduler
    _install_errors(app)
    app.add_middleware(
        GuardMiddleware, error=lambda status, message, headers: error(status, message, headers=headers),
        max_bytes=config.max_body_bytes, body_timeout_s=config.body_timeout_s, token=expected,
        protected=lambda path: path.startswith("/v1/"), max_in_flight=config.max_in_flight,
        max_buffered_bytes=config.max_buffered_bytes,
    )  # outermost: token from the headers, then the body under its limit and deadline

    def check(req: _Sampling, prompts: list[str], names: list[str]) -> int:
        """Every limit of one request; returns its prompt token count."""
        if req.model != config.served_name:
            raise ApiError(404, f"model {req.model!r} is not served here; use {config.served_name!r}")
        if req.max_tokens > config.max_tokens_cap:
            raise ApiError(400, f"max_tokens={req.max_tokens} exceeds this server's cap of {config.max_tokens_cap}")
        rows = len(prompts) * req.n
        if rows > config.max_prompts:
            raise ApiError(400, f"{rows} prompts x n exceed this server's cap of {config.max_prompts}")
        if rows * req.max_tokens > config.max_request_tokens:
            raise ApiError(400, f"{rows} prompts x n x max_tokens={req.max_tokens} = {rows * req.max_tokens} new "
                                f"tokens exceed this server's per-request cap of {config.max_request_tokens}; lower "
                                "max_tokens or n, or split the prompts over several requests")
        if tokenizer is None:
            return 0
        total = 0
        for name, p in zip(names, prompts, strict=True):
            n = len(tokenizer(p, add_special_tokens=False)["input_ids"])
            if n == 0:
                raise ApiError(400, f"{name} encodes to no tokens; send text to continue")
            if context and n >= context:
                raise ApiError(400, f"{name} has {n} tokens but the model's context is {context} tokens "
                                    f"(prompt + max_tokens); shorten it")
            total += n
        return total

    def sampling(req: _Sampling, logprobs: bool) -> SamplingParams:
        return SamplingParams(temperature=req.temperature, top_p=req.top_p, n=req.n, seed=req.seed,
                              max_tokens=req.max_tokens, stop=req.stops(), logprobs=logprobs)

    async def generate(request: Request, prompts: list[str], req: _Sampling, logprobs: bool) -> list[Completion]:
        params = sampling(req, logprobs)
        try:
            comps = await _unless_gone(request, lambda on_job: scheduler.submit(prompts, req.max_tokens, params,
                                                                                on_job))
        except GenerationFailed as exc:
            raise ApiError(503, f"generation failed for this request ({exc}); retry, and check the server log if "
                                "it persists") from exc
        if comps is None:
            raise ApiError(499, "client disconnected")
        return comps

    def usage(prompt_tokens: int, comps: list[Completion]) -> dict[str, int]:
        c = sum(len(x.token_ids) for x in comps)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": c, "total_tokens": prompt_tokens + c}

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Response:
        """OpenAI text completions (vLLM extensions: include_stop_str_in_output, return_token_ids)."""
        prompts = req.prompts()
        names = ["prompt"] if isinstance(req.prompt, str) else [f"prompt[{i}]" for i in range(len(prompts))]
        prompt_tokens = check(req, prompts, names)
        want_lp = req.logprobs is not None
        comps = await generate(request, prompts, req, want_lp)
        return _json({"id": f"cmpl-{next(_ids)}", "object": "text_completion", "created": int(time.time()),
                      "model": config.served_name, "usage": usage(prompt_tokens, comps),
                      "choices": [choice(c, i, req, False, want_lp) for i, c in enumerate(comps)]})

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> Response:
        """OpenAI chat completions, rendered with the model's chat template."""
        conversation = req.conversation()
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ApiError(400, "this model has no chat template; use /v1/completions with a rendered prompt")
        try:
            prompt = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - templates raise on conversations they do not accept
            raise ApiError(400, f"the model's chat template rejected these messages ({exc}); "
                                "check the roles and their order") from exc
        prompt_tokens = check(req, [prompt], ["the rendered conversation (messages)"])
        comps = await generate(request, [prompt], req, req.logprobs)
        return _json({"id": f"chatcmpl-{next(_ids)}", "object": "chat.completion", "created": int(time.time()),
                      "model": config.served_name, "usage": usage(prompt_tokens, comps),
                      "choices": [choice(c, i, req, True, req.logprobs) for i, c in enumerate(comps)]})

    @app.get("/v1/models")
    async def models() -> Response:
        """The one served model."""
        return _json({"object": "list",
                      "data": [{"id": config.served_name, "object": "model", "owned_by": "searchloop"}]})

    @app.get("/health")
    async def health() -> Response:
        """Liveness and saturation: requests queued or running, their rows and tokens still to generate."""
        load = scheduler.saturation()
        return _json({"status": "healthy", "model": config.served_name, "auth": expected is not None,
                      "context_tokens": context, "saturation": load,
                      "limits": {"max_request_tokens": config.max_request_tokens, "chunk_tokens": config.chunk_tokens,
                                 "max_batch_rows": config.max_batch_rows, "max_in_flight": config.max_in_flight},
                      "stats": {"generate_calls": scheduler.calls, "requests_done": scheduler.jobs_done}})

    return app


def serve_generator(generator: Generator, config: GenerationServerConfig) -> None:
    """Run the generation server in the foreground until interrupted."""
    import uvicorn

    warn_if_exposed(config.host, config.token, "generate", log)
    uvicorn.run(create_generation_app(generator, config), host=config.host, port=config.port,
                log_level="warning", access_log=False, timeout_keep_alive=30,
                limit_concurrency=config.max_connections)
