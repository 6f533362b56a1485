"""The GRPO loss under a token budget (``TRLSearchConfig.loss_token_budget``): ``loss_parts`` cuts a loss batch into
trimmed parts of at most the budget's tokens, and the budgeted loss back-propagates the same gradient as the whole
micro-batch at once, for each of TRL's loss normalisations (a tiny random Llama, fp32)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from training.rl.trl_engine import loss_parts, part_weight  # noqa: E402

PROMPTS = [5, 9, 3, 7, 6]  # unpadded prompt lengths
COMPLETIONS = [4, 11, 2, 8, 5]  # unpadded completion lengths (EOS included)


def _batch(vocab: int = 100, seed: int = 0) -> dict:
    """A TRL-shaped loss batch: left-padded prompts, right-padded completions, a tool mask with inserted tokens."""
    g = torch.Generator().manual_seed(seed)
    n, wp, wc = len(PROMPTS), max(PROMPTS) + 2, max(COMPLETIONS) + 3  # extra all-padding columns on both sides
    prompt_ids, prompt_mask = torch.zeros(n, wp, dtype=torch.long), torch.zeros(n, wp, dtype=torch.long)
    completion_ids, completion_mask = torch.zeros(n, wc, dtype=torch.long), torch.zeros(n, wc, dtype=torch.long)
    for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS, strict=True)):
        prompt_ids[i, wp - p:] = torch.randint(1, vocab, (p,), generator=g)
        prompt_mask[i, wp - p:] = 1
        completion_ids[i, :c] = torch.randint(1, vocab, (c,), generator=g)
        completion_mask[i, :c] = 1
    tool_mask = torch.ones(n, wc, dtype=torch.long)
    tool_mask[1, 3:6] = 0  # retrieved tokens inside two completions: in context, out of the loss
    tool_mask[3, 2:4] = 0
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "tool_mask": tool_mask,
            "advantages": torch.randn(n, generator=g), "num_items_in_batch": completion_mask.sum()}


def test_parts_cover_every_row_once_within_the_budget_and_trimmed() -> None:
    batch = _batch()
    parts = loss_parts(batch, budget=40)
    rows = sorted(r for idx, _ in parts for r in idx.tolist())
    assert rows == list(range(len(PROMPTS)))
    for idx, part in parts:
        width = part["prompt_ids"].size(1) + part["completion_ids"].size(1)
        assert len(idx) == 1 or len(idx) * width <= 40
        assert part["prompt_mask"][:, 0].any() and part["completion_mask"][:, -1].any()  # no padding-only column
        assert part["prompt_ids"].size(1) == max(PROMPTS[i] for i in idx.tolist())
        assert part["completion_ids"].size(1) == max(COMPLETIONS[i] for i in idx.tolist())
        assert part["tool_mask"].shape == part["completion_mask"].shape
        assert torch.equal(part["advantages"], batch["advantages"][idx])
        assert part["num_items_in_batch"] is batch["num_items_in_batch"]  # step-wide values pass through
    assert len(loss_parts(batch, budget=10_000)) == 1  # the whole batch fits: one (trimmed) part
    assert len(loss_parts(batch, budget=1)) == len(PROMPTS)  # nothing fits: one row a part


def test_part_weights_sum_to_one() -> None:
    batch = _batch()
    mask = batch["completion_mask"] * batch["tool_mask"]
    parts = loss_parts(batch, budget=40)
    for loss_type in ("grpo", "dr_grpo", "bnpo"):
        assert sum(part_weight(loss_type, idx, mask) for idx, _ in parts) == pytest.approx(1.0)
    assert part_weight("dapo", parts[0][0], mask) == 1.0
    with pytest.raises(ValueError, match="loss_type='sapo'"):
        part_weight("sapo", parts[0][0], mask)


@pytest.fixture(scope="module")
def tiny_trainer(tiny_model_dir, tmp_path_factory):
    """A SearchGRPOTrainer over the tiny model (its rollouts are never called)."""
    from training.rl.config import TRLSearchConfig
    from training.rl.trl_engine import build_trainer

    def never(*_args, **_kwargs):
        raise AssertionError("no rollout in this test")

    def reward(completions, **_kwargs):
        return [0.0] * len(completions)

    trl = TRLSearchConfig(num_generations=5, prompts_per_step=1, max_steps=1, beta=0.0, max_completion_length=16,
                          micro_batch_size=5)
    trainer = build_trainer(trl, str(tiny_model_dir), [{"prompt": "q"}], [reward], never,
                            str(tmp_path_factory.mktemp("out")))
    trainer.model.train()
    return trainer


def _grads(trainer, batch: dict, budget: int | None) -> tuple[float, list]:
    trainer.model.zero_grad(set_to_none=True)
    trainer.loss_token_budget = budget
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


@pytest.mark.parametrize("loss_type", ["dr_grpo", "grpo", "bnpo"])
def test_budgeted_loss_gives_the_whole_batch_gradient(tiny_trainer, loss_type: str) -> None:
    tiny_trainer.loss_type = loss_type
    batch = _batch(vocab=tiny_trainer.model.config.vocab_size)
    whole_loss, whole = _grads(tiny_trainer, batch, None)
    assert len(loss_parts(batch, 24)) == 4  # rows of 20, 15, 11 + 9 and 5 tokens
    budget_loss, budgeted = _grads(tiny_trainer, batch, 24)
    assert budget_loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-7)
    assert len(budgeted) == len(whole) and any(g.abs().sum() > 0 for g in whole)
    for a, b in zip(whole, budgeted, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)


def test_budget_check_script_finds_fp32_parts_equal_to_the_whole_batch(tiny_model_dir) -> None:
    import re
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
    import loss_budget_check

    lines = loss_budget_check.main(["--model", str(tiny_model_dir), "--lora", "0", "--budget", "1024",
                                    "--share-prompt"])
    fp32 = [line for line in lines if ", fp32:" in line or "Trainer's path" in line or "prompt, fp32," in line]
    assert len(fp32) == 4
    for line in fp32:
        diffs = [float(x) for x in re.findall(r"\d\.\d+e[-+]\d+", line)]  # the relative differences (|g| is not)
        assert diffs and max(diffs) < 1e-4, line
