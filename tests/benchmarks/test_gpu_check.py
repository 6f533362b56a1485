"""benchmarks/gpu_check.py: it skips cleanly without CUDA, and its GRPO sections' configs are valid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import gpu_check  # noqa: E402


def test_learning_settings_override_the_filed_ones() -> None:
    filed = gpu_check.grpo_config(quick=False)
    assert (filed.beta, filed.lora_rank, filed.share_prompt, filed.precision) == (0.001, None, False, "fp32")
    learn = gpu_check.grpo_config(quick=False, settings=gpu_check.LEARN_SETTINGS)
    assert (learn.beta, learn.lora_rank, learn.share_prompt, learn.precision) == (0.0, 16, True, "auto")
    assert learn.num_generations * learn.prompts_per_step == filed.num_generations * filed.prompts_per_step == 16
    for key, value in gpu_check.LEARN_SETTINGS.items():  # grpo_each: one switch at a time
        assert getattr(gpu_check.grpo_config(quick=True, settings={key: value}), key) == value
    assert filed.max_steps == 2 and gpu_check.grpo_config(quick=True, steps=4).max_steps == 4  # 1 warm-up + timed


def test_skips_cleanly_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the check would run, not skip")
    out = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_check.py")], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "gpu_check: skipped, no CUDA device" in out.stdout


def test_a_failing_part_keeps_the_others_numbers(capsys) -> None:
    """A section or GRPO switch that raises becomes ``{"error": ...}`` (traceback printed); the others' results stay."""
    def boom() -> dict:
        raise RuntimeError("CUDA out of memory")

    parts = {"ok": gpu_check._guarded(lambda: {"trajectories_per_min": 3.0}), "bad": gpu_check._guarded(boom)}
    assert parts == {"ok": {"trajectories_per_min": 3.0}, "bad": {"error": "RuntimeError: CUDA out of memory"}}
    assert "RuntimeError: CUDA out of memory" in capsys.readouterr().err
