"""The start-policy gate: RL is meant to teach answers, so a warm-up policy that is not format-ok on enough
held-out questions is reported, and with ``eval.start_gate=stop`` the run stops before any RL step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infra import artifacts
from tasks.policy import retry_unless_input_error
from training.rl.health import TrainingHealthError
from training.rl.heldout import check_start_policy


def _cfg(floor: float | None, gate: str) -> SimpleNamespace:
    return SimpleNamespace(eval=SimpleNamespace(start_min_format_ok=floor, start_gate=gate))


def _rows(tmp_path, ok: int, n: int) -> str:
    path = str(tmp_path / "heldout_start.jsonl")
    artifacts.write_jsonl(path, [{"id": str(i), "format_ok": i < ok} for i in range(n)])
    return path


def test_format_ok_start_passes(tmp_path) -> None:
    assert check_start_policy(_cfg(0.9, "stop"), _rows(tmp_path, 19, 20)) is None


def test_recorded_searchr1_start_warns_with_the_fix(caplog) -> None:
    # the committed Search-R1 start policy: format-ok on 44% of the 210 held-out questions
    reason = check_start_policy(_cfg(0.9, "warn"), "docs/results/learning/searchr1_grpo/heldout_start.jsonl")
    assert reason is not None and "44% of 210" in reason and "init.warmup.sft" in reason
    assert "44% of 210" in caplog.text


def test_stop_raises_before_rl_and_is_not_retried(tmp_path) -> None:
    with pytest.raises(TrainingHealthError, match="RL not started: start policy format-ok on 50% of 20"):
        check_start_policy(_cfg(0.9, "stop"), _rows(tmp_path, 10, 20))
    assert not retry_unless_input_error(None, None, SimpleNamespace(data=TrainingHealthError("stopped")))


def test_gate_off(tmp_path) -> None:
    assert check_start_policy(_cfg(None, "stop"), _rows(tmp_path, 0, 20)) is None


def test_config_fields_validate() -> None:
    from training.rl.config import EvalSpec

    assert EvalSpec().start_min_format_ok == 0.9 and EvalSpec().start_gate == "warn"
    with pytest.raises(ValueError):
        EvalSpec(start_gate="halt")
