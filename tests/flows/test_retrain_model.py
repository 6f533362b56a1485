"""Scheduled retraining's model step (``flows.retrain._model_hook``) with a fake trainer and a fake registry: the
default deployment trains (rl-finetune on the cheap preset), starts from ``@champion`` once there is one, and moves
``@champion`` only when the held-out paired interval of ``promote_on`` lies above 0."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flows import retrain as rt
from flows.retrain import RetrainConfig
from flows.retrain import _trainer_root as real_trainer_root  # the autouse fixture below replaces rt's


class FakeTrainer:
    """Stands in for the rl-finetune flow: records its overrides, returns a registered version and a report."""

    def __init__(self, improved: bool, version: str) -> None:
        self.improved, self.version, self.calls = improved, version, []

    def __call__(self, overrides: list[str], preset: str | None = None) -> SimpleNamespace:
        self.calls.append({"overrides": list(overrides), "preset": preset})
        return SimpleNamespace(
            registered=SimpleNamespace(name="searchloop-searchr1_learn_demo", version=self.version),
            learning=SimpleNamespace(improved={"reward": self.improved, "f1": False}, n=24))


@pytest.fixture(autouse=True)
def fresh_run_dirs(monkeypatch, tmp_path):
    """Each trainer call gets a run directory of its own (the real one is keyed by the trainer's config)."""
    roots = iter(range(1000))
    monkeypatch.setattr(rt, "_trainer_root", lambda preset, overrides: str(tmp_path / f"run{next(roots)}"))


@pytest.fixture
def registry(monkeypatch):
    aliases: dict[tuple[str, str], str] = {}
    monkeypatch.setattr("infra.tracking.get_alias", lambda name, alias: (
        SimpleNamespace(version=aliases[(name, alias)]) if (name, alias) in aliases else None))
    monkeypatch.setattr("infra.tracking.set_alias",
                        lambda name, alias, version: aliases.__setitem__((name, alias), version))
    return aliases


def test_default_config_retrains_on_the_cheap_preset() -> None:
    cfg = RetrainConfig()
    assert cfg.trainer == "rl-finetune" and cfg.preset == "searchr1_learn_demo" and cfg.promote_on == "reward"


def test_promotes_only_when_the_paired_interval_says_better(monkeypatch, registry) -> None:
    cfg = RetrainConfig(corpus="data/corpus/mini.jsonl")
    first = FakeTrainer(improved=True, version="1")
    monkeypatch.setattr(rt, "load_object", lambda ref: first)
    note = rt._model_hook(cfg)
    assert "v1 promoted to @champion" in note and "the preset's start model" in note
    call = first.calls[0]
    assert call["preset"] == "searchr1_learn_demo" and "eval.compare_start=true" in call["overrides"]
    assert not [o for o in call["overrides"] if o.startswith("model=")]  # no champion yet: the preset's model
    assert registry[("searchloop-searchr1_learn_demo", "champion")] == "1"

    second = FakeTrainer(improved=False, version="2")
    monkeypatch.setattr(rt, "load_object", lambda ref: second)
    note = rt._model_hook(cfg)
    overrides = second.calls[0]["overrides"]
    assert "model=models:/searchloop-searchr1_learn_demo/1" in overrides and "init.warmup=null" in overrides
    assert "v2 registered, not promoted" in note and "vs champion v1" in note
    assert registry[("searchloop-searchr1_learn_demo", "champion")] == "1"  # refused: the champion stays

    third = FakeTrainer(improved=True, version="3")
    monkeypatch.setattr(rt, "load_object", lambda ref: third)
    assert "v3 promoted" in rt._model_hook(cfg)
    assert registry[("searchloop-searchr1_learn_demo", "champion")] == "3"


def test_promote_on_is_checked_when_the_config_loads() -> None:
    from infra.config import build_config
    from infra.errors import ConfigError

    with pytest.raises(ConfigError, match="promote_on"):
        build_config(RetrainConfig, {"promote_on": "rewrd"})


def test_the_note_carries_the_paired_interval_and_the_training_run(monkeypatch, registry, tmp_path) -> None:
    """The record says why: the difference and its interval from the comparison's summary.json."""
    import json

    (tmp_path / "summary.json").write_text(json.dumps({"confidence": 0.95, "paired": {
        "reward": {"diff": 0.05, "low": -0.0042, "high": 0.1292}, "f1": {"diff": 0.0, "low": 0.0, "high": 0.0}}}))
    trainer = FakeTrainer(improved=False, version="1")
    real_call = trainer.__call__

    def with_dir(overrides: list[str], preset: str | None = None) -> SimpleNamespace:
        out = real_call(overrides, preset)
        out.learning.dir, out.run_id = str(tmp_path), "abc123"
        return out

    monkeypatch.setattr(rt, "load_object", lambda ref: with_dir)
    note = rt._model_hook(RetrainConfig(corpus="data/corpus/mini.jsonl"))
    assert "not promoted" in note and "(new - old +0.0500, 95% CI [-0.0042, +0.1292])" in note
    assert note.endswith("training MLflow run abc123")  # the retrain record links the trainer's run tree


def test_a_finished_run_with_the_same_inputs_is_not_registered_again(monkeypatch, registry, tmp_path) -> None:
    """The second scheduled run of a day found the first one's run directory (same preset, start model and
    questions): rl-finetune resumed it and registered the same checkpoint as v2. Now it says so and trains nothing;
    the start model is the champion's version, so a moved champion gets a run directory of its own."""
    import json

    root = tmp_path / "same"
    (root / "grpo").mkdir(parents=True)
    (root / "grpo" / "manifest.json").write_text(json.dumps({"kind": "checkpoint"}))
    (root / "evidence").mkdir()
    (root / "evidence" / "summary.json").write_text("{}")
    seen = []
    monkeypatch.setattr(rt, "_trainer_root", lambda preset, overrides: seen.append(overrides) or str(root))
    trainer = FakeTrainer(improved=True, version="2")
    monkeypatch.setattr(rt, "load_object", lambda ref: trainer)
    note = rt._model_hook(RetrainConfig(corpus="data/corpus/mini.jsonl"))
    assert "nothing new to train" in note and str(root) in note and not trainer.calls
    assert ("searchloop-searchr1_learn_demo", "champion") not in registry

    registry[("searchloop-searchr1_learn_demo", "champion")] = "4"
    (root / "evidence" / "summary.json").unlink()  # not compared yet: the run is resumed and finished
    rt._model_hook(RetrainConfig(corpus="data/corpus/mini.jsonl"))
    assert "model=models:/searchloop-searchr1_learn_demo/4" in seen[-1] and len(trainer.calls) == 1


def test_the_trainer_root_is_rl_finetunes_run_dir_and_follows_the_start_version() -> None:
    """The directory checked is the one rl-finetune uses, and two champion versions get two directories."""
    from flows.specs import resolve
    from infra.paths import experiment_root

    overrides = ["model=smollm2", "init.warmup=null", "eval.compare_start=true"]
    cfg = resolve("rl-finetune", "searchr1_learn_demo", overrides)
    assert real_trainer_root("searchr1_learn_demo", overrides) == str(experiment_root("rl", cfg.name, cfg.key()))
    other = ["model=smollm2-135m-instruct", *overrides[1:]]
    assert real_trainer_root("searchr1_learn_demo", other) != real_trainer_root("searchr1_learn_demo", overrides)
