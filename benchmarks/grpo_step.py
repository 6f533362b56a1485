"""One GRPO step of a learning preset, profiled part by part, against cheaper engine settings in the same run.

For the preset's first stage (``flows/configs/<preset>.yaml``: its TRL settings, protocol, reward, retriever and
training questions) this builds the real ``SearchGRPOTrainer`` (``training.rl.trl_engine.build_trainer``) with the
preset's model and runs ``--warmup + --steps`` optimizer steps per variant, timing inside each measured step:

- rollout: the multi-turn search rollouts with the live policy (generation + retrieval);
- reference forward: no-grad log-prob passes (the KL reference: a model copy, or the LoRA-disabled policy);
- policy forward/backward: the training step minus the rollout/scoring phase (loss forward + backward);
- optimizer: ``optimizer.step`` (between the trainer's pre/post optimizer-step events);
- other: the rest of the step (rewards, tokenization, padding, logging).

Variants (each a real ``TRLSearchConfig``): ``today`` (the preset as committed), then cumulatively ``lora`` (LoRA
rank 16, reference = adapter-disabled policy), ``bf16`` (forward/backward under autocast, rollouts with a bf16 copy
of the merged weights; only where the CPU has native bf16), ``beta0`` (no KL term: no reference pass) and
``short`` (max_completion_length and max_tokens_per_turn x 2/3); and, on top of ``today`` alone, ``ckpt``
(activation checkpointing), ``micro2`` (micro-batches of 2: with TRL 0.24 this also halves the step's gradient, since
TRL's loss and the Trainer each divide by the accumulation steps) and ``budget1k``/``budget2k`` (the preset's
micro-batches with ``loss_token_budget`` 1,024/2,048 tokens: the same gradient, the loss's activations bounded by
tokens), the memory candidates of issue 26 item 4, and
``fixed_heap`` (the rollouts on the training's fixed glibc mmap threshold, as every step ran them until session 22;
now they run inside ``infra.memory.inference_heap``) and ``thp`` (today's settings in a process started with
PyTorch's ``THP_MEM_ALLOC_ENABLE=1``: CPU tensors of 2 MiB and more are 2 MiB-aligned and ``madvise``d as transparent
huge pages, so the training's fixed mmap threshold faults their memory in 2 MiB pages instead of 4 KiB ones; needs
``--isolate``, since the variable is read once per process), ``mmap128k`` (the training's fixed mmap threshold at
128 KiB, as sessions 12-25 trained: every activation above it is a fresh mmap whose pages fault in) and ``mmap4m``
(at 4 MiB; today's is 32 MiB, glibc's dynamic maximum, with ``infra.memory.trim_on_growth`` after every step;
use ``--isolate`` for clean peaks), and ``shared`` (``share_prompt``: the loss forwards each distinct prompt of a
micro-batch once and its completions on its key/value cache, micro-batches filled one prompt at a time; the same
gradient up to float order, ``training/rl/shared_prompt.py``), ``ahead`` (``resample_ahead`` 2: dynamic sampling's
first two extra groups ride in the step's own rollout call, one batch, and what is still needed goes in one more
call, instead of one call per extra group), ``shared_ahead`` (both), ``shared_grouped`` (``shared`` with
``loss_attention: grouped``: the loss's forward/backward with plain-matrix-product grouped attention instead of
PyTorch's CPU flash attention), ``top`` (LoRA on the top ``--top-layers`` decoder layers only, ``lora_layers``: the
loss's backward stops at the lowest adapted layer), ``shared_grouped_top`` (both) and ``old_steps`` (today's
settings with the rollouts' decode steps as before session 35: ``torch.multinomial`` sampling and transformers
building each step's mask; ``training.generation.decode.SAMPLER`` / ``STEP_MASK``), so the engine's own gain is
measured in the run.
Dynamic sampling (``resample_flat_groups``) rolls out extra groups for the steps' flat ones, as many as chance
makes flat: each variant's mean extra groups per measured step and its rollout seconds per trajectory rolled out
(the step's and the extra ones) are printed, so a variant that drew more flat groups is read as such.
``--frozen-policy`` keeps every variant's policy at the start policy (learning rate ``FROZEN_LR``), so that from the
same seeds the variants roll out the same trajectories and are compared on the same work.
Each variant's minor page faults and system CPU seconds per step (``getrusage``, warm-up step included) are printed
next to its time: the price of the fixed mmap threshold (``infra.memory``).
Each variant's peak RSS during its measured steps is sampled (every 0.1 s), overall and by the phase it was sampled
in (rollout, scoring, loss forward/backward, optimizer, between steps); ``--isolate`` runs every variant in a fresh
process, so the peaks do not inherit an earlier variant's heap.
Prints trajectories trained per minute per variant and its ratio to ``today``, the bf16 vs fp32 log-prob gap on one
batch, dtype, CPU flags, threads and load. The model is the preset's base model (the warm-up SFT is skipped: the
step's cost does not depend on it, though trajectory lengths do; the tokens per trajectory are printed), or
``--model <warm-up policy folder>``: the policy a learning run's RL really starts from, whose trajectories search
and read a paragraph (the base model's make no search and stay short, which understates a real step's memory).

Usage: ``PYTHONPATH=. nice -n 10 python benchmarks/grpo_step.py --preset searchr1_learn_cpu --threads 2``
(about 6 minutes on 2 cores); ``--variants today,lora`` for a subset; ``--out docs/results/...md`` writes the
markdown report too.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

BF16_LABEL = "bf16 (autocast train, bf16 copy rollout)"
REPO = Path(__file__).resolve().parent.parent
ORDER = ("today", "lora", "bf16", "beta0", "short")
#: variants applied to ``today`` alone (not cumulative): the memory candidates
EXTRA = ("ckpt", "micro2", "budget1k", "budget2k", "fixed_heap", "thp", "mmap128k", "mmap4m", "filed", "shared",
         "ahead", "shared_ahead", "old_steps", "shared_grouped", "top", "shared_grouped_top")
#: ``resample_ahead`` of the ``ahead`` variants: extra groups rolled out in the step's own rollout call
AHEAD = 2
#: ``filed``: the preset's questions, shapes and sampling with the cost settings of the GRPO presets when issue 27
#: was filed (full fine-tune, fp32, beta 0.001 with a reference model copy, no loss token budget): ``today`` against
#: it is the "trajectories trained per minute against today's preset settings" ratio, in one run (the engine's code
#: is today's in both, so the gains of later code are not in it)
FILED = {"lora_rank": None, "lora_layers": None, "precision": "fp32", "beta": 0.001, "loss_token_budget": None}
#: ``--frozen-policy``: a learning rate whose AdamW updates (about lr per weight) are lost in fp32 rounding of every
#: non-zero weight; LoRA's B, which starts at 0, moves to about lr, and its product with A is lost against the base
#: weight it is merged into
FROZEN_LR = 1e-30
#: variants that fix the training's glibc mmap threshold elsewhere (bytes; ``infra.memory.TRAINING_THRESHOLD``)
VARIANT_THRESHOLD = {"mmap128k": 128 << 10, "mmap4m": 4 << 20}
#: variants run in a process with these environment variables (``--isolate`` only)
VARIANT_ENV = {"thp": {"THP_MEM_ALLOC_ENABLE": "1"}}


def variant_config(base: Any, name: str, lora_rank: int = 16, top_layers: int = 10) -> Any:
    """The cumulative cheaper settings up to ``name`` (``today`` is the preset as is); ``EXTRA`` variants change
    ``today`` alone (``top``: LoRA of ``today``'s rank, or ``lora_rank`` where today fine-tunes fully, on the top
    ``top_layers`` decoder layers)."""
    if name in ("top", "shared_grouped_top"):
        upd = {"lora_rank": base.lora_rank or lora_rank, "lora_layers": top_layers}
        if name == "shared_grouped_top":
            upd.update(share_prompt=True, loss_attention="grouped")
        return base.model_copy(update=upd)
    if name == "filed":
        return base.model_copy(update=FILED)
    if name == "ckpt":
        return base.model_copy(update={"gradient_checkpointing": True})
    if name == "shared":
        return base.model_copy(update={"share_prompt": True})
    if name == "shared_grouped":
        return base.model_copy(update={"share_prompt": True, "loss_attention": "grouped"})
    if name in ("ahead", "shared_ahead"):
        return base.model_copy(update={"resample_ahead": AHEAD, "share_prompt": name == "shared_ahead"})
    if name == "micro2":
        return base.model_copy(update={"micro_batch_size": 2})
    if name.startswith("budget"):  # budget1k, budget2k
        return base.model_copy(update={"loss_token_budget": int(name.removeprefix("budget").removesuffix("k")) << 10})
    if name in ("fixed_heap", "thp", "old_steps", *VARIANT_THRESHOLD):  # today's settings; run_variant switches
        return base  # INFERENCE_HEAP off (fixed_heap) or the decode steps (old_steps); thp: run_isolated starts the
        # process with VARIANT_ENV; mmap*: run_variant
    upd: dict[str, Any] = {}
    for step in ORDER[1: ORDER.index(name) + 1]:
        if step == "lora":
            upd["lora_rank"] = lora_rank
        elif step == "bf16":
            upd["precision"] = "bf16"
        elif step == "beta0":
            upd["beta"] = 0.0
        elif step == "short":
            upd["max_completion_length"] = max(8, base.max_completion_length * 2 // 3)
            upd["max_tokens_per_turn"] = max(1, base.max_tokens_per_turn * 2 // 3)
    return base.model_copy(update=upd)


class StepClock:
    """Accumulates seconds per part for the steps after ``skip`` (the first ones warm caches up)."""

    def __init__(self, skip: int) -> None:
        self.skip = skip
        self.step = 0
        self.parts: dict[str, float] = defaultdict(float)
        self.steps: list[float] = []
        self.tokens: list[int] = []
        self.phases: list[str] = ["between steps"]  # what the step is doing now (innermost last), for RSSPeak

    @property
    def phase(self) -> str:
        return self.phases[-1]

    @property
    def measuring(self) -> bool:
        return self.step >= self.skip

    def add(self, part: str, seconds: float) -> None:
        if self.measuring:
            self.parts[part] += seconds


def instrument(trainer: Any, clock: StepClock) -> None:
    """Wrap the trainer's phases with timers (instance attributes shadow the class's methods)."""
    import torch
    from transformers import TrainerCallback

    def timed(name: str, fn: Any, part: Any, phase: Any) -> None:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            clock.phases.append(phase() if callable(phase) else phase)
            try:
                return fn(*args, **kwargs)
            finally:
                clock.phases.pop()
                clock.add(part() if callable(part) else part, time.perf_counter() - t0)
        setattr(trainer, name, wrapper)

    inner_rollout = trainer.rollout_fn

    def rollout(rows: Any, model: Any, tok: Any, seed: Any = None) -> Any:
        t0 = time.perf_counter()
        clock.phases.append("rollout")
        try:
            samples = inner_rollout(rows, model, tok, seed=seed)
        finally:
            clock.phases.pop()
        clock.add("rollout", time.perf_counter() - t0)
        if clock.measuring:
            clock.tokens += [len(s.completion_ids) for s in samples]
        return samples

    trainer.rollout_fn = rollout
    timed("_get_per_token_logps_and_entropies", trainer._get_per_token_logps_and_entropies,
          lambda: "_policy_logps" if torch.is_grad_enabled() else "reference forward",
          lambda: "loss forward/backward" if torch.is_grad_enabled() else clock.phase)  # a KL reference pass: scoring
    timed("_generate_and_score_completions", trainer._generate_and_score_completions, "_generate_and_score",
          "scoring")
    timed("training_step", trainer.training_step, "_training_step", "loss forward/backward")

    class Clock(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.o0 = time.perf_counter()
            clock.phases.append("optimizer")

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.phases.pop()
            clock.add("optimizer", time.perf_counter() - self.o0)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if clock.measuring:
                clock.steps.append(time.perf_counter() - self.t0)
            clock.step += 1

    trainer.add_callback(Clock())


def run_variant(name: str, tcfg: Any, model_path: str, rows: list[dict], reward: Any, rollout: Any, out: Path,
                warmup: int, steps: int) -> dict[str, Any]:
    """Train ``warmup + steps`` steps with ``tcfg``; the measured steps' seconds per part."""
    import infra.memory
    from training.rl.trl_engine import build_trainer

    cfg = tcfg.model_copy(update={"max_steps": warmup + steps, "save_steps": 10_000, "logging_steps": 1})
    today = infra.memory.TRAINING_THRESHOLD
    infra.memory.TRAINING_THRESHOLD = VARIANT_THRESHOLD.get(name, today)
    try:
        trainer = build_trainer(cfg, model_path, rows, [reward], rollout, str(out / name))
    finally:
        infra.memory.TRAINING_THRESHOLD = today
    clock = StepClock(warmup)
    instrument(trainer, clock)
    peak = RSSPeak(clock)
    peak.start()
    infra.memory.INFERENCE_HEAP = name != "fixed_heap"
    import training.generation.decode as decode

    steps_before = decode.SAMPLER, decode.STEP_MASK
    if name == "old_steps":
        decode.SAMPLER, decode.STEP_MASK = "multinomial", "transformers"
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF)
    try:
        trainer.train()
    finally:
        peak.stop()
        infra.memory.INFERENCE_HEAP = True
        decode.SAMPLER, decode.STEP_MASK = steps_before
    after = resource.getrusage(resource.RUSAGE_SELF)
    all_steps = warmup + steps
    n = len(clock.steps)
    p = {k: v / n for k, v in clock.parts.items()}
    gen = p.pop("_generate_and_score", 0.0)
    train = p.pop("_training_step", 0.0)
    p.pop("_policy_logps", None)
    step = sum(clock.steps) / n
    parts = {"rollout": p.get("rollout", 0.0), "reference forward": p.get("reference forward", 0.0),
             "policy forward/backward": max(0.0, train - gen), "optimizer": p.get("optimizer", 0.0)}
    parts["other"] = max(0.0, step - sum(parts.values()))
    trajs = cfg.prompts_per_step * cfg.num_generations
    extra = [h["search/extra_groups"] for h in trainer.state.log_history if "search/extra_groups" in h][warmup:]
    trainable = sum(x.numel() for x in trainer.model.parameters() if x.requires_grad)
    return {"name": name, "step_s": step, "parts": parts, "traj_per_min": 60 * trajs / step,
            "tokens_per_traj": sum(clock.tokens) / max(1, len(clock.tokens)), "trainable": trainable,
            "extra_groups": sum(extra) / len(extra) if extra else 0.0,
            "ref_model": trainer.ref_model is not None, "cfg": cfg, "peak_rss_gb": peak.peak / 1e9,
            "peak_rss_gb_by_phase": {k: v / 1e9 for k, v in peak.by_phase.items()},
            "minflt_per_step": (after.ru_minflt - before.ru_minflt) / all_steps,
            "sys_s_per_step": (after.ru_stime - before.ru_stime) / all_steps}


class RSSPeak:
    """The largest resident set of this process while ``clock`` is measuring, sampled every 0.1 s (Linux
    ``/proc/self/statm``; 0 elsewhere), overall and by the phase of the step it was sampled in (``by_phase``:
    rollout, scoring, loss forward/backward, optimizer, between steps). ``read_rss`` replaces the reader (tests)."""

    def __init__(self, clock: StepClock, read_rss: Callable[[], int] | None = None) -> None:
        import threading

        self.clock, self.peak, self._stop = clock, 0, threading.Event()
        self.by_phase: dict[str, int] = {}
        self.read_rss = read_rss or self_rss
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            if not self.clock.measuring:
                continue
            try:
                rss = self.read_rss()
            except OSError:
                return
            self.peak = max(self.peak, rss)
            phase = self.clock.phase
            self.by_phase[phase] = max(self.by_phase.get(phase, 0), rss)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def self_rss() -> int:
    """This process's resident set in bytes (Linux ``/proc/self/statm``; raises OSError where it is absent)."""
    import os

    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def bf16_gap(model_path: str, rows: list[dict], tokenizer: Any) -> dict[str, float]:
    """Per-token log-probs of the prompts under fp32 vs bf16 autocast (same weights): mean and max |difference|."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    enc = tokenizer([r["prompt"] for r in rows[:4]], return_tensors="pt", padding=True)
    with torch.no_grad():
        fp32 = torch.log_softmax(model(**enc).logits.float(), -1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = torch.log_softmax(model(**enc).logits.float(), -1)
    ids = enc["input_ids"][:, 1:].unsqueeze(-1)
    mask = enc["attention_mask"][:, 1:].bool()
    a = fp32[:, :-1].gather(-1, ids).squeeze(-1)[mask]
    b = bf16[:, :-1].gather(-1, ids).squeeze(-1)[mask]
    d = (a - b).abs()
    return {"mean_abs": float(d.mean()), "max_abs": float(d.max()), "mean_logp_fp32": float(a.mean())}


def environment(threads: int) -> dict[str, Any]:
    """CPU flags that matter, threads, load, nice level."""
    from infra.machine import describe

    return {**describe(), "threads_arg": threads}


def report(preset: str, env_before: dict, env_after: dict, results: list[dict], gap: dict | None,
           command: str, warmup: int, steps: int) -> str:
    """The markdown report."""
    from training.rl.trl_engine import resolved_precision

    base = results[0]
    c = base["cfg"]
    lines = [f"# One GRPO step of `{preset}`, profiled (benchmarks/grpo_step.py)", "",
             f"Command: `{command}`", "",
             f"Preset step: {c.prompts_per_step} prompts x {c.num_generations} generations = "
             f"{c.prompts_per_step * c.num_generations} trajectories, micro_batch_size={c.micro_batch_size}, "
             f"loss_token_budget={c.loss_token_budget}, resample_flat_groups={c.resample_flat_groups}, "
             f"beta={c.beta}, learning_rate={c.learning_rate:g}, max_completion_length={c.max_completion_length}, "
             f"max_tokens_per_turn={c.max_tokens_per_turn}. {warmup} warm-up step(s) then {steps} measured step(s) "
             "per variant (mean seconds per measured step).", "",
             f"Machine: CPU flags {env_before['cpu_flags']}, native bf16: {env_before['native_bf16']}, torch "
             f"{env_before['torch']} with {env_before['torch_threads']} threads on {env_before['cpus']} CPUs, nice "
             f"{env_before['nice']}, load (1/5/15 min) before {tuple(round(x, 2) for x in env_before['load_1_5_15'])}"
             f", after {tuple(round(x, 2) for x in env_after['load_1_5_15'])}.", "",
             "| variant | dtype | LoRA | beta | ref model copy | rollout s | reference fwd s | policy fwd/bwd s | "
             "optimizer s | other s | step s | tokens/traj | trajectories/min | x today | peak RSS GB (steps) | "
             "minor faults / step | system CPU s / step | extra groups / step | rollout s / trajectory rolled out |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c, p = r["cfg"], r["parts"]
        lines.append(
            f"| {r['name']} | {BF16_LABEL if resolved_precision(c) == 'bf16' else 'fp32'} | "
            f"{c.lora_rank or 'full'}{f' top {c.lora_layers}' if c.lora_layers else ''} | {c.beta} | "
            f"{'yes' if r['ref_model'] else 'no'} | {p['rollout']:.1f} | "
            f"{p['reference forward']:.1f} | {p['policy forward/backward']:.1f} | {p['optimizer']:.2f} | "
            f"{p['other']:.1f} | {r['step_s']:.1f} | {r['tokens_per_traj']:.0f} | {r['traj_per_min']:.1f} | "
            f"{r['traj_per_min'] / base['traj_per_min']:.2f} | {r.get('peak_rss_gb', float('nan')):.2f} | "
            f"{r.get('minflt_per_step', float('nan')):,.0f} | {r.get('sys_s_per_step', float('nan')):.1f} | "
            f"{r.get('extra_groups', 0.0):.2f} | "
            f"{p['rollout'] / (c.num_generations * (c.prompts_per_step + r.get('extra_groups', 0.0))):.2f} |")
    phases = ("rollout", "scoring", "loss forward/backward", "optimizer", "between steps")
    lines += ["", "Peak RSS (GB) by the phase of the measured steps it was sampled in (every 0.1 s):", "",
              "| variant | " + " | ".join(phases) + " |", "|---|" + "---|" * len(phases)]
    for r in results:
        by = r.get("peak_rss_gb_by_phase") or {}
        lines.append(f"| {r['name']} | " + " | ".join(f"{by[k]:.2f}" if k in by else "-" for k in phases) + " |")
    best = results[-1]
    scope = "today with it alone" if best["name"] in EXTRA else "all switches up to it"
    lines += ["", f"**Ratio (b)/(a): {best['traj_per_min'] / base['traj_per_min']:.2f}x** trajectories trained per "
              f"minute, `{best['name']}` ({scope}) against `today`."]
    filed = next((r for r in results if r["name"] == "filed"), None)
    if filed:
        lines += ["", f"**`today` against `filed`: {base['traj_per_min'] / filed['traj_per_min']:.2f}x** trajectories "
                      "trained per minute (the preset's settings now against the cost settings of issue 27's filing: "
                      "full fine-tune, fp32, beta 0.001 with a reference copy, no loss token budget)."]
        for r in results:
            if r["name"] not in ("today", "filed"):
                lines += ["", f"**`{r['name']}` against `filed`: {r['traj_per_min'] / filed['traj_per_min']:.2f}x** "
                              "trajectories trained per minute."]
    if gap:
        lines += ["", f"bf16 autocast vs fp32, per-token log-probs of 4 prompts (same weights): mean |diff| "
                      f"{gap['mean_abs']:.4f}, max {gap['max_abs']:.4f} nats "
                      f"(mean log-prob {gap['mean_logp_fp32']:.3f})."]
    return "\n".join(lines) + "\n"


def run_isolated(args: argparse.Namespace, names: list[str]) -> int:
    """``--isolate``: each variant in a fresh process of this script; the same report from their results."""
    import json
    import os
    import subprocess
    import tempfile

    from training.rl.config import TRLSearchConfig

    results, env_before = [], None
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--preset", args.preset, "--variants", name,
                   "--warmup", str(args.warmup), "--steps", str(args.steps), "--threads", str(args.threads),
                   "--lora-rank", str(args.lora_rank), "--top-layers", str(args.top_layers), "--child-out", str(out)]
            if args.stage:
                cmd += ["--stage", args.stage]
            if args.model:
                cmd += ["--model", args.model]
            if args.no_dynamic_sampling:
                cmd += ["--no-dynamic-sampling"]
            if args.frozen_policy:
                cmd += ["--frozen-policy"]
            subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=str(REPO), **VARIANT_ENV.get(name, {})))
            for r in json.loads(out.read_text()):
                env_before = env_before or r.pop("env")
                r.pop("env", None)
                r["cfg"] = TRLSearchConfig.model_validate(r["cfg"])
                results.append(r)
    command = "PYTHONPATH=. python benchmarks/grpo_step.py " + " ".join(sys.argv[1:])  # niceness: the machine line
    text = report(args.preset, env_before, environment(args.threads), results, None, command, args.warmup,
                  args.steps)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="searchr1_learn_cpu")
    parser.add_argument("--stage", default=None, help="stage name (default: the first)")
    parser.add_argument("--model", default=None, help="policy to start from (default: the preset's base model), "
                        "e.g. the preset's warm-up SFT folder")
    parser.add_argument("--variants", default=",".join(ORDER), help=f"comma list from {ORDER}; today first")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--top-layers", type=int, default=10, help="decoder layers with LoRA adapters in the top "
                        "variants (lora_layers)")
    parser.add_argument("--out", default=None, help="also write the markdown report here")
    parser.add_argument("--isolate", action="store_true", help="every variant in a fresh process (clean peaks)")
    parser.add_argument("--no-dynamic-sampling", action="store_true",
                        help="resample_flat_groups and resample_ahead 0 in every variant: each step rolls out its own "
                             "16 trajectories "
                             "only, so the variants' costs are compared without the chance of drawing flat groups")
    parser.add_argument("--frozen-policy", action="store_true",
                        help=f"learning rate {FROZEN_LR:g} in every variant: AdamW's updates are below fp32's "
                             "resolution of the weights (and of the merged weights, for LoRA's zero-started B), so "
                             "every variant's policy stays the start policy and, from the same seeds, "
                             "rolls out the same trajectories: the variants' costs compare on the same work (a full "
                             "fine-tune at the preset's learning rate can break its policy after one step and roll "
                             "out shorter trajectories, which flatters it)")
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)  # one variant, its result as JSON
    args = parser.parse_args()
    names = [v for v in args.variants.split(",") if v]
    if args.child_out is None and (names[0] != "today" or any(v not in ORDER + EXTRA for v in names)):
        parser.error(f"--variants must start with today and use {ORDER + EXTRA}")
    if args.child_out is None and not args.isolate and set(names) & set(VARIANT_ENV):
        parser.error(f"variants {sorted(set(names) & set(VARIANT_ENV))} set environment variables at process start: "
                     "add --isolate")
    if args.no_dynamic_sampling and set(names) & {"ahead", "shared_ahead"}:
        parser.error("--no-dynamic-sampling leaves the ahead variants nothing to roll out ahead; drop one of them")
    if args.isolate and args.child_out is None:
        return run_isolated(args, names)

    import torch

    torch.set_num_threads(args.threads)
    from evaluation.benchmarks import load_benchmark
    from infra.config import load_config
    from retrieval.open import open_searcher
    from training.agent.rollout import RolloutConfig
    from training.generation.models import load_tokenizer
    from training.generation.models import resolve_policy as resolve_model
    from training.protocols.base import load_protocol
    from training.rewards.adapters import trl_reward_func
    from training.rl.config import RLConfig
    from training.rl.data import default_messages, trl_rows, verl_rows
    from training.rl.trl_engine import engine_rollout_fn, native_bf16, prompt_rows, rollout_batch_size

    cfg = load_config(RLConfig, args.preset)
    stage = next(s for s in cfg.stages if args.stage in (None, s.name))
    base = stage.trl
    if args.no_dynamic_sampling:
        base = base.model_copy(update={"resample_flat_groups": 0, "resample_ahead": 0})  # no extras to roll ahead
    if args.frozen_policy:
        base = base.model_copy(update={"learning_rate": FROZEN_LR})
    if not native_bf16():
        names = [v for v in names if v in EXTRA or ORDER.index(v) != ORDER.index("bf16")]
        print("no native bf16 here (avx512_bf16/amx_bf16): bf16 variants skipped", file=sys.stderr)
    env_before = environment(args.threads)
    model_path = resolve_model(args.model or cfg.model)
    tok = load_tokenizer(model_path)
    protocol = load_protocol(cfg.protocol, top_k=stage.top_k or cfg.top_k, max_turns=stage.max_turns,
                             template=cfg.template)
    # the steps' prompts, and a pool for dynamic sampling's extra groups to be drawn from (64 at least, so that the
    # extra groups are other questions than the steps', as in a real run)
    n_q = max(64, (args.warmup + args.steps) * base.prompts_per_step)
    questions = [q for src in cfg.data.train for q in load_benchmark(src, limit=n_q)][:n_q]
    rows = prompt_rows(protocol, trl_rows(verl_rows(questions, default_messages())), tok)
    searcher = open_searcher(cfg.retrieval)
    reward = trl_reward_func(stage.reward, eos_token_id=tok.eos_token_id)
    out = REPO / ".searchloop" / "bench_grpo_step"
    results = []
    for name in names:
        tcfg = variant_config(base, name, args.lora_rank, args.top_layers)
        rollout = engine_rollout_fn(protocol, searcher, RolloutConfig(
            temperature=tcfg.temperature, best_of=1, max_tokens_per_turn=tcfg.max_tokens_per_turn,
            max_total_tokens=tcfg.max_completion_length, seed=tcfg.seed), batch_size=rollout_batch_size(tcfg))
        t0 = time.perf_counter()
        results.append(run_variant(name, tcfg, model_path, rows, reward, rollout, out, args.warmup, args.steps))
        print(f"{name}: {results[-1]['step_s']:.1f} s/step, {results[-1]['traj_per_min']:.1f} traj/min "
              f"({time.perf_counter() - t0:.0f} s with warm-up)", file=sys.stderr, flush=True)
    if args.child_out is not None:
        import json

        Path(args.child_out).write_text(json.dumps(
            [{**r, "cfg": r["cfg"].model_dump(mode="json"), "env": env_before} for r in results]))
        return 0
    gap = bf16_gap(model_path, rows, tok) if native_bf16() else None
    command = "PYTHONPATH=. python benchmarks/grpo_step.py " + " ".join(sys.argv[1:])  # niceness: the machine line
    text = report(args.preset, env_before, environment(args.threads), results, gap, command, args.warmup, args.steps)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
