"""The rollout workload through three engines in one run: transformers, offline vLLM and served vLLM.

Same questions (default: all 200 of the four minis, one batch), same protocol (ReSearch primed with ``<search>``,
as ``benchmarks/rollout.py``), same budgets and in-process BM25; greedy. Engines:

- ``transformers``: our batched HF engine in this process (bf16 where the CPU has native bf16, prefix KV cache);
- ``vllm``: the offline ``vllm.LLM`` engine in ``.venv-vllm`` (``training.generation.vllm_worker``);
- ``vllm_served``: vLLM's OpenAI-compatible server from ``.venv-vllm`` driven by our ``openai`` backend.

Engine load time is reported apart and not counted; each engine rolls out once to warm up (``--warmup``
questions) and then the measured run. Prints seconds, generated tokens, tokens/s, trajectories/s and the ratios
against transformers; ``--json`` writes them. Greedy bf16 paths differ between engines (tie-breaking), so token
counts differ slightly: compare per-token rates.

Usage: ``PYTHONPATH=. python benchmarks/rollout_engines.py --threads 2`` (needs ``make vllm-env``);
``--questions 8 --dataset hotpotqa --engines transformers,vllm`` for a quick check.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout import _protocol, _questions, _searcher, _tokens  # noqa: E402

ENGINES = ("transformers", "vllm", "vllm_served")


def _open(engine: str, model: str, threads: int, max_model_len: int) -> tuple[Any, Any]:
    """(generator, closer) for one engine; the closer releases its process or server."""
    from training.generation.models import load_tokenizer, resolve_model

    path = str(resolve_model(model))
    if engine == "transformers":
        from training.generation.hf import TransformersGenerator

        gen = TransformersGenerator.from_model(path, device="cpu", threads=threads, batch_size=256)
        return gen, lambda: None
    if engine == "vllm":
        from training.generation.vllm_worker import VLLMWorkerGenerator

        gen = VLLMWorkerGenerator.from_model(path, max_model_len=max_model_len)
        return gen, getattr(gen, "close", lambda: None)
    from training.generation.openai_client import OpenAICompatibleGenerator
    from training.generation.vllm_server import VLLMServer, VLLMServerConfig

    server = VLLMServer(path, VLLMServerConfig(port=0, served_name="bench", max_model_len=max_model_len)).start()
    gen = OpenAICompatibleGenerator(server.base_url, "bench", tokenizer=load_tokenizer(path), timeout=3600)
    return gen, server.stop


def run_engine(engine: str, args: argparse.Namespace, questions: list[Any], searcher: Any) -> dict[str, float]:
    """Load, warm up, then time one batched rollout of ``questions``."""
    from training.agent.rollout import RolloutConfig, run_rollouts

    cfg = RolloutConfig(max_tokens_per_turn=args.tokens_per_turn, max_total_tokens=args.total_tokens)
    t0 = time.perf_counter()
    gen, close = _open(engine, args.model, args.threads, args.max_model_len)
    load = time.perf_counter() - t0
    try:
        if args.warmup:
            run_rollouts(questions[: args.warmup], _protocol(args.protocol, not args.no_prime), gen, searcher, cfg)
        t1 = time.perf_counter()
        trajs = run_rollouts(questions, _protocol(args.protocol, not args.no_prime), gen, searcher, cfg)
        secs = time.perf_counter() - t1
    finally:
        close()
    tokens = _tokens(trajs)
    return {"load_s": load, "seconds": secs, "tokens": tokens, "tokens_per_s": tokens / secs,
            "trajectories_per_s": len(trajs) / secs, "searches": sum(t.n_searches for t in trajs)}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma list of {', '.join(ENGINES)}")
    parser.add_argument("--questions", type=int, default=None, help="first N questions (default: all)")
    parser.add_argument("--dataset", default="all", help="a mini, a comma list of minis, or all (the four)")
    parser.add_argument("--protocol", default="research")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the transformers engine")
    parser.add_argument("--tokens-per-turn", type=int, default=128)
    parser.add_argument("--total-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=4096, help="vLLM context length")
    parser.add_argument("--warmup", type=int, default=4, help="questions rolled out once before timing (0: none)")
    parser.add_argument("--url", default=None, help="retriever server URL (default: in-process BM25 on the mini)")
    parser.add_argument("--no-prime", action="store_true")
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engines {unknown}; choose from {', '.join(ENGINES)}")
    questions, searcher = _questions(args.dataset, args.questions), _searcher(args.url)
    res = {e: run_engine(e, args, questions, searcher) for e in engines}
    base = res.get("transformers")
    from infra.machine import describe
    from training.generation.base import cpu_dtype

    machine = describe(cpu_dtype(), questions=len(questions), protocol=args.protocol,
                       tokens_per_turn=args.tokens_per_turn, total_tokens=args.total_tokens)
    print(f"machine: {orjson.dumps(machine).decode()}")
    print(f"{len(questions)} questions, protocol {args.protocol}, {args.tokens_per_turn}/{args.total_tokens} tokens")
    print(f"{'engine':<14}{'load s':>8}{'seconds':>9}{'tokens':>8}{'tok/s':>9}{'traj/s':>8}"
          f"{'x tok/s':>9}{'x traj/s':>9}")
    for e, r in res.items():
        rt = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}" if base else "-"
        rj = f"{r['trajectories_per_s'] / base['trajectories_per_s']:.2f}" if base else "-"
        print(f"{e:<14}{r['load_s']:>8.1f}{r['seconds']:>9.1f}{r['tokens']:>8.0f}{r['tokens_per_s']:>9.1f}"
              f"{r['trajectories_per_s']:>8.2f}{rt:>9}{rj:>9}")
    if args.json:
        record = {"args": vars(args), "machine": machine, "results": res}
        Path(args.json).write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    return res


if __name__ == "__main__":  # the vLLM worker spawns processes: keep the entry guarded
    main()
