"""``backend: auto`` opens the engine a measurement on this machine recorded, else transformers
(``training.generation.choice``)."""

from __future__ import annotations

import json
import logging

import pytest

from training.generation import choice
from training.generation.config import GeneratorSpec


def test_default_backend_is_auto_and_resolves_to_transformers_without_a_measurement(tmp_path, caplog) -> None:
    spec = GeneratorSpec()
    assert spec.backend == "auto"
    with caplog.at_level(logging.INFO, logger="training.generation.choice"):
        assert choice.pick_backend(tmp_path / "engine_choice.json") == "transformers"
    assert "benchmarks/heldout_eval.py" in caplog.text  # names the command that measures
    assert spec.resolved().backend == "transformers"  # the session's temporary home holds no measurement
    assert GeneratorSpec(backend="vllm").resolved().backend == "vllm"  # an explicit backend is kept


def test_a_recorded_measurement_is_what_auto_opens_on_that_machine_only(tmp_path, monkeypatch) -> None:
    path = tmp_path / "engine_choice.json"
    monkeypatch.setattr(choice, "_vllm_available", lambda: True)
    choice.record_choice("vllm", {"transformers": 20.0, "vllm": 10.0}, note="test", path=path)
    assert choice.pick_backend(path) == "vllm"
    data = json.loads(path.read_text())
    assert list(data) == [choice.machine_key()] and data[choice.machine_key()]["seconds"]["vllm"] == 10.0
    monkeypatch.setattr(choice, "machine_key", lambda: "another machine")
    assert choice.pick_backend(path) == "transformers"  # measured elsewhere: not this machine's answer
    choice.record_choice("transformers", {"transformers": 5.0, "vllm": 9.0}, path=path)
    assert len(json.loads(path.read_text())) == 2  # other machines' entries are kept


def test_recorded_vllm_without_its_environment_falls_back(tmp_path, monkeypatch) -> None:
    path = tmp_path / "engine_choice.json"
    choice.record_choice("vllm", {"transformers": 20.0, "vllm": 10.0}, path=path)
    monkeypatch.setattr(choice, "_vllm_available", lambda: False)
    assert choice.pick_backend(path) == "transformers"


def test_bad_records_are_refused_or_ignored(tmp_path) -> None:
    with pytest.raises(ValueError, match="winner must be one of"):
        choice.record_choice("openai", {}, path=tmp_path / "c.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert choice.pick_backend(broken) == "transformers"


def test_engine_settings_of_an_auto_spec_are_those_of_the_engine_it_opens() -> None:
    spec = GeneratorSpec(batch_size=8, dtype="float32")
    assert spec.engine_kwargs() == GeneratorSpec(backend="transformers", batch_size=8, dtype="float32").engine_kwargs()
