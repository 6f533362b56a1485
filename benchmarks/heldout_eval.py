"""Held-out evaluation speed of an RL learning preset (issue 26 item 2): today's settings against candidates, one run.

The workload is the preset's own held-out evaluation (``training.rl.heldout``: its questions, protocol, retriever
over ``eval.corpus``, greedy rollouts with its turn and token budgets), cut to ``--limit`` questions taken evenly
from the 210. Each variant changes only the generator's settings and runs the same questions:

- ``today``: ``eval.generator`` as the preset has it (the baseline, measured in the same run);
- ``batch64``: 64 prompts per forward batch (the rollout loop already sorts each call's prompts into length
  buckets; a bigger batch fills the cores better when turns are short);
- ``chunk64`` / ``batch64_chunk64``: today's generator (or batch 64) with the questions rolled out 64 at a time
  through all their turns (``RolloutConfig.chunk``): the prefix KV cache (65,536 tokens) then still holds each
  row's keys at its second turn, where rolling out the whole set at once evicts most of them first;
- ``chunk64_cache16k``: ``chunk64`` with the prefix KV store bounded at 16,384 tokens instead of 65,536 (issue 26
  item 4: the bound is ~1.5 GB of bf16 keys and values for SmolLM2-135M; a chunk of 64 rows needs far less);
- ``fp32``: float32 weights — the numerical reference: with ``dtype: auto`` the preset runs bf16 where the CPU has
  native bf16 (avx512_bf16 / amx), and this variant says how many greedy answers bf16 changes;
- ``vllm``: the offline vLLM engine in ``.venv-vllm`` (skipped without it);
- ``sdpa_steps`` / ``fp32_sdpa_steps``: today's settings (bf16 / fp32) with sdpa attention at every decode step, as
  the engine ran before it switched decode steps to eager attention on CPU (``training.generation.decode``);
- ``eager_steps`` / ``fp32_eager_steps``: today's settings (bf16 / fp32) with transformers' eager attention at
  every decode step, as the engine ran from session 15 until session 30 switched decode steps to grouped attention
  (``training.generation.attention``); ``fp32`` against ``fp32_eager_steps`` is the grouped steps' numerical check;
- ``mask_steps``: today's settings with transformers building each decode step's 4-D mask from the 2-D one, as the
  engine ran until session 35 (``training.generation.decode.STEP_MASK``; the answers are identical);
- ``session14``: the evaluation as the CLI ran it until session 15: sdpa decode steps and glibc's mmap threshold
  fixed at 128 KiB (``infra.memory``). The threshold cannot be unset, so this variant must come last; and since
  glibc still serves large requests from heap memory the earlier variants freed, it understates the old cost (a
  fresh process: 68.6 s vs 36.3 s on the demo preset, docs/results/engines/cpu_session15.md);
- ``trained``: today's settings with the threshold fixed at 128 KiB by ``infra.memory.fix_mmap_threshold``, as an RL
  flow's final evaluation ran until session 22 (its training had fixed the threshold for the process);
  ``trained_heap``: the same inside ``infra.memory.inference_heap``, as that evaluation runs now. Both fix the
  threshold for the process, so they come after every other variant (``--isolate``: each in its own process).
  ``trained_heap_thp`` / ``thp``: ``trained_heap`` / ``today`` in a process started with PyTorch's
  ``THP_MEM_ALLOC_ENABLE=1`` (tensors of 2 MiB and more as transparent huge pages; ``--isolate`` only: the variable
  is read once per process).
  ``trained_heap_no_growth_trim``: ``trained_heap`` without ``infra.memory.trim_on_growth`` (the start and final
  evaluations of an RL flow until session 23); ``no_growth_trim``: ``today`` without it. Their peak RSS against
  ``trained_heap`` / ``today`` is issue 26 item 4's before/after for an evaluation.

Printed per variant: peak RSS (meaningful with ``--isolate``: each variant's own process), seconds,
trajectories/s, generated tokens/s, the ratio to ``today`` (target: >= 2x with identical greedy outputs), and how
many final answers and token streams equal ``today``'s (and ``fp32``'s), with the machine record (dtype, CPU flags,
threads, load). Example (quiet machine, about 10 minutes)::

    PYTHONPATH=. python benchmarks/heldout_eval.py --preset searchr1_learn_cpu --limit 60 \\
        --variants today,fp32,session14 --out docs/results/engines/heldout_eval.md

``--isolate`` runs every variant in a fresh process (``session14`` then pays the old CLI's full cost: the threshold
is set through ``MALLOC_MMAP_THRESHOLD_`` before the first allocation), so the before/after of item 2 is one run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("today", "batch64", "chunk64", "batch64_chunk64", "chunk64_cache16k", "fp32", "vllm", "sdpa_steps",
            "fp32_sdpa_steps", "eager_steps", "fp32_eager_steps", "no_growth_trim", "trained", "trained_heap",
            "trained_heap_no_growth_trim", "session14", "thp", "trained_heap_thp", "mask_steps")
#: variants that fix glibc's mmap threshold for the rest of the process (they come last)
FIXING = ("trained", "trained_heap", "trained_heap_no_growth_trim", "session14", "trained_heap_thp")
#: variants whose process starts with ``THP_MEM_ALLOC_ENABLE=1`` (``--isolate`` only)
THP = ("thp", "trained_heap_thp")
#: variants without ``infra.memory.trim_on_growth`` (the engine until session 23)
NO_GROWTH_TRIM = ("no_growth_trim", "trained_heap_no_growth_trim")
#: variants that roll the questions out 64 at a time through all their turns (``RolloutConfig.chunk``)
CHUNKED = ("chunk64", "batch64_chunk64", "chunk64_cache16k")
#: variants whose prefix KV store keeps at most this many tokens (the engine's default is 65,536: ~1.5 GB in bf16)
CACHE_TOKENS = {"chunk64_cache16k": 16_384}
#: variants that decode with sdpa attention at every step (the engine before session 15's eager decode steps)
SDPA_STEPS = ("sdpa_steps", "fp32_sdpa_steps", "session14")
#: variants whose decode steps run transformers' eager attention (the default from session 15 to 30)
EAGER_STEPS = ("eager_steps", "fp32_eager_steps")


def variant_generator(base: Any, name: str) -> Any | None:
    """The generator spec of a variant (``today`` is the preset's); None when it cannot run here."""
    if base.backend == "auto":  # the transformers engine is the baseline, whatever `auto` would pick here
        base = base.model_copy(update={"backend": "transformers"})
    if name == "today":
        return base
    if name in ("batch64", "batch64_chunk64"):
        return base.model_copy(update={"batch_size": 64})
    if name in ("chunk64", "chunk64_cache16k"):
        return base
    if name in ("fp32", "fp32_sdpa_steps", "fp32_eager_steps"):
        return base.model_copy(update={"dtype": "float32"})
    if name in ("sdpa_steps", "eager_steps", "session14", "trained", "trained_heap", "no_growth_trim",
                "trained_heap_no_growth_trim", "mask_steps", *THP):
        return base
    if name == "vllm":
        if not (REPO / ".venv-vllm" / "bin" / "python").exists():
            return None
        return base.model_copy(update={"backend": "vllm"})
    raise SystemExit(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")


def spread(items: list[Any], n: int) -> list[Any]:
    """``n`` items taken evenly across ``items`` (all of them when n >= len)."""
    if n >= len(items):
        return list(items)
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)] if n > 1 else items[:1]


def run_variant(name: str, spec: Any, ecfg: Any, questions: list[Any], searcher: Any) -> dict[str, Any]:
    """Load the variant's generator (not timed), roll out once, return timings and the trajectories."""
    from training.agent.evaluate import open_generator
    from training.agent.rollout import run_rollouts
    from training.generation import decode

    if name in CHUNKED:
        ecfg = ecfg.model_copy(update={"rollout": ecfg.rollout.model_copy(update={"chunk": 64})})
    t0 = time.perf_counter()
    generator = open_generator(spec)
    load_s = time.perf_counter() - t0
    store = getattr(generator, "prefix_cache", None)
    if name in CACHE_TOKENS and store is not None:
        store.max_tokens = CACHE_TOKENS[name]
    import infra.memory

    if name in FIXING:  # the CLI until session 15, and an RL flow after its training (irreversible)
        infra.memory.fix_mmap_threshold(infra.memory.DEFAULT_THRESHOLD)
    decode.DECODE_STEP_ATTENTION = "sdpa" if name in SDPA_STEPS else "eager" if name in EAGER_STEPS else "grouped"
    decode.STEP_MASK = "transformers" if name == "mask_steps" else "additive"
    infra.memory.INFERENCE_HEAP = name.startswith("trained_heap")  # a no-op where the threshold is not fixed
    growth_trim = infra.memory.GROWTH_TRIM_BYTES
    if name in NO_GROWTH_TRIM:
        infra.memory.GROWTH_TRIM_BYTES = 0
    try:
        with infra.memory.inference_heap():
            run_rollouts(questions[:2], ecfg.protocol, generator, searcher, ecfg.rollout)  # warm-up: kernels, caches
            t0 = time.perf_counter()
            trajs = run_rollouts(questions, ecfg.protocol, generator, searcher, ecfg.rollout)
            seconds = time.perf_counter() - t0
    finally:
        decode.DECODE_STEP_ATTENTION = "grouped"
        decode.STEP_MASK = "additive"
        infra.memory.INFERENCE_HEAP = True
        infra.memory.GROWTH_TRIM_BYTES = growth_trim
    close = getattr(generator, "close", None)
    if close is not None:
        close()
    tokens = sum(sum(t.loss_mask) for t in trajs)  # generated (trained-on) tokens of the responses
    from infra.memory import peak_rss

    return {"variant": name, "load_s": load_s, "seconds": seconds, "trajs": trajs, "tokens": tokens,
            "dtype": spec.dtype, "batch_size": spec.batch_size, "backend": spec.backend,
            "chunk": ecfg.rollout.chunk, "peak_rss_gb": peak_rss()["self"]}


def same(a: list[Any], b: list[Any]) -> tuple[int, int]:
    """(equal final answers, equal responses) between two runs of the same questions."""
    return (sum(x.final_answer == y.final_answer for x, y in zip(a, b, strict=True)),
            sum(x.response == y.response for x, y in zip(a, b, strict=True)))


def report(results: list[dict[str, Any]], machine: dict[str, Any], n: int) -> str:
    """The markdown table: per variant its time, rates, ratio to ``today`` and agreement with ``today``/``fp32``."""
    base = results[0]
    ref = next((r for r in results if r["variant"] == "fp32"), None)
    lines = [f"Held-out evaluation, {n} questions, machine: {json.dumps(machine)}", "",
             "| variant | backend | dtype | batch | chunk | load s | eval s | traj/s | gen tok/s | x today | "
             "same answers as today | same responses as today | same answers as fp32 | peak RSS GB |",
             "|---" * 14 + "|"]
    for r in results:
        ans, resp = same(base["trajs"], r["trajs"])
        vs32 = f"{same(ref['trajs'], r['trajs'])[0]}/{n}" if ref is not None else "-"
        lines.append(f"| {r['variant']} | {r['backend']} | {r['dtype']} | {r['batch_size']} | "
                     f"{r.get('chunk') or 'all'} | {r['load_s']:.1f} | "
                     f"{r['seconds']:.1f} | {n / r['seconds']:.3f} | {r['tokens'] / r['seconds']:.1f} | "
                     f"{base['seconds'] / r['seconds']:.2f}x | "
                     f"{ans}/{n} | {resp}/{n} | {vs32} | {r.get('peak_rss_gb', float('nan')):.2f} |")
    return "\n".join(lines)


def record(results: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """``--record``: each engine's start and per-question time (``today`` = transformers, ``vllm``) ->
    ``<home>/engine_choice.json``, what ``backend: auto`` weighs for a caller's question count."""
    from training.generation.choice import record_choice

    by = {r["variant"]: r for r in results}
    if "today" not in by or "vllm" not in by:
        print("--record needs both today and vllm measured (vllm needs .venv-vllm: make vllm-env)", file=sys.stderr)
        return 2
    n = len(by["today"]["trajs"])
    costs = {engine: {"load_s": round(by[v]["load_s"], 2), "per_item_s": round(by[v]["seconds"] / n, 4)}
             for engine, v in (("transformers", "today"), ("vllm", "vllm"))}
    answers = same(by["today"]["trajs"], by["vllm"]["trajs"])[0]
    path = record_choice(costs, n, note=f"benchmarks/heldout_eval.py --preset {args.preset}: {n} held-out "
                         f"questions; same final answers {answers}/{n}")
    print(f"recorded engine costs for this machine in {path}: {costs}")
    return 0


def run_isolated(name: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """Run one variant in a fresh process (this script with ``--child-out``); its result with plain trajectories.
    ``session14`` starts with glibc's mmap threshold fixed through the environment, from the first allocation."""
    import os
    import subprocess
    import tempfile
    from types import SimpleNamespace

    cmd = [sys.executable, str(Path(__file__).resolve()), "--preset", args.preset, "--limit", str(args.limit),
           "--variants", name]
    if args.model:
        cmd += ["--model", args.model]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if name == "session14":
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    if name in THP:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        subprocess.run([*cmd, "--child-out", str(out)], check=True, env=env)
        rows = json.loads(out.read_text())
    if not rows:
        return None
    r = rows[0]
    r["trajs"] = [SimpleNamespace(**t) for t in r["trajs"]]
    return r


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from flows.specs import resolve
    from infra.machine import describe
    from training.agent.evaluate import open_searcher
    from training.generation.models import resolve_policy
    from training.rl.heldout import eval_config, heldout_questions

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="searchr1_learn_cpu", help="an rl-finetune preset with eval.benchmarks")
    parser.add_argument("--model", default=None, help="policy to evaluate (default: the preset's base model)")
    parser.add_argument("--limit", type=int, default=60, help="held-out questions, spread over the preset's set")
    parser.add_argument("--variants", default="today,batch64,fp32", help=f"comma list from {VARIANTS}; today first")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the transformers variants")
    parser.add_argument("--out", default=None, help="also write the markdown report here")
    parser.add_argument("--isolate", action="store_true", help="run each variant in a fresh process (session14 "
                        "there starts with MALLOC_MMAP_THRESHOLD_=131072, as the old CLI ran: its full cost)")
    parser.add_argument("--record", action="store_true", help="write the start and per-question times of today "
                        "(transformers) and vllm to <home>/engine_choice.json for this machine: what `backend: auto` "
                        "weighs (training/generation/choice.py); needs both variants")
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)  # one variant, results as JSON
    args = parser.parse_args(argv)

    cfg = resolve("rl-finetune", args.preset, [])
    ecfg = eval_config(cfg, resolve_policy(args.model or cfg.model))
    if args.threads is not None:
        ecfg = ecfg.model_copy(update={"generator": ecfg.generator.model_copy(update={"threads": args.threads})})
    names = [v for v in args.variants.split(",") if v]
    if args.isolate and args.child_out is None:
        if not names or names[0] != "today":
            raise SystemExit("--variants must start with today (the baseline of the ratios)")
        results = [run_isolated(name, args) for name in names]
        results = [r for r in results if r is not None]
        machine = describe(dtype=ecfg.generator.dtype, preset=args.preset, questions=args.limit, isolated=True,
                           max_new_tokens=ecfg.rollout.max_total_tokens, max_turns=ecfg.rollout.max_turns,
                           top_k=ecfg.rollout.top_k)
        text = report(results, machine, len(results[0]["trajs"]))
        print(text)
        if args.out:
            Path(args.out).write_text(text + "\n")
        return record(results, args) if args.record else 0
    if args.child_out is not None:
        pass
    elif not names or names[0] != "today":
        raise SystemExit("--variants must start with today (the baseline of the ratios)")
    if args.child_out is None and not args.isolate and set(names) & set(THP):
        raise SystemExit(f"--variants: {', '.join(n for n in names if n in THP)} start their process with "
                         "THP_MEM_ALLOC_ENABLE=1: add --isolate")
    fixing = [i for i, n in enumerate(names) if n in FIXING]
    if args.child_out is None and not args.isolate and fixing and fixing != list(range(len(names) - len(fixing),
                                                                                      len(names))):
        raise SystemExit(f"--variants: {', '.join(n for n in names if n in FIXING)} must come last (they fix glibc's "
                         "mmap threshold for the process), or use --isolate")
    questions = spread(heldout_questions(cfg), args.limit)
    searcher = open_searcher(ecfg.retrieval)
    results = []
    for name in names:
        spec = variant_generator(ecfg.generator, name)
        if spec is None:
            print(f"{name}: skipped (.venv-vllm not built: make vllm-env)", file=sys.stderr)
            continue
        print(f"{name}: running {len(questions)} questions ...", file=sys.stderr, flush=True)
        results.append(run_variant(name, spec, ecfg, questions, searcher))
    if args.child_out is not None:
        Path(args.child_out).write_text(json.dumps([{
            **{k: v for k, v in r.items() if k != "trajs"},
            "trajs": [{"final_answer": t.final_answer, "response": t.response} for t in r["trajs"]]}
            for r in results]))
        return 0
    machine = describe(dtype=ecfg.generator.dtype, preset=args.preset, questions=len(questions),
                       max_new_tokens=ecfg.rollout.max_total_tokens, max_turns=ecfg.rollout.max_turns,
                       top_k=ecfg.rollout.top_k)
    text = report(results, machine, len(questions))
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return record(results, args) if args.record else 0


if __name__ == "__main__":
    raise SystemExit(main())
