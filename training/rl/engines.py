"""The table of training engines (a leaf: dataclasses and infra only), read by the RL and SmartSearch configs.

An engine is one launcher module plus one :data:`ENGINES` line; the configs check ``engine:`` against the table when
they load, and ``training.rl.stages``, ``training.rl.warmup`` and ``training.smartsearch.grpo`` ask the entry
instead of branching on the name. Launchers are dotted import strings, imported only when chosen (like
``training.generation.base.GENERATORS``). docs/extending.md shows a toy engine registered from a test.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.errors import ConfigError
from infra.lazy import table_name, unknown_name


@dataclass(frozen=True)
class Engine:
    """What the rest of the code needs to know about a training engine.

    Attributes:
        launch: ``"module:function"`` training one RL stage,
            ``(cfg: RLConfig, stage: StageSpec, data: RLDataRef, init_model: str, out_uri: str) -> CheckpointRef``.
        settings: the ``StageSpec`` / ``Stage3Spec`` field holding the engine's settings (``trl``, ``verl``), which
            the configs require; None for an engine without settings.
        stage3: ``"module:function"`` running SmartSearch's stage 3 with this engine,
            ``(cfg, judge, refiner, searcher, init_model, out_uri) -> StageResult``; None: not offered there.
        remote_search: the engine searches from remote workers over HTTP, so ``retrieval.url`` is required.
        tool_name: the tool name written into the training rows (verl's agent loop reads tool calls); None: none.
        local_rollouts: rollouts run through our engine on this machine, so the warm-up may be fitted to the first
            stage's rollout budget (``init.fit_rollout_budget``).
    """

    launch: str
    settings: str | None = None
    stage3: str | None = None
    remote_search: bool = False
    tool_name: str | None = None
    local_rollouts: bool = False


ENGINES: dict[str, Engine] = {
    "trl": Engine(launch="training.rl.stages:train_stage_trl", settings="trl",
                  stage3="training.smartsearch.grpo:run_trl", local_rollouts=True),
    "verl": Engine(launch="training.rl.verl.launch:train_stage_verl", settings="verl",
                   stage3="training.smartsearch.grpo:run_verl", remote_search=True, tool_name="search"),
}
EngineName = table_name(ENGINES, "training engine")


def get_engine(name: str) -> Engine:
    """The :data:`ENGINES` entry named ``name``.

    Raises:
        ConfigError: for an unknown name, listing the known ones.
    """
    entry = ENGINES.get(name)
    if entry is None:
        raise ConfigError(unknown_name("training engine", name, ENGINES))
    return entry

