"""The start-policy gate: RL is meant to teach answers, so a warm-up policy that is not format-ok on enough
held-out questions is reported, and with ``eval.start_gate=stop`` the run stops before any RL step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infra import artifacts
from tasks.policy import retry_unless_input_error
from training.rl.health import TrainingHealthError
from training.rl.heldout import check_start_policy


def _cfg(floor: float | None, gate: str, max_turns: int = 2, max_new_tokens: int = 96) -> SimpleNamespace:
    return SimpleNamespace(eval=SimpleNamespace(start_min_format_ok=floor, start_gate=gate,
                                                max_new_tokens=max_new_tokens),
                           stages=[SimpleNamespace(max_turns=max_turns)])


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


@pytest.mark.parametrize(("attempt", "max_turns", "expected"), [
    ("searchr1_grpo_try2", 2, "failures: 42 out of generation passes (max_turns 2), 13 at the token budget "
                              "(eval.max_new_tokens 96)"),
    ("searchr1_grpo_try3", 3, "failures: 73 at the token budget (eval.max_new_tokens 96)"),
])
def test_the_gate_says_which_budget_ended_the_failures(attempt: str, max_turns: int, expected: str) -> None:
    """Session 13's Search-R1 attempts 2 and 3 were stopped by the gate; the reason names what ended the failing
    trajectories (the diagnosis that decided attempts 3 and 4), from the committed start rows."""
    rows = f"docs/results/learning/{attempt}/heldout_start.jsonl"
    with pytest.raises(TrainingHealthError, match=r"format-ok on (74|65)% of 210") as err:
        check_start_policy(_cfg(0.9, "stop", max_turns=max_turns), rows)
    assert expected in str(err.value)
