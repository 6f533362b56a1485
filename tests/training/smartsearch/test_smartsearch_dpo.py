"""Stage-2 LoRA DPO with TRL on CPU: one step on two hand-made pairs, merged into a loadable HF folder, manifest
last, a re-run skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.smartsearch.config import DPOSpec


@pytest.mark.slow
def test_train_dpo_one_step_merges(tmp_path, smol_path) -> None:
    from transformers import AutoModelForCausalLM

    from training.smartsearch.dpo import train_dpo

    prompt = "<|im_start|>user\nWho directed Ed Wood?<|im_end|>\n<|im_start|>assistant\n<think>"
    pairs = [{"prompt": prompt,
              "chosen": " Search. </think>\n<search> Ed Wood director </search><result>result: \nTim Burton.\n\n"
                        "</result>\n<answer> \\boxed{Tim Burton} </answer>",
              "rejected": " No. </think>\n<answer> \\boxed{Orson Welles} </answer>"}] * 2
    cfg = DPOSpec(max_steps=1, per_device_train_batch_size=2, gradient_accumulation_steps=1, max_length=128,
                  learning_rate=1e-4)
    ref = train_dpo(cfg, pairs, str(smol_path), tmp_path / "dpo")
    assert ref.n_examples == 2 and ref.train_loss is not None and 0 < ref.train_loss < 1.0
    assert Path(tmp_path / "dpo" / "manifest.json").exists()
    model = AutoModelForCausalLM.from_pretrained(ref.uri)          # merged: a plain HF model, no adapter
    assert not any("lora" in n for n, _ in model.named_parameters())
    assert train_dpo(cfg, [], str(smol_path), tmp_path / "dpo") == ref  # complete -> skipped (no pairs needed)


def test_demo_dpo_trains_from_its_first_step(tmp_path) -> None:
    """The demo's 2 DPO steps both move the policy: no warm-up step at learning rate 0 (the run of 2026-11-26 logged
    loss ln 2 and margin 0 at both steps with the seed's warmup_ratio 0.1)."""
    import torch
    from transformers import get_scheduler

    from flows.specs import resolve
    from training.smartsearch.dpo import dpo_args

    cfg = resolve("smartsearch-curriculum", "smartsearch_cpu_demo", [])
    args = dpo_args(cfg.stage2.dpo, str(tmp_path))
    assert args.warmup_ratio == 0.0 and DPOSpec().warmup_ratio == 0.1  # the seed's default stays the default
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    sched = get_scheduler(args.lr_scheduler_type, opt, num_warmup_steps=args.get_warmup_steps(args.max_steps),
                          num_training_steps=args.max_steps)
    assert sched.get_last_lr()[0] == pytest.approx(5e-5)
    seed_args = dpo_args(DPOSpec(max_steps=2), str(tmp_path / "seed"))
    assert seed_args.get_warmup_steps(2) == 1  # what the demo ran before: step 1 at learning rate 0
