"""The GRPO step benchmark's memory attribution: ``RSSPeak`` files each RSS sample under the phase the step is in
(the innermost of ``StepClock.phases``), only while the clock measures, and the report prints one row per variant."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import grpo_step  # noqa: E402


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS samples read /proc/self/statm")
def test_rss_peak_is_filed_under_the_phase_it_was_sampled_in() -> None:
    clock = grpo_step.StepClock(skip=1)
    peak = grpo_step.RSSPeak(clock)
    peak.start()
    try:
        clock.phases.append("rollout")
        time.sleep(0.35)  # warm-up step: not measured
        assert peak.by_phase == {}
        clock.step = 1
        time.sleep(0.35)
        clock.phases.append("loss forward/backward")
        block = bytearray(64 << 20)  # 64 MiB touched inside the innermost phase
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(0.35)
        clock.phases.pop()
        del block
        clock.phases.pop()
        time.sleep(0.35)
    finally:
        peak.stop()
    assert clock.phase == "between steps"
    assert set(peak.by_phase) == {"rollout", "loss forward/backward", "between steps"}
    assert peak.by_phase["loss forward/backward"] >= peak.by_phase["rollout"] + (32 << 20)
    assert peak.peak == max(peak.by_phase.values())
