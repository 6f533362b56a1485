"""Adding a training engine is one launcher plus one table line: a toy engine registered from this test.

The toy engine "trains" by copying the initial policy folder and counting the training rows it was given, which is
enough to show the seam: the RL config accepts ``engine=toy`` once the line is in ``training.rl.engines.ENGINES``
(added here with ``monkeypatch.setitem``), ``train_rl_stage`` dispatches to it, and its manifest makes a re-run
return the finished stage. No library file names it (docs/extending.md walks through it).
"""

from __future__ import annotations

import shutil

import pytest

from infra import artifacts
from infra.config import load_config
from infra.errors import ConfigError
from training.refs import CheckpointRef
from training.rl.config import RLConfig, StageSpec
from training.rl.data import RLDataRef
from training.rl.engines import ENGINES, Engine
from training.rl.stages import train_rl_stage

CALLS: list[str] = []


def train_stage_toy(cfg: RLConfig, stage: StageSpec, data: RLDataRef, init_model: str, out_uri: str) -> CheckpointRef:
    """The whole engine: one stage from ``init_model`` into ``out_uri``, finished by a manifest."""
    CALLS.append(stage.name)
    out = artifacts.local_path(out_uri)
    shutil.copytree(init_model, out / "model")
    ref = CheckpointRef(uri=str(out / "model"), base_model=init_model, stage=stage.name, engine=cfg.engine,
                        stage_dir=str(out), n_examples=data.splits.get("train", 0))
    artifacts.write_manifest(str(out), kind="rl_stage", checkpoint=ref.model_dump())
    return ref


@pytest.fixture
def toy(monkeypatch) -> str:
    monkeypatch.setitem(ENGINES, "toy", Engine(launch=f"{__name__}:train_stage_toy"))
    CALLS.clear()
    return "toy"


def test_unregistered_engine_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown training engine 'toy'.*trl, verl"):
        load_config(RLConfig, "research_grpo_cpu_demo", ["engine=toy"])


def test_toy_engine_trains_a_stage_and_is_idempotent(toy, tmp_path) -> None:
    cfg = load_config(RLConfig, "research_grpo_cpu_demo", [f"engine={toy}"])
    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text("{}")
    data = RLDataRef(uri=str(tmp_path / "data"), splits={"train": 7})
    ref = train_rl_stage(cfg, cfg.stages[0], data, str(init), str(tmp_path / "stage"))
    assert ref.engine == "toy" and ref.n_examples == 7 and (tmp_path / "stage" / "model" / "config.json").exists()
    again = train_rl_stage(cfg, cfg.stages[0], data, str(init), str(tmp_path / "stage"))
    assert again == ref and [cfg.stages[0].name] == CALLS  # the manifest marks the stage finished


def test_engine_settings_section_is_required_when_the_entry_names_one(monkeypatch) -> None:
    monkeypatch.setitem(ENGINES, "toy", Engine(launch=f"{__name__}:train_stage_toy", settings="verl",
                                               remote_search=True))
    with pytest.raises(ConfigError) as err:
        load_config(RLConfig, "research_grpo_cpu_demo", ["engine=toy"])
    assert "have no `verl:` section" in str(err.value) and "set retrieval.url" in str(err.value)
