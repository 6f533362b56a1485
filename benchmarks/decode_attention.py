"""Attention implementation per phase on CPU: sdpa, eager and grouped for prefill and KV-cached decode steps, one run.

Why ``training.generation.decode.step_attention`` runs decode steps with grouped attention
(``training.generation.attention``: the query heads that share a key/value head as one matrix product, no copy of
the cache) on CPU and prefill with sdpa. For each shape (batch, prompt length, left padding on half the rows or
none) and each implementation, one prefill then ``--steps`` greedy decode steps with a ``DynamicCache``, timed after
a warm-up; the same model weights in every implementation. Prints milliseconds per phase, the ratios sdpa / eager
and eager / grouped (the speed-up of grouped steps over eager ones), and whether the greedy token streams agree with
eager's (in bf16 near-ties may flip; ``--dtype float32`` is the numerical check), with the machine record (dtype,
CPU flags, threads, load).

    PYTHONPATH=. python benchmarks/decode_attention.py --model <HF folder> --dtype bfloat16 \\
        --out docs/results/engines/decode_attention.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHAPES = ((1, 600, False), (16, 600, False), (16, 600, True), (64, 300, True))


def run_shape(model: Any, impl: str, batch: int, prompt: int, pad: bool, steps: int) -> dict[str, Any]:
    """Prefill + ``steps`` greedy decode steps with ``impl`` attention; seconds per phase and the tokens."""
    import torch
    from transformers import DynamicCache

    model.config._attn_implementation = impl
    gen = torch.Generator().manual_seed(batch * 1000 + prompt)
    ids = torch.randint(100, 20000, (batch, prompt), generator=gen)
    mask = torch.ones(batch, prompt, dtype=torch.long)
    if pad:
        mask[: batch // 2, : prompt // 3] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        cache = DynamicCache()
        t0 = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - t0
        last = positions[:, -1]
        tokens = out.logits[:, -1].argmax(-1)
        stream = [tokens.tolist()]
        t0 = time.perf_counter()
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
            last = last + 1
            out = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=last[:, None],
                        past_key_values=cache, use_cache=True)
            tokens = out.logits[:, -1].argmax(-1)
            stream.append(tokens.tolist())
        decode = time.perf_counter() - t0
    return {"prefill_s": prefill, "step_ms": 1000 * decode / steps, "tokens": list(zip(*stream, strict=True))}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    import torch
    from transformers import AutoModelForCausalLM

    from infra.machine import describe
    from training.generation.attention import register
    from training.generation.models import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="HF folder (default: the library's SmolLM2-135M)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--steps", type=int, default=32, help="decode steps per shape")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the markdown report here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    path = args.model or str(resolve_model("smollm2"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype),
                                                 attn_implementation="sdpa").eval()
    machine = describe(args.dtype, model=Path(path).name, steps=args.steps)
    grouped = register()
    impls = ("sdpa", "eager", grouped)
    for impl in impls:  # warm-up of every path's kernels
        run_shape(model, impl, 2, 64, True, 2)
    lines = [f"Attention per phase, machine: {json.dumps(machine)}", "",
             "| batch | prompt | left padding | prefill sdpa s | prefill eager s | sdpa / eager (prefill) | "
             "step sdpa ms | step eager ms | step grouped ms | sdpa / eager (step) | eager / grouped (step) | "
             "same greedy rows as eager: sdpa, grouped |", "|---" * 12 + "|"]
    for batch, prompt, pad in SHAPES:
        r = {impl: run_shape(model, impl, batch, prompt, pad, args.steps) for impl in impls}
        same = [sum(a == b for a, b in zip(r[impl]["tokens"], r["eager"]["tokens"], strict=True))
                for impl in ("sdpa", grouped)]
        lines.append(f"| {batch} | {prompt} | {'half the rows' if pad else 'none'} | "
                     f"{r['sdpa']['prefill_s']:.2f} | {r['eager']['prefill_s']:.2f} | "
                     f"{r['sdpa']['prefill_s'] / r['eager']['prefill_s']:.2f} | {r['sdpa']['step_ms']:.1f} | "
                     f"{r['eager']['step_ms']:.1f} | {r[grouped]['step_ms']:.1f} | "
                     f"{r['sdpa']['step_ms'] / r['eager']['step_ms']:.2f} | "
                     f"{r['eager']['step_ms'] / r[grouped]['step_ms']:.2f} | "
                     f"{same[0]}/{batch}, {same[1]}/{batch} |")
        print(lines[-1], flush=True)
    model.config._attn_implementation = "sdpa"
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
