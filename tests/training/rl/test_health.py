"""Health monitor on synthetic metric streams, and its TrainerCallback stopping a run and blocking saves."""

from __future__ import annotations

import math

import pytest

from training.rl.health import (
    HealthConfig,
    HealthMonitor,
    TrainingHealthError,
    health_callback,
    pick,
    raise_if_unhealthy,
)


def _stream(n: int, **fixed: float) -> list[dict[str, float]]:
    base = {"reward": 0.3, "loss": 0.01, "entropy": 1.2, "kl": 0.001, "completions/mean_length": 80.0,
            "search/format_failure_rate": 0.4, "search/searches_per_traj": 1.5}
    return [{**base, **fixed, "reward": fixed.get("reward", 0.3 + 0.05 * (i % 3))} for i in range(n)]


def test_healthy_stream_passes() -> None:
    mon = HealthMonitor(HealthConfig(window=3, min_reward_std=0.01))
    verdicts = [mon.update(i, m) for i, m in enumerate(_stream(10))]
    assert all(v.ok for v in verdicts)
    assert mon.snapshot(_stream(1)[0])["health/searches_per_traj"] == 1.5


def test_nan_loss_stops_immediately() -> None:
    mon = HealthMonitor(HealthConfig())
    stream = _stream(3)
    stream[2]["loss"] = math.nan
    verdicts = [mon.update(i, m) for i, m in enumerate(stream)]
    assert [v.ok for v in verdicts] == [True, True, False]
    assert "loss is nan" in verdicts[2].reason
    assert not mon.update(3, _stream(1)[0]).ok, "the first failure sticks"


def test_reward_collapse_needs_full_window() -> None:
    mon = HealthMonitor(HealthConfig(window=4, min_reward_std=0.01))
    flat = _stream(6, reward=0.1)
    verdicts = [mon.update(i, m) for i, m in enumerate(flat)]
    assert [v.ok for v in verdicts[:3]] == [True, True, True]
    assert not verdicts[3].ok and "reward collapsed" in verdicts[3].reason


@pytest.mark.parametrize(("key", "value", "word"), [
    ("search/format_failure_rate", 1.0, "format_failure_rate"),
    ("completions/mean_length", 1.0, "response_length"),
    ("entropy", 0.0001, "entropy"),
])
def test_collapse_conditions(key: str, value: float, word: str) -> None:
    mon = HealthMonitor(HealthConfig(window=3))
    stream = _stream(2) + _stream(3, **{key: value})
    verdicts = [mon.update(i, m) for i, m in enumerate(stream)]
    assert verdicts[3].ok and not verdicts[4].ok
    assert word in verdicts[4].reason


def test_warmup_and_kl_limit() -> None:
    mon = HealthMonitor(HealthConfig(window=2, warmup_steps=3))
    stream = _stream(3, entropy=0.0)
    assert all(mon.update(i, m).ok for i, m in enumerate(stream)), "collapse checks wait for warm-up"
    assert not mon.update(3, _stream(1, kl=50.0)[0]).ok


def test_verl_names_are_aliases() -> None:
    assert pick({"critic/score/mean": 0.5}, "reward") == 0.5
    assert pick({"actor/entropy": "x"}, "entropy") is None


class _Args:
    output_dir = "/tmp/out"


class _State:
    def __init__(self, step: int) -> None:
        self.global_step = step


class _Control:
    should_training_stop = False
    should_save = True


def test_callback_stops_and_keeps_last_good_checkpoint() -> None:
    cb = health_callback(HealthConfig(window=2), log_to_mlflow=False)
    control = _Control()
    cb.on_log(_Args(), _State(1), control, logs=_stream(1)[0])
    cb.on_save(_Args(), _State(1), control)
    assert not control.should_training_stop
    cb.on_log(_Args(), _State(2), control, logs={"loss": math.inf})
    assert control.should_training_stop and not control.should_save
    cb.on_save(_Args(), _State(2), control)
    assert cb.last_good_checkpoint == "/tmp/out/checkpoint-1"
    with pytest.raises(TrainingHealthError, match="checkpoint-1"):
        raise_if_unhealthy(cb)
    assert [row["step"] for row in cb.series] == [1.0, 2.0]
