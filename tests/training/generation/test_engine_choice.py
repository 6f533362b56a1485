"""``backend: auto`` opens the engine a measurement on this machine found faster for the caller's workload size,
else transformers (``training.generation.choice``)."""

from __future__ import annotations

import json
import logging

import pytest

from training.generation import choice
from training.generation.config import GeneratorSpec

#: session 19's measurement (docs/results/engines/README.md): vLLM starts 23 s later, then runs 1.23x faster
COSTS = {"transformers": {"load_s": 4.3, "per_item_s": 0.798}, "vllm": {"load_s": 27.6, "per_item_s": 0.651}}


def test_default_backend_is_auto_and_resolves_to_transformers_without_a_measurement(tmp_path, caplog) -> None:
    spec = GeneratorSpec()
    assert spec.backend == "auto"
    with caplog.at_level(logging.INFO, logger="training.generation.choice"):
        assert choice.pick_backend(600, tmp_path / "engine_choice.json") == "transformers"
    assert "benchmarks/heldout_eval.py" in caplog.text  # names the command that measures
    assert spec.resolved(600).backend == "transformers"  # the session's temporary home holds no measurement
    assert GeneratorSpec(backend="vllm").resolved().backend == "vllm"  # an explicit backend is kept


def test_the_workload_size_picks_between_start_cost_and_speed(tmp_path, monkeypatch) -> None:
    path = tmp_path / "engine_choice.json"
    monkeypatch.setattr(choice, "_vllm_available", lambda: True)
    choice.record_choice(COSTS, 210, note="test", path=path)
    assert choice.pick_backend(600, path) == "vllm"  # 418 s against 483 s
    assert choice.pick_backend(20, path) == "transformers"  # a demo's few questions: the start dominates
    assert choice.pick_backend(None, path) == "transformers"  # no size given: the documented default
    data = json.loads(path.read_text())
    assert list(data) == [choice.machine_key()] and data[choice.machine_key()]["items"] == 210
    monkeypatch.setattr(choice, "machine_key", lambda: "another machine")
    assert choice.pick_backend(600, path) == "transformers"  # measured elsewhere: not this machine's answer
    choice.record_choice(COSTS, 210, path=path)
    assert len(json.loads(path.read_text())) == 2  # other machines' entries are kept


def test_recorded_vllm_without_its_environment_falls_back(tmp_path, monkeypatch) -> None:
    path = tmp_path / "engine_choice.json"
    choice.record_choice(COSTS, 210, path=path)
    monkeypatch.setattr(choice, "_vllm_available", lambda: False)
    assert choice.pick_backend(600, path) == "transformers"


def test_bad_records_are_refused_or_ignored(tmp_path) -> None:
    with pytest.raises(ValueError, match="costs must name engines"):
        choice.record_choice({"openai": {"load_s": 1.0, "per_item_s": 1.0}}, 10, path=tmp_path / "c.json")
    with pytest.raises(ValueError, match="non-negative load_s and per_item_s"):
        choice.record_choice({"vllm": {"load_s": 1.0}}, 10, path=tmp_path / "c.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert choice.pick_backend(600, broken) == "transformers"


def test_engine_settings_of_an_auto_spec_are_those_of_the_engine_it_opens() -> None:
    spec = GeneratorSpec(batch_size=8, dtype="float32")
    assert spec.engine_kwargs() == GeneratorSpec(backend="transformers", batch_size=8, dtype="float32").engine_kwargs()


def test_a_hand_edited_record_with_bad_costs_is_skipped(tmp_path, monkeypatch) -> None:
    path = tmp_path / "engine_choice.json"
    choice.record_choice(COSTS, 210, path=path)
    data = json.loads(path.read_text())
    data[choice.machine_key()]["costs"]["vllm"] = {"load_s": "fast"}
    path.write_text(json.dumps(data))
    monkeypatch.setattr(choice, "_vllm_available", lambda: True)
    assert choice.pick_backend(600, path) == "transformers"  # no KeyError: the bad entry is not a candidate
