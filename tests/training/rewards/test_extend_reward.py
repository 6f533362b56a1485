"""Adding a reward is one module plus one table line: a toy reward registered from this test.

The toy reward is a plain function with a trainer hook of its own (``Reward.trl_options`` / ``verl_options``: it
reads a per-sample "bonus" the trainer knows and the text cannot show). Registering it (``monkeypatch.setitem`` on
``training.rewards.registry.REWARDS``, the one line a real reward adds) is enough for the RL config's reward check,
the TRL and verl adapters (``trl_reward_func``, ``compute_score`` and its fixed entry point) and the held-out reward
function. No library file names it (docs/extending.md walks through it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from infra.config import load_config
from infra.errors import ConfigError
from training.rewards import adapters
from training.rewards.common import Reward, RewardBreakdown, as_golds
from training.rewards.registry import REWARDS
from training.rl.config import RLConfig


def toy_reward(response: str, golds: str | Iterable[str], bonus: float = 0.0) -> RewardBreakdown:
    """1 when a gold answer appears in the response, plus ``bonus``."""
    hit = float(any(g.lower() in response.lower() for g in as_golds(golds)))
    return RewardBreakdown(hit + bonus, {"hit": hit, "bonus": bonus}, "toy")


def _verl_bonus(info: Mapping[str, Any], options: dict[str, Any]) -> dict[str, float]:
    options.setdefault("bonus", float(info.get("bonus", 0.0)))
    return {"bonus_seen": 1.0}


def _trl_bonus(i: int, kwargs: Mapping[str, Any], options: dict[str, Any], eos_token_id: int | None) -> None:
    if "bonus" in kwargs:
        options["bonus"] = float(kwargs["bonus"][i])


TOY = Reward(toy_reward, verl_options=_verl_bonus, trl_options=_trl_bonus)


@pytest.fixture
def toy(monkeypatch) -> str:
    monkeypatch.setitem(REWARDS, "toy", f"{__name__}:TOY")
    return "toy"


def test_unregistered_reward_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown reward 'toy'"):
        load_config(RLConfig, "research_grpo_cpu_demo", ["stages.grpo.reward=toy"])
    with pytest.raises(ConfigError, match="unknown reward 'toy'"):
        adapters.score_response("toy", "x", ["x"])


def test_toy_reward_through_every_adapter(toy) -> None:
    cfg = load_config(RLConfig, "research_grpo_cpu_demo", [f"stages.grpo.reward={toy}"])
    assert cfg.stages[0].reward == "toy"
    assert adapters.score_response(toy, "It is Paris.", ["paris"]).score == 1.0
    # TRL: golds from a dataset column, the bonus from another column through the reward's own hook
    fn = adapters.trl_reward_func(toy)
    assert fn(["p", "p"], ["Paris", "Lyon"], golden_answers=[["paris"], ["paris"]], bonus=[0.5, 0.25]) == [1.5, 0.25]
    # verl: the reward picked by extra_info, the bonus read from it by the hook, the extra float reported
    out = adapters.compute_score("d", "Paris!", {"target": ["paris"]}, {"reward": toy, "bonus": 0.5})
    assert out == {"score": 1.5, "hit": 1.0, "bonus": 0.5, "bonus_seen": 1.0}
    assert adapters.compute_score_toy("d", "Lyon", ["paris"], {})["score"] == 0.0  # the fixed verl entry point
    # held-out reward of finished trajectories
    traj = type("T", (), {"response": "paris", "golden_answers": ["Paris"]})()
    assert adapters.seed_reward_fn(toy)([traj]) == [1.0]
