"""The two per-step costs session 35 removed from sampled decode steps, each against what it replaced, in one run.

1. Drawing one token per row: ``torch.multinomial(probs, 1)`` against ``training.generation.decode.sample_rows``
   (inverse CDF at one uniform draw per row), on ``[rows, vocab]`` probabilities (SmolLM2's 49,152 tokens).
2. The 4-D additive mask of a one-token decode step: transformers' ``eager_mask`` (what the model built from the 2-D
   mask each step) against ``training.generation.decode.additive_mask``; the two are checked equal first.

Prints milliseconds per call and the ratio old / new for each, with torch's threads, dtype and the CPU flags. The
whole-step effect is measured by ``benchmarks/grpo_step.py --variants today,old_steps`` (rollouts) and
``benchmarks/heldout_eval.py --variants today,mask_steps`` (greedy evaluation).

Usage: ``PYTHONPATH=. python benchmarks/decode_step_parts.py --threads 2`` (under a minute).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any


def per_call_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Mean milliseconds of ``fn`` over ``repeats`` calls after three warm-up calls."""
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats * 1000


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers.masking_utils import eager_mask

    from infra.machine import cpu_flags
    from training.generation.decode import additive_mask, sample_rows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=49_152)
    ap.add_argument("--keys", type=int, default=400, help="cached keys of the decode step (its mask's width)")
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(args.rows, args.vocab) * 3, dim=-1)
    mask = torch.ones(args.rows, args.keys, dtype=torch.long)
    mask[: args.rows // 2, : args.keys // 4] = 0  # left padding on half the rows
    dtype = torch.bfloat16

    def theirs() -> Any:
        return eager_mask(batch_size=args.rows, cache_position=torch.tensor([args.keys - 1]), kv_length=args.keys,
                          attention_mask=mask.bool(), dtype=dtype)

    if not torch.equal(theirs(), additive_mask(mask, dtype)):
        raise SystemExit("additive_mask differs from transformers' eager_mask: the comparison would be meaningless")
    rows = [("draw a token per row", lambda: torch.multinomial(probs, 1), lambda: sample_rows(probs)),
            ("decode step mask", theirs, lambda: additive_mask(mask, dtype))]
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx512_bf16", "amx", "avx512_vnni")))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU flags {flags}; {args.rows} rows, "
          f"vocabulary {args.vocab}, {args.keys} keys, mask dtype {dtype}")
    print("| part | before (ms) | now (ms) | before / now |")
    print("|---|---|---|---|")
    for name, old, new in rows:
        a, b = per_call_ms(old, args.repeats), per_call_ms(new, args.repeats)
        print(f"| {name} | {a:.2f} | {b:.3f} | {a / b:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
