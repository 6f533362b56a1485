"""The GRPO step benchmark's memory attribution: ``RSSPeak`` files each RSS sample under the phase the step is in
(the innermost of ``StepClock.phases``), only while the clock measures, and the report prints one row per variant."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import grpo_step  # noqa: E402


def test_rss_peak_is_filed_under_the_phase_it_was_sampled_in() -> None:
    # A scripted reader: the process's real RSS need not grow when a block is allocated (freed pages are reused),
    # which made a real-allocation version of this test fail in CI.
    rss = {"now": 1 << 30}
    clock = grpo_step.StepClock(skip=1)
    peak = grpo_step.RSSPeak(clock, read_rss=lambda: rss["now"])
    peak.start()
    try:
        clock.phases.append("rollout")
        time.sleep(0.35)  # warm-up step: not measured
        assert peak.by_phase == {}
        clock.step = 1
        time.sleep(0.35)
        clock.phases.append("loss forward/backward")
        rss["now"] += 64 << 20
        time.sleep(0.35)
        clock.phases.pop()
        rss["now"] -= 64 << 20
        clock.phases.pop()
        time.sleep(0.35)
    finally:
        peak.stop()
    assert clock.phase == "between steps"
    assert peak.by_phase == {
        "rollout": 1 << 30,
        "loss forward/backward": (1 << 30) + (64 << 20),
        "between steps": 1 << 30,
    }
    assert peak.peak == max(peak.by_phase.values())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS samples read /proc/self/statm")
def test_self_rss_reads_this_process() -> None:
    assert grpo_step.self_rss() > 10 << 20  # a Python process with pytest loaded is well over 10 MiB


def test_budget_variants_set_the_loss_token_budget_on_todays_settings() -> None:
    from training.rl.config import TRLSearchConfig

    base = TRLSearchConfig(num_generations=8, prompts_per_step=2, micro_batch_size=4)
    assert grpo_step.variant_config(base, "budget1k") == base.model_copy(update={"loss_token_budget": 1024})
    assert grpo_step.variant_config(base, "budget2k").loss_token_budget == 2048
    assert {"budget1k", "budget2k"} <= set(grpo_step.EXTRA)


def test_filed_variant_restores_the_cost_settings_of_the_filing() -> None:
    from training.rl.config import TRLSearchConfig

    base = TRLSearchConfig(lora_rank=16, precision="auto", beta=0.0, loss_token_budget=1024, num_generations=8)
    filed = grpo_step.variant_config(base, "filed")
    assert (filed.lora_rank, filed.precision, filed.beta, filed.loss_token_budget) == (None, "fp32", 0.001, None)
    assert filed.num_generations == 8  # the preset's shapes and sampling stay


def test_shared_variant_turns_on_share_prompt_alone() -> None:
    from training.rl.config import TRLSearchConfig

    base = TRLSearchConfig(num_generations=8, prompts_per_step=2, micro_batch_size=4, loss_token_budget=1024)
    assert grpo_step.variant_config(base, "shared") == base.model_copy(update={"share_prompt": True})
    assert "shared" in grpo_step.EXTRA


def test_top_variants_put_todays_lora_on_the_top_layers() -> None:
    from training.rl.config import TRLSearchConfig

    base = TRLSearchConfig(lora_rank=16, num_generations=8, prompts_per_step=2, micro_batch_size=4)
    assert grpo_step.variant_config(base, "top", top_layers=8) == base.model_copy(update={"lora_layers": 8})
    both = grpo_step.variant_config(base, "shared_grouped_top")
    assert (both.lora_layers, both.share_prompt, both.loss_attention) == (10, True, "grouped")
    full = TRLSearchConfig(num_generations=8)  # a full fine-tune's top variant gets LoRA of --lora-rank
    assert (grpo_step.variant_config(full, "top", lora_rank=4).lora_rank,) == (4,)
    assert grpo_step.variant_config(base, "filed").lora_layers is None
    assert {"top", "shared_grouped_top"} <= set(grpo_step.EXTRA)


def test_frozen_policy_learning_rate_leaves_the_policy_as_it_was() -> None:
    """One AdamW step at ``FROZEN_LR`` on a full weight and a LoRA pair (B starts at 0): the full weight and the
    merged weight W + B @ A are bit-for-bit the start's, so every variant keeps rolling out the start policy."""
    torch = pytest.importorskip("torch")

    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 8, generator=g) * 0.05)
    a = torch.nn.Parameter(torch.randn(2, 8, generator=g) * 0.05)
    b = torch.nn.Parameter(torch.zeros(8, 2))
    w0, merged0 = w.detach().clone(), (w + b @ a).detach().clone()
    x = torch.randn(4, 8, generator=g)
    (x @ (w + b @ a).T).pow(2).sum().backward()
    torch.optim.AdamW([w, a, b], lr=grpo_step.FROZEN_LR, weight_decay=0.01).step()
    assert b.abs().max() > 0  # the step did move B, off its zero start ...
    assert torch.equal(w.detach(), w0) and torch.equal((w + b @ a).detach(), merged0)  # ... by nothing W can hold


def test_ahead_and_old_steps_variants() -> None:
    """``ahead``/``shared_ahead`` turn on resample_ahead (and share_prompt); ``old_steps`` keeps today's settings and
    switches the decode steps back inside run_variant."""
    from training.rl.config import TRLSearchConfig

    base = TRLSearchConfig(num_generations=8, prompts_per_step=2, resample_flat_groups=4)
    assert grpo_step.variant_config(base, "ahead") == base.model_copy(update={"resample_ahead": grpo_step.AHEAD})
    both = grpo_step.variant_config(base, "shared_ahead")
    assert both.share_prompt and both.resample_ahead == grpo_step.AHEAD
    assert grpo_step.variant_config(base, "old_steps") == base
    assert {"ahead", "shared_ahead", "old_steps"} <= set(grpo_step.EXTRA)


def test_no_dynamic_sampling_refuses_the_ahead_variants(monkeypatch, capsys) -> None:
    import pytest

    monkeypatch.setattr("sys.argv", ["grpo_step.py", "--variants", "today,shared_ahead", "--no-dynamic-sampling"])
    with pytest.raises(SystemExit):
        grpo_step.main()
    assert "nothing to roll out ahead" in capsys.readouterr().err


def test_decode_step_parts_checks_the_masks_equal_and_prints_both_ratios(capsys) -> None:
    import decode_step_parts  # benchmarks/ is on sys.path (above)

    assert decode_step_parts.main(["--threads", "1", "--rows", "2", "--vocab", "64", "--keys", "8",
                                   "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "| draw a token per row |" in out and "| decode step mask |" in out and out.count("x |") == 2
