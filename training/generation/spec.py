"""One generator reference and one way to open it: :class:`GeneratorSpec` and :func:`open_generator`.

Agent evaluation, EM sampling and evaluation, RL difficulty rollouts and evaluation, and ``searchloop ask`` name
their generation engine with this model; the backend is spelled one way everywhere: ``auto`` (the default: the
engine measured faster on this machine, ``training.generation.choice``), ``transformers`` (in process,
CPU or GPU), ``vllm`` (in process, GPU workers) or ``openai`` (any OpenAI-compatible server:
``searchloop serve generator``, ``vllm serve``). The names are the keys of ``training.generation.base.GENERATORS``;
``vllm_served`` (for :func:`generator_session` only) starts vLLM's own server from ``.venv-vllm`` for the session
and drives it with the ``openai`` backend. ``vllm`` from an environment without vLLM runs the offline engine in
``.venv-vllm`` (``training.generation.vllm_worker``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from training.generation.config import GeneratorSpec

log = logging.getLogger(__name__)


def served_tokenizer(model: str, tokenizer: str | None) -> Any | None:
    """The tokenizer named by ``tokenizer``, else ``model``'s when it resolves to a local model, else None."""
    from training.generation.models import load_tokenizer

    if tokenizer is not None:
        return load_tokenizer(tokenizer)
    try:
        return load_tokenizer(model)
    except Exception as exc:  # noqa: BLE001 - a served name need not exist locally
        log.info("no local tokenizer for served model %r (%s); protocols fall back to plain prompts", model, exc)
        return None


def open_generator(spec: GeneratorSpec, cached: bool = False, items: int | None = None) -> Any:
    """Load the generator named by ``spec``.

    Args:
        spec: backend, model and engine settings.
        cached: keep (up to two) loaded generators per process and return the same one for an equal spec (the
            evaluation flow's per-dataset tasks share one model); loops that train a new checkpoint each
            iteration load fresh.
        items: how many questions the caller will roll out (``backend: auto`` weighs an engine's start against
            its per-question speed: ``training.generation.choice``).
    """
    spec = spec.resolved(items)
    return _cached(spec) if cached else _load(spec)


@contextmanager
def generator_session(spec: GeneratorSpec, items: int | None = None) -> Iterator[Any]:
    """The generator of ``spec`` for one stage, released afterwards: its prefix KV store is emptied, a vLLM worker's
    engine is closed, and ``vllm_served`` starts vLLM's OpenAI-compatible server on a free loopback port for the
    session (our ``openai`` backend drives it; token ids and logprobs come back for masks and best-of-n) and stops it
    at the end. ``items``: the questions the stage rolls out (``backend: auto``, as :func:`open_generator`)."""
    spec = spec.resolved(items)
    if spec.backend == "vllm_served":
        from training.generation.openai_client import OpenAICompatibleGenerator
        from training.generation.vllm_server import VLLMServer, VLLMServerConfig

        cfg = VLLMServerConfig(port=0, served_name="policy", **spec.engine_kwargs())
        with VLLMServer(spec.model, cfg) as server:
            yield OpenAICompatibleGenerator(server.base_url, "policy",
                                            tokenizer=served_tokenizer(spec.model, spec.tokenizer))
        return
    gen = _load(spec)
    try:
        yield gen
    finally:
        reset = getattr(gen, "reset_prefix_cache", None)  # our engine's prefix KV store (~1.5 GB at most in bf16)
        if reset is not None:
            reset()
        close = getattr(gen, "close", None)  # the vLLM worker holds an engine (weights + KV cache)
        if close is not None:
            close()


def _load(spec: GeneratorSpec) -> Any:
    from training.generation.base import load_generator

    spec = spec.resolved()
    if spec.backend == "vllm_served":
        from infra.errors import ConfigError

        raise ConfigError("backend vllm_served starts a server per session: use it where a stage opens the "
                          "generator (EM sampling/evaluation), or run `searchloop serve generator --engine vllm` "
                          "and use backend=openai")

    return load_generator(spec.backend, spec.model, **spec.engine_kwargs())


@lru_cache(maxsize=2)
def _cached(spec: GeneratorSpec) -> Any:
    return _load(spec)
