"""How far the GRPO loss under a token budget (``TRLSearchConfig.loss_token_budget``) moves the gradient, on a real
policy: the whole micro-batch against its budgeted parts and against the whole batch trimmed of its padding, in fp32
and under bf16 autocast, through the Trainer's own path (its autocast context, division by the accumulation steps,
``accelerator.backward``) as well as a plain ``backward``.

fp32 separates the code from the numerics: the budgeted gradient must equal the whole batch's up to float order
(relative difference ~1e-5). Under bf16 any change of the batch's shapes (trimming, parts) moves the gradient by the
numerics of bf16 alone; the script prints how much, with advantages of mixed signs and with advantages that cancel
(the same completion with +a and -a), where the gradient is a small difference of large terms.

``--share-prompt`` adds the same comparison for ``TRLSearchConfig.share_prompt`` (each distinct prompt forwarded
once, ``training/rl/shared_prompt.py``) on a micro-batch whose four rows share one prompt, as GRPO's micro-batches do
with it on: shared against TRL's forward, under the budget, in fp32 and bf16.

Usage: ``PYTHONPATH=. python benchmarks/loss_budget_check.py --model <policy folder> [--lora 16] [--budget 1024]
[--share-prompt]`` (about a minute on 2 cores). Output: one line per comparison.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any


def _batch(vocab: int, seed: int = 1) -> dict[str, Any]:
    """Four rows shaped like a ReSearch micro-batch: prompts of 180-230 tokens left-padded to 240, completions of
    90-160 tokens right-padded to 170, a retrieved paragraph (tokens 20-60) out of the loss."""
    import torch

    g = torch.Generator().manual_seed(seed)
    prompts, completions, wp, wc = [210, 190, 230, 180], [150, 120, 160, 90], 240, 170
    n = len(prompts)
    b = {"prompt_ids": torch.zeros(n, wp, dtype=torch.long), "prompt_mask": torch.zeros(n, wp, dtype=torch.long),
         "completion_ids": torch.zeros(n, wc, dtype=torch.long),
         "completion_mask": torch.zeros(n, wc, dtype=torch.long)}
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        b["prompt_ids"][i, wp - p:] = torch.randint(1, vocab, (p,), generator=g)
        b["prompt_mask"][i, wp - p:] = 1
        b["completion_ids"][i, :c] = torch.randint(1, vocab, (c,), generator=g)
        b["completion_mask"][i, :c] = 1
    b["tool_mask"] = torch.ones(n, wc, dtype=torch.long)
    b["tool_mask"][:, 20:60] = 0
    b["advantages"] = torch.tensor([0.5, -0.3, 0.8, -1.0])
    return b


def main(argv: list[str] | None = None) -> list[str]:
    import torch

    from training.rl.config import TRLSearchConfig
    from training.rl.trl_engine import build_trainer, loss_parts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF folder of the policy (e.g. a learning run's warm-up model)")
    ap.add_argument("--lora", type=int, default=16, help="LoRA rank of the trained adapters (0: full fine-tune)")
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--share-prompt", action="store_true", help="also compare share_prompt with TRL's forward")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    cfg = TRLSearchConfig(num_generations=4, prompts_per_step=1, max_steps=1, beta=0.0, max_completion_length=128,
                          micro_batch_size=4, lora_rank=args.lora or None, precision="fp32", algorithm="dr_grpo")

    def never(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("no rollout here")

    def reward(completions: list, **_k: Any) -> list[float]:
        return [0.0] * len(completions)

    out_dir = tempfile.TemporaryDirectory(prefix="loss_budget_check-")  # the trainer's output_dir; nothing is saved
    trainer = build_trainer(cfg, args.model, [{"prompt": "q"}], [reward], never, out_dir.name)
    trainer.model.train()
    b = _batch(trainer.model.config.vocab_size)
    whole_width = b["prompt_ids"].size(1) + b["completion_ids"].size(1)

    def flat_grad() -> Any:
        return torch.cat([p.grad.flatten().float() for p in trainer.model.parameters() if p.grad is not None])

    def grads(budget: int | None, bf16: bool, shared: bool = False) -> Any:
        trainer.model.zero_grad(set_to_none=True)
        trainer.share_prompt = shared
        trainer.loss_token_budget, trainer.current_gradient_accumulation_steps = budget, 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = trainer._compute_loss(trainer.model, b)
        loss.backward()
        return flat_grad()

    def trainer_path(budget: int | None, ga: int = 4) -> Any:
        trainer.model.zero_grad(set_to_none=True)
        trainer.loss_token_budget, trainer.current_gradient_accumulation_steps = budget, ga
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(trainer.model, b)
        trainer.accelerator.backward(loss / ga)  # what Trainer.training_step does with the returned loss
        return flat_grad()

    def rel(a: Any, ref: Any) -> str:
        return f"{((a - ref).norm() / ref.norm()).item():.2e}"

    parts = [len(rows) for rows, _ in loss_parts(b, args.budget)]
    lines = [f"model {args.model}, LoRA rank {args.lora}, 4 rows padded to {whole_width} tokens, budget "
             f"{args.budget}: parts of {parts} rows; torch {torch.__version__}, {torch.get_num_threads()} threads"]
    big = whole_width * len(b["advantages"]) * 4  # one part: the trimmed whole batch
    for label in ("mixed advantages", "cancelling advantages"):
        if label.startswith("cancelling"):
            b["advantages"] = torch.tensor([0.5, -0.5, 0.5, -0.5])
            b["completion_ids"][1], b["completion_ids"][3] = b["completion_ids"][0], b["completion_ids"][2]
        for bf16 in (False, True):
            whole, part, trimmed = grads(None, bf16), grads(args.budget, bf16), grads(big, bf16)
            lines.append(f"{label}, {'bf16 autocast' if bf16 else 'fp32'}: |g| whole {whole.norm():.5f}; relative "
                         f"difference to the whole batch: parts {rel(part, whole)}, trimmed {rel(trimmed, whole)}; "
                         f"parts vs trimmed {rel(part, trimmed)}")
    lines.append(f"the Trainer's path (fp32, 4 accumulation steps): parts vs whole "
                 f"{rel(trainer_path(args.budget), trainer_path(None))}")
    lines.append(f"bf16 whole batch twice: {rel(grads(None, True), grads(None, True))} (deterministic kernels)")
    if args.share_prompt:
        b["prompt_ids"][:], b["prompt_mask"][:] = b["prompt_ids"][2], b["prompt_mask"][2]  # one prompt, 230 tokens
        b["advantages"] = torch.tensor([0.5, -0.3, 0.8, -1.0])
        for bf16 in (False, True):
            plain, shared = grads(args.budget, bf16), grads(args.budget, bf16, shared=True)
            lines.append(f"one shared prompt, {'bf16 autocast' if bf16 else 'fp32'}, budget {args.budget}: |g| "
                         f"{plain.norm():.5f}; share_prompt vs TRL's forward {rel(shared, plain)}; parts "
                         f"{[len(r) for r, _ in loss_parts(b, args.budget, shared_prompt=True)]} rows shared, "
                         f"{[len(r) for r, _ in loss_parts(b, args.budget)]} plain")
    for line in lines:
        print(line, flush=True)
    out_dir.cleanup()
    return lines


if __name__ == "__main__":
    main()
