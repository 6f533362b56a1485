"""One generator spec: the backend spelled one way, checked at load time, the same settings in every config."""

from __future__ import annotations

import pytest

from infra.config import load_config
from infra.errors import ConfigError
from training.generation.base import GENERATORS
from training.generation.spec import GeneratorSpec


def test_backends_are_the_generator_table() -> None:
    assert set(GeneratorSpec.model_fields["backend"].annotation.__args__) == set(GENERATORS) | {"vllm_served", "auto"}


def test_openai_needs_a_url_and_unknown_backends_list_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="backend=openai needs base_url"):
        GeneratorSpec(backend="openai")
    with pytest.raises(ValueError, match="'transformers', 'vllm', 'openai' or 'vllm_served'"):
        GeneratorSpec(backend="hf")


def test_engine_kwargs_per_backend() -> None:
    assert GeneratorSpec(batch_size=8, dtype="float32").engine_kwargs() == {
        "batch_size": 8, "device": "auto", "threads": None, "dtype": "float32"}
    assert GeneratorSpec(backend="vllm").engine_kwargs() == {}
    assert GeneratorSpec(backend="vllm", dtype="bfloat16").engine_kwargs() == {"dtype": "bfloat16"}


def test_same_spec_in_eval_em_and_rl_presets() -> None:
    from flows.evaluate import EvaluateConfig
    from training.em.config import EMLoopConfig
    from training.rl.config import RLConfig

    ev = load_config(EvaluateConfig, "eval_mini", ["agent.generator.backend=vllm"])
    em = load_config(EMLoopConfig, "exsearch_cpu_demo", ["sampling.generator.backend=vllm",
                                                         "evaluation.generator.dtype=float32"])
    rl = load_config(RLConfig, "research_grpo_cpu_demo", ["eval.generator.batch_size=4"])
    assert ev.agent.generator.backend == em.sampling.generator.backend == "vllm"
    assert em.evaluation.generator.dtype == "float32" and rl.eval.generator.batch_size == 4
    with pytest.raises(ConfigError, match="sampling.generator.backend"):
        load_config(EMLoopConfig, "exsearch_cpu_demo", ["sampling.generator.backend=transformer"])


def test_prefix_cache_bound_reaches_the_engine_and_unset_leaves_dumps_as_before(smol_path) -> None:
    spec = GeneratorSpec(backend="transformers", prefix_cache_tokens=16_384, device="cpu", dtype="float32")
    assert spec.engine_kwargs()["prefix_cache_tokens"] == 16_384
    assert "prefix_cache_tokens" not in GeneratorSpec().model_dump()  # run-folder keys that embed a spec unchanged
    assert GeneratorSpec.model_validate(spec.model_dump()) == spec
    from training.generation.hf import TransformersGenerator

    gen = TransformersGenerator.from_model(str(smol_path), **spec.engine_kwargs())
    assert gen.prefix_cache.max_tokens == 16_384
