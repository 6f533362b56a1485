"""Greedy parity of the engines on the same prompts: transformers vs offline vLLM vs served vLLM.

Each engine generates greedily (``max_tokens`` new tokens, no stop strings) for the same chat prompts (the first
``--questions`` questions of the minis under a protocol's prompt). Pairs of engines are compared token by token:
identical sequences, and for the others where the first difference falls. bf16 matmuls on different kernels
(oneDNN in vLLM, PyTorch's in transformers) can flip a near-tie argmax; after the first flip the texts diverge,
so the table reports the share of sequences that are identical and the mean first-divergence position, and checks
that each divergence is a near tie (the transformers engine's top-2 log-probability gap at that position, printed
when ``--gaps``). All engines use the same tokenizer files (``training.generation.models``), so ids are comparable.

Usage: ``PYTHONPATH=. python benchmarks/engine_parity.py --questions 50 --json parity.json`` (needs
``make vllm-env``); ``--engines transformers,vllm --questions 4`` for a quick check.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout import _questions  # noqa: E402

ENGINES = ("transformers", "vllm", "vllm_served")


def _generate(engine: str, path: str, prompts: list[str], args: argparse.Namespace) -> tuple[list[list[int]], float]:
    from training.generation.base import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    if engine == "transformers":
        from training.generation.hf import TransformersGenerator

        gen: Any = TransformersGenerator.from_model(path, device="cpu", threads=args.threads, batch_size=64,
                                                    dtype=args.dtype)
        close = lambda: None  # noqa: E731
    elif engine == "vllm":
        from training.generation.vllm_worker import VLLMWorkerGenerator

        gen = VLLMWorkerGenerator.from_model(path, max_model_len=2048, dtype=args.dtype)
        close = getattr(gen, "close", lambda: None)
    else:
        from training.generation.models import load_tokenizer
        from training.generation.openai_client import OpenAICompatibleGenerator
        from training.generation.vllm_server import VLLMServer, VLLMServerConfig

        server = VLLMServer(path, VLLMServerConfig(port=0, served_name="parity", max_model_len=2048,
                                                   dtype=args.dtype)).start()
        gen = OpenAICompatibleGenerator(server.base_url, "parity", tokenizer=load_tokenizer(path), timeout=3600)
        close = server.stop
    try:
        t0 = time.perf_counter()
        out = gen.generate(prompts, sampling)
        secs = time.perf_counter() - t0
    finally:
        close()
    return [list(c.token_ids) for c in out], secs


def _first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _gaps(path: str, prompts: list[str], ref: list[list[int]], positions: list[int | None]) -> list[float | None]:
    """Top-2 log-prob gap of the transformers model (fp32) at each first divergence (None where none)."""
    import torch

    from training.generation.models import load_model

    model, tok = load_model(path, device="cpu", dtype="float32")
    out: list[float | None] = []
    for p, ids, pos in zip(prompts, ref, positions, strict=True):
        if pos is None:
            out.append(None)
            continue
        x = tok(p, add_special_tokens=False)["input_ids"] + ids[:pos]
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([x])).logits[0, -1].float()
        top = torch.topk(torch.log_softmax(logits, -1), 2).values
        out.append(float(top[0] - top[1]))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--questions", type=int, default=50)
    parser.add_argument("--dataset", default="all")
    parser.add_argument("--protocol", default="exsearch")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="auto",
                        help="same dtype for every engine; auto = bf16 with native bf16 matmuls, else float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gaps", action="store_true", help="top-2 log-prob gap at each divergence (fp32)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.dtype == "auto":
        from training.generation.base import cpu_dtype

        args.dtype = cpu_dtype()
    from training.generation.models import load_tokenizer, resolve_model
    from training.protocols.base import load_protocol

    path = str(resolve_model(args.model))
    tok, proto = load_tokenizer(path), load_protocol(args.protocol)
    prompts = [proto.build_prompt(q.question, tok) for q in _questions(args.dataset, args.questions)]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    ids, secs = {}, {}
    for e in engines:
        ids[e], secs[e] = _generate(e, path, prompts, args)
    rows = []
    for a, b in itertools.combinations(engines, 2):
        firsts = [_first_diff(x, y) for x, y in zip(ids[a], ids[b], strict=True)]
        diverged = [f for f in firsts if f is not None]
        row = {"pair": f"{a} vs {b}", "identical": len(firsts) - len(diverged), "n": len(firsts),
               "identical_rate": (len(firsts) - len(diverged)) / len(firsts),
               "mean_first_divergence": sum(diverged) / len(diverged) if diverged else None}
        if args.gaps and a == "transformers":
            gaps = [g for g in _gaps(path, prompts, ids[a], firsts) if g is not None]
            row["divergence_top2_gaps"] = gaps
        rows.append(row)
    print(f"{len(prompts)} prompts ({args.protocol}), greedy, {args.max_tokens} tokens, {args.dtype}")
    for e in engines:
        print(f"  {e}: {secs[e]:.1f} s")
    for r in rows:
        mfd = "-" if r["mean_first_divergence"] is None else f"{r['mean_first_divergence']:.1f}"
        print(f"{r['pair']:<28} identical {r['identical']}/{r['n']} ({100 * r['identical_rate']:.0f}%), "
              f"mean first divergence at token {mfd}")
        if "divergence_top2_gaps" in r and r["divergence_top2_gaps"]:
            g = sorted(r["divergence_top2_gaps"])
            print(f"    top-2 log-prob gap at divergences: median {g[len(g) // 2]:.3f}, max {g[-1]:.3f}")
    res = {"args": vars(args), "seconds": secs, "pairs": rows}
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    return res


if __name__ == "__main__":  # the vLLM worker spawns processes: keep the entry guarded
    main()
