"""GPU check: the library's generation, rollouts, GRPO step, weighted SFT step and dense encoding on CUDA.

Runs the project's own code paths on one CUDA device with randomly initialised models of the real architectures
(SmolLM2-135M and all-MiniLM-L6-v2: config and tokenizer from their folders, weights drawn at random, so nothing is
downloaded) and prints ratios against baselines measured in the same run:

- generation: ``TransformersGenerator`` (prefix cache off / on) vs plain ``model.generate`` on the same left-padded
  prompts, greedy, batch 1, 16 and 64, decode-heavy (128 new tokens) and prefill-heavy (~1,000-token prompts with
  inserted passages, 16 new tokens); greedy token streams compared row by row;
- rollouts: ``run_rollouts`` (Search-R1 protocol, one forced search per trajectory so every trajectory continues
  after an insertion) with the prefix cache off / on, trajectories/s;
- GRPO steps through the TRL engine (``training.rl.trl_engine.build_trainer``, search rollouts inside; one warm-up
  step, then ``--grpo-steps`` timed, their median kept and each step's rollout seconds beside it): the
  filed settings (full fine-tune, beta 0.001, fp32) and the learning presets' (``grpo_learn``: LoRA 16, beta 0,
  share_prompt, bf16 autocast where native), trajectories/min as a ratio, and (``grpo_each``, not in the
  default run) each of those switches alone; and one weighted SFT step
  (``training.sft.weighted.weighted_sequence_loss``): seconds and peak GPU memory;
- dense encoding: ``retrieval.encoders.SentenceTransformerEncoder`` vs ``encode`` on the same
  sentence-transformers object, same passages and batch size, after a warm-up, alternating order.

The retriever in the rollouts is a word-overlap scorer over the shipped mini corpus (a stand-in: the check measures
the generation side, and BM25/faiss are not installed on a bare GPU machine). Random weights put the logits near
ties, so ``--init-range`` (default 0.2) widens the initialisation to make greedy picks well separated.

Without CUDA it prints why and exits 0. ``--device cpu --quick`` runs the same code on the CPU (a smoke run);
issue 26 item 1 on this CPU (generation only, both dtypes the rollouts may use)::

    PYTHONPATH=. python benchmarks/gpu_check.py --device cpu --only generation --batches 1,16,64 \
        --rows-per-batch 1 --decode-tokens 64 --dtype bfloat16 --out docs/results/engines/generation_cpu_bf16.json

    python benchmarks/gpu_check.py --out docs/results/engines/gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SMOL_FILES = ("config.json", "generation_config.json", "special_tokens_map.json", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja")


# The learning presets' GRPO switches (flows/configs/research_hops_learn_cpu.yaml) a GPU step can use; the loss's
# grouped attention is a CPU switch (it changes nothing where sdpa runs on CUDA), so it is not among them.
LEARN_SETTINGS: dict[str, Any] = {"lora_rank": 16, "beta": 0.0, "share_prompt": True, "precision": "auto"}


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, repeats: int = 2) -> tuple[Any, float]:
    """(result of the last call, best wall seconds over ``repeats`` calls)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return out, best


def environment(device: str, dtype: str) -> dict[str, Any]:
    """Versions, device, dtype, CPU flags, threads and load (``infra.machine.describe``)."""
    import transformers

    from infra.machine import describe

    return {**describe(dtype), "device": device, "transformers": transformers.__version__}


def random_smol(smol_dir: Path, dtype: Any, device: str, init_range: float) -> tuple[Any, Any]:
    """SmolLM2-135M architecture with random weights, and its real tokenizer (EOS/pad as the library sets them)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from training.generation.models import load_tokenizer

    cfg = AutoConfig.from_pretrained(smol_dir)
    cfg.initializer_range = init_range
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype).to(device).eval()
    return model, load_tokenizer(str(smol_dir))


def questions(n: int) -> list[Any]:
    from evaluation.benchmarks import load_benchmark

    out: list[Any] = []
    for name in ("hotpotqa_mini", "2wikimultihopqa_mini", "musique_mini", "bamboogle_mini"):
        out += load_benchmark(REPO / "data" / "eval" / f"{name}.jsonl")
    return (out * (n // len(out) + 1))[:n]


class OverlapSearcher:
    """Word-overlap retriever over the shipped mini corpus (a stand-in for BM25 on a bare GPU machine)."""

    name = "overlap"

    def __init__(self) -> None:
        from retrieval.types import Hit

        self._hit = Hit
        self.docs = [json.loads(line) for line in (REPO / "data/corpus/mini.jsonl").read_text().splitlines()]
        self.words = [set(re.findall(r"\w+", f"{d.get('title', '')} {d.get('text', '')}".lower())) for d in self.docs]

    def search(self, queries: list[str], k: int) -> list[list[Any]]:
        out = []
        for q in queries:
            qw = set(re.findall(r"\w+", q.lower()))
            best = sorted(range(len(self.docs)), key=lambda i: -len(qw & self.words[i]))[:k]
            out.append([self._hit(id=str(self.docs[i].get("id", i)), title=self.docs[i].get("title", ""),
                                  text=self.docs[i].get("text", ""),
                                  score=float(len(qw & self.words[i]))) for i in best])
        return out


def prompts_for(shape: str, tok: Any, n: int) -> list[str]:
    """Search-R1 prompts: as at a trajectory's start (decode-heavy) or after two insertions (prefill-heavy)."""
    from training.protocols.base import load_protocol

    proto = load_protocol("searchr1")
    qs = questions(n)
    if shape == "decode":
        return [proto.build_prompt(q.question, tok) for q in qs]
    searcher = OverlapSearcher()
    out = []
    for q in qs:
        docs = searcher.search([q.question], 5)[0]
        info = "\n".join(f"Doc {i + 1}(Title: {h.title}) {h.text}" for i, h in enumerate(docs))
        out.append(proto.build_prompt(q.question, tok) + f"<think>I need facts.</think>\n<search> {q.question} "
                   f"</search>\n\n<information>{info}</information>\n\n")
    return out


def plain_generate(model: Any, tok: Any, prompts: list[str], batch: int, new_tokens: int) -> list[list[int]]:
    """The baseline: ``model.generate`` on left-padded fixed batches, greedy, stopping only at EOS or the budget."""
    import torch

    out: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        enc = tok(prompts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        with torch.inference_mode():
            seqs = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                  max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
                                  eos_token_id=tok.eos_token_id)
        plen = enc["input_ids"].shape[1]
        for r in range(seqs.shape[0]):
            ids = seqs[r, plen:].tolist()
            out.append(ids[: ids.index(tok.eos_token_id)] if tok.eos_token_id in ids else ids)
    return out


def auto_path(model: Any, tok: Any, batch: int, rows: int) -> str:
    """Which path ``prefix_cache="auto"`` (the library's default, ``TransformersGenerator.uses_prefix_cache``)
    takes for a single-shot call of ``rows`` rows at this batch size on this device: ``cache`` or ``nocache``."""
    from training.generation.hf import TransformersGenerator

    gen = TransformersGenerator(model, tok, batch_size=batch, bucket_ratio=None, prefix_cache="auto")
    return "cache" if gen.uses_prefix_cache(rows) else "nocache"


def ours(model: Any, tok: Any, prompts: list[str], batch: int, new_tokens: int, cache: bool) -> list[list[int]]:
    """The library's engine, as the rollouts call it (Search-R1's stop strings, per-row budgets), with the prefix
    cache forced on or off."""
    from training.generation.base import SamplingParams
    from training.generation.hf import TransformersGenerator

    gen = TransformersGenerator(model, tok, batch_size=batch, bucket_ratio=None, prefix_cache=cache)
    sampling = SamplingParams(temperature=0.0, max_tokens=new_tokens, stop=["</search>", "</answer>"])
    comps = gen.generate(prompts, sampling)
    return [c.token_ids for c in comps]


def profile_paths(model: Any, tok: Any, device: str, batch: int = 16, new: int = 128) -> dict[str, str]:
    """cProfile of one decode-heavy call per path (where the host time goes; waits on the GPU show up in the
    function that synchronises)."""
    import cProfile
    import io
    import pstats

    prompts = prompts_for("decode", tok, batch)
    out = {}
    for name, fn in (("generate", lambda: plain_generate(model, tok, prompts, batch, new)),
                     ("ours_nocache", lambda: ours(model, tok, prompts, batch, new, cache=False)),
                     ("ours_cache", lambda: ours(model, tok, prompts, batch, new, cache=True))):
        fn()
        prof = cProfile.Profile()
        prof.enable()
        fn()
        _sync(device)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
        out[name] = buf.getvalue()
        print(f"--- profile {name} (decode, batch {batch}, tottime) ---\n" + "\n".join(
            line for line in buf.getvalue().splitlines() if line.strip() and not line.startswith("   Ordered")),
            flush=True)
    return out


def bench_generation(model: Any, tok: Any, device: str, quick: bool, batches: list[int] | None = None,
                     decode_tokens: int = 128, rows_per_batch: int | None = None,
                     repeats: int = 2) -> list[dict[str, Any]]:
    """Ours (prefix cache off / on) against plain ``generate`` on the same prompts, decode- and prefill-heavy, per
    batch size; ``rows_per_batch`` prompts = batch x it (batch 1: 4 prompts), default 2 (1 with ``quick``); each
    path timed ``repeats`` times (best kept). ``auto_path`` / ``ratio_auto``: the path the library's default
    (``prefix_cache="auto"``) takes for that row, and its ratio."""
    rows = []
    shapes = {"decode": decode_tokens, "prefill": 16}
    batches = batches or ([1, 16] if quick else [1, 16, 64])
    per = rows_per_batch or (1 if quick else 2)
    for shape, new_tokens in shapes.items():
        for batch in batches:
            n = 4 if batch == 1 else batch * per
            new = 16 if quick else new_tokens
            prompts = prompts_for(shape, tok, n)
            plain_generate(model, tok, prompts[:min(2, n)], batch, 4)  # warm-up of every kernel shape family
            ours(model, tok, prompts[:min(2, n)], batch, 4, cache=True)
            base, t_base = timed(lambda p=prompts, b=batch, k=new: plain_generate(model, tok, p, b, k), device,
                                 repeats)
            off, t_off = timed(lambda p=prompts, b=batch, k=new: ours(model, tok, p, b, k, cache=False), device,
                               repeats)
            on, t_on = timed(lambda p=prompts, b=batch, k=new: ours(model, tok, p, b, k, cache=True), device,
                             repeats)
            pick = auto_path(model, tok, batch, n)
            t_auto = t_on if pick == "cache" else t_off
            ntok = sum(len(x) for x in base)
            plen = sum(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts) // len(prompts)
            row = {"shape": shape, "batch": batch, "prompts": n, "mean_prompt_tokens": plen, "new_tokens": new,
                   "generate_s": round(t_base, 4), "ours_nocache_s": round(t_off, 4), "ours_cache_s": round(t_on, 4),
                   "generate_tok_s": round(ntok / t_base, 1),
                   "ratio_nocache": round(t_base / t_off, 3), "ratio_cache": round(t_base / t_on, 3),
                   "cache_vs_nocache": round(t_off / t_on, 3),
                   "auto_path": pick, "ratio_auto": round(t_base / t_auto, 3),
                   "auto_vs_nocache": round(t_off / t_auto, 3),
                   "identical_nocache": f"{sum(a == b for a, b in zip(base, off, strict=True))}/{n}",
                   "identical_cache": f"{sum(a == b for a, b in zip(base, on, strict=True))}/{n}"}
            rows.append(row)
            print(f"generation {shape:7s} batch {batch:2d}: generate {t_base:7.3f} s, ours no-cache {t_off:7.3f} s "
                  f"({row['ratio_nocache']:.2f}x), cache {t_on:7.3f} s ({row['ratio_cache']:.2f}x); auto picks "
                  f"{pick} ({row['ratio_auto']:.2f}x, {row['auto_vs_nocache']:.2f}x no-cache); identical "
                  f"{row['identical_nocache']} / {row['identical_cache']}", flush=True)
    return rows


def identity_fp32(model: Any, tok: Any, device: str, quick: bool) -> dict[str, Any]:
    """Greedy token streams of the three paths in fp32 (bf16 makes batch composition and split prefills change
    near-tied argmaxes of a random model; fp32 shows whether the paths compute the same thing)."""
    import torch

    model.float()
    try:
        res = {}
        for batch in (1, 16):
            n = 4 if batch == 1 else 32
            prompts = prompts_for("decode", tok, n)
            new = 16 if quick else 64
            base = plain_generate(model, tok, prompts, batch, new)
            off = ours(model, tok, prompts, batch, new, cache=False)
            on = ours(model, tok, prompts, batch, new, cache=True)
            res[f"batch{batch}"] = {"identical_nocache": f"{sum(a == b for a, b in zip(base, off, strict=True))}/{n}",
                                    "identical_cache": f"{sum(a == b for a, b in zip(base, on, strict=True))}/{n}"}
            print(f"fp32 greedy identity, batch {batch}: no-cache {res[f'batch{batch}']['identical_nocache']}, "
                  f"cache {res[f'batch{batch}']['identical_cache']}", flush=True)
        return res
    finally:
        model.to(torch.bfloat16 if device.startswith("cuda") else torch.float32)


class ForcedSearch:
    """Generator wrapper: a trajectory's first step searches for its question (so every trajectory continues
    after an insertion); the prompt is still prefilled by the inner engine (4 tokens generated, then replaced)."""

    def __init__(self, inner: Any, starts: dict[str, str]) -> None:
        self.inner, self.starts = inner, starts
        self.tokenizer, self.eos_token = inner.tokenizer, inner.eos_token

    def reset_prefix_cache(self) -> None:
        self.inner.reset_prefix_cache()

    def set_multi_turn(self, on: bool) -> None:
        self.inner.set_multi_turn(on)

    def generate(self, prompts: list[str], sampling: Any, max_tokens: list[int] | None = None) -> list[Any]:
        from training.generation.base import Completion

        first = [i for i, p in enumerate(prompts) if p in self.starts]
        rest = [i for i in range(len(prompts)) if i not in set(first)]
        out: list[Any] = [None] * len(prompts)
        if first:
            self.inner.generate([prompts[i] for i in first], sampling, [4] * len(first))
            for i in first:
                text = f"<search> {self.starts[prompts[i]]} </search>"
                out[i] = Completion(text=text, token_ids=self.tokenizer.encode(text, add_special_tokens=False),
                                    finish_reason="stop", stop="</search>")
        if rest:
            budgets = [max_tokens[i] for i in rest] if max_tokens else None
            for i, c in zip(rest, self.inner.generate([prompts[i] for i in rest], sampling, budgets), strict=True):
                out[i] = c
        return out


def bench_rollouts(model: Any, tok: Any, device: str, quick: bool) -> dict[str, Any]:
    from training.agent.rollout import RolloutConfig, run_rollouts
    from training.generation.hf import TransformersGenerator
    from training.protocols.base import load_protocol

    proto = load_protocol("searchr1")
    qs = questions(8 if quick else 32)
    starts = {proto.generation_prompt(proto.start(q, tok)): q.question for q in qs}
    cfg = RolloutConfig(n=4, temperature=1.0, seed=0, max_total_tokens=64 if quick else 256,
                        max_tokens_per_turn=32 if quick else 128)
    searcher = OverlapSearcher()
    res: dict[str, Any] = {}
    for cache in (False, True):
        gen = ForcedSearch(TransformersGenerator(model, tok, batch_size=64, bucket_ratio=None, prefix_cache=cache),
                           starts)
        run_rollouts(qs[:2], proto, gen, searcher, cfg.model_copy(update={"max_total_tokens": 16}), tok)
        trajs, secs = timed(lambda g=gen: run_rollouts(qs, proto, g, searcher, cfg, tok), device, repeats=1)
        key = "cache" if cache else "nocache"
        res[f"{key}_traj_s"] = round(len(trajs) / secs, 2)
        res[f"{key}_searches"] = round(sum(t.n_searches for t in trajs) / len(trajs), 2)
        print(f"rollouts prefix cache {key}: {len(trajs)} trajectories in {secs:.2f} s = {len(trajs) / secs:.2f}/s, "
              f"{res[f'{key}_searches']} searches each", flush=True)
    res["cache_vs_nocache"] = round(res["cache_traj_s"] / res["nocache_traj_s"], 3)
    probe = TransformersGenerator(model, tok, batch_size=64, bucket_ratio=None, prefix_cache="auto")
    probe.set_multi_turn(True)  # as run_rollouts sets it
    res["auto_path"] = "cache" if probe.uses_prefix_cache(len(qs) * cfg.n) else "nocache"
    print(f"rollouts: auto picks {res['auto_path']} (cache / no cache {res['cache_vs_nocache']:.2f}x)", flush=True)
    return res


def _guarded(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``, or ``{"error": ...}`` with the traceback printed: one section's (or one switch's) failure keeps
    the others' numbers."""
    try:
        return run()
    except Exception as exc:
        import traceback

        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}


def grpo_config(quick: bool, settings: dict[str, Any] | None = None, steps: int = 2) -> Any:
    """The check's ``TRLSearchConfig``: the filed settings (full fine-tune, beta 0.001, fp32), ``settings`` on top.

    ``steps`` is the number of GRPO steps run (the first is a warm-up, the rest are timed).
    """
    from training.rl.config import TRLSearchConfig

    return TRLSearchConfig(**{"num_generations": 4, "prompts_per_step": 2 if quick else 4, "max_steps": steps,
                              "max_completion_length": 64 if quick else 256,
                              "max_tokens_per_turn": 32 if quick else 128, "save_steps": 100, "beta": 0.001,
                              "micro_batch_size": None, **(settings or {})})


def bench_grpo(smol_model: Any, tok: Any, device: str, quick: bool,
               settings: dict[str, Any] | None = None, timed_steps: int = 1) -> dict[str, Any]:
    """GRPO steps through the TRL engine with search rollouts inside: one warm-up step, then ``timed_steps`` timed.

    ``settings`` overrides the config (the ``grpo_learn`` section: the learning presets' LoRA, beta 0, share_prompt
    and bf16 autocast, against the filed full fine-tune of the ``grpo`` section). The step time kept is the median of
    the timed steps (one timed step swung 2-3x between two runs on an H200 in session 40), and each step's rollout
    seconds are recorded beside it, so that a ratio says whether the rollout or the update moved.
    """
    import torch

    from training.agent.rollout import RolloutConfig
    from training.protocols.base import load_protocol
    from training.rl.trl_engine import build_trainer, engine_rollout_fn, prompt_rows

    proto = load_protocol("searchr1")
    qs = questions(16)
    rows = prompt_rows(proto, [{"question_id": q.id, "question": q.question, "golden_answers": list(q.golden_answers),
                                "data_source": q.dataset} for q in qs], tok)
    steps: list[float] = []

    class Clock:
        def __init__(self) -> None:
            from transformers import TrainerCallback

            outer = self

            class _CB(TrainerCallback):
                def on_step_begin(self, *a: Any, **k: Any) -> None:
                    _sync(device)
                    outer.t0 = time.perf_counter()

                def on_step_end(self, *a: Any, **k: Any) -> None:
                    _sync(device)
                    steps.append(time.perf_counter() - outer.t0)

            self.cb = _CB()

    def reward(completions: list[Any], **kw: Any) -> list[float]:
        return [float(len(str(c)) % 7) / 7 for c in completions]  # any varied scalar: the step's cost is measured

    cfg = grpo_config(quick, settings, steps=1 + max(1, timed_steps))
    engine_rollout = engine_rollout_fn(proto, OverlapSearcher(), RolloutConfig(temperature=1.0, max_total_tokens=
                                       cfg.max_completion_length, max_tokens_per_turn=cfg.max_tokens_per_turn),
                                       batch_size=64)
    rollout_s: list[float] = []

    def rollout_fn(*args: Any, **kwargs: Any) -> Any:
        _sync(device)
        t0 = time.perf_counter()
        out = engine_rollout(*args, **kwargs)
        _sync(device)
        rollout_s.append(time.perf_counter() - t0)
        return out

    with tempfile.TemporaryDirectory() as tmp:
        smol_model.float().save_pretrained(tmp)
        tok.save_pretrained(tmp)
        clock = Clock()
        trainer = build_trainer(cfg, tmp, rows, [reward], rollout_fn, str(Path(tmp) / "out"), callbacks=[clock.cb])
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
    trajs = cfg.prompts_per_step * cfg.num_generations
    timed = steps[1:] or steps
    step_median = statistics.median(timed) if timed else None
    res = {"trajectories_per_step": trajs, "step_s": [round(s, 2) for s in steps],
           "rollout_s": [round(s, 2) for s in rollout_s], "peak_gib": round(peak, 2),
           "step_median_s": round(step_median, 2) if step_median else None,
           "trajectories_per_min": round(60 * trajs / step_median, 1) if step_median else None}
    if settings:
        res["settings"] = settings
    print(f"GRPO step (TRL engine, {trajs} trajectories, {settings or 'fp32 full fine-tune, beta 0.001'}): "
          f"steps {res['step_s']} s (rollouts {res['rollout_s']} s), median of the timed {res['step_median_s']} s, "
          f"peak {peak:.2f} GiB", flush=True)
    return res


def bench_sft(model: Any, tok: Any, device: str, quick: bool) -> dict[str, Any]:
    """One weighted-loss SFT step (forward, ``weighted_sequence_loss``, backward, AdamW) on 8 x 512 tokens."""
    import torch

    from training.sft.weighted import weighted_sequence_loss

    model = model.float().train()
    b, t = (4, 128) if quick else (8, 512)
    ids = torch.randint(0, len(tok), (b, t), device=model.device)
    labels = ids.clone()
    labels[:, : t // 2] = -100
    weights = torch.linspace(0.2, 1.0, b, device=model.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = weighted_sequence_loss(model(input_ids=ids).logits, labels, weights)
        loss.backward()
        opt.step()
        return float(loss)

    step()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    loss, secs = timed(step, device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
    model.eval()
    print(f"weighted SFT step ({b} x {t} tokens, fp32): {secs:.3f} s, loss {loss:.3f}, peak {peak:.2f} GiB", flush=True)
    return {"batch": b, "seq": t, "step_s": round(secs, 4), "peak_gib": round(peak, 2), "loss": round(loss, 4)}


def bench_encoder(minilm_dir: Path, device: str, quick: bool) -> dict[str, Any]:
    """The library's encoder vs ``encode`` on the same SentenceTransformer object (random MiniLM weights)."""
    import shutil

    import torch
    from transformers import AutoConfig, BertModel

    from retrieval.encoders import EncoderConfig, SentenceTransformerEncoder

    lines = (REPO / "data/corpus/mini.jsonl").read_text().splitlines()
    texts = [f'"{d.get("title", "")}"\n{d.get("text", "")}' for d in map(json.loads, lines)]
    texts = texts[:256] if quick else texts
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "minilm"
        shutil.copytree(minilm_dir, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "README.md"))
        torch.manual_seed(0)
        BertModel(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
        enc = SentenceTransformerEncoder(EncoderConfig(model=str(folder), device=device, batch_size=128))
        st = enc._model
        kwargs = {"batch_size": 128, "normalize_embeddings": True, "convert_to_numpy": True,
                  "show_progress_bar": False}
        enc.encode(texts[:256], "passage")
        st.encode(texts[:256], **kwargs)  # warm-up both
        t_ours, t_raw = [], []
        for _ in range(3):
            t_raw.append(timed(lambda: st.encode(texts, **kwargs), device, repeats=1)[1])
            t_ours.append(timed(lambda: enc.encode(texts, "passage"), device, repeats=1)[1])
        dtype = str(next(st.parameters()).dtype)
    raw, our = len(texts) / min(t_raw), len(texts) / min(t_ours)
    print(f"dense encoding ({len(texts)} passages, batch 128, {dtype}): encoder {our:.0f} passages/s, raw encode "
          f"{raw:.0f} passages/s -> {our / raw:.2f}x", flush=True)
    return {"passages": len(texts), "dtype": dtype, "ours_per_s": round(our, 1), "raw_per_s": round(raw, 1),
            "ratio": round(our / raw, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smol-dir", default=None, help="folder with SmolLM2's config + tokenizer (default: the "
                    "library's converted SmolLM2 folder); weights are not read")
    ap.add_argument("--minilm-dir", default=None, help="folder of all-MiniLM-L6-v2 (default: the shipped one); "
                    "weights are not read")
    ap.add_argument("--init-range", type=float, default=0.2)
    ap.add_argument("--only", default="generation,profile,profile1,identity,rollouts,encoder,sft,grpo,grpo_learn")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                    help="model dtype (default: bfloat16 on CUDA, float32 on CPU)")
    ap.add_argument("--batches", default=None, help="generation batch sizes, e.g. 1,16,64 (default: 1,16,64)")
    ap.add_argument("--decode-tokens", type=int, default=128, help="new tokens of the decode-heavy shape")
    ap.add_argument("--rows-per-batch", type=int, default=None, help="generation prompts per batch size x this")
    ap.add_argument("--grpo-steps", type=int, default=3,
                    help="timed GRPO steps per setting after one warm-up step (their median is kept)")
    ap.add_argument("--repeats", type=int, default=2, help="timed calls per generation path (best kept)")
    args = ap.parse_args()

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: skipped, no CUDA device (torch.cuda.is_available() is False); --device cpu runs it on "
              "the CPU")
        return 0
    if args.smol_dir is None:
        from training.generation.models import resolve_model

        args.smol_dir = resolve_model("smollm2")
    if args.minilm_dir is None:
        from retrieval.encoders import resolve_model_path

        args.minilm_dir = resolve_model_path("minilm")
    dtype = (getattr(torch, args.dtype) if args.dtype else
             torch.bfloat16 if args.device.startswith("cuda") else torch.float32)
    if args.device == "cpu":
        torch.set_num_threads(int(os.environ.get("SEARCHLOOP_TORCH_THREADS", "2")))
    results: dict[str, Any] = {"environment": environment(args.device, str(dtype)), "init_range": args.init_range}
    print(json.dumps(results["environment"]), flush=True)
    only = set(args.only.split(","))
    model, tok = random_smol(Path(args.smol_dir), dtype, args.device, args.init_range)
    sections: list[tuple[str, Callable[[], Any]]] = [
        ("generation", lambda: bench_generation(
            model, tok, args.device, args.quick, [int(b) for b in args.batches.split(",")] if args.batches else None,
            args.decode_tokens, args.rows_per_batch, args.repeats)),
        ("profile", lambda: profile_paths(model, tok, args.device, 4 if args.quick else 16, 8 if args.quick else 128)),
        ("profile1", lambda: profile_paths(model, tok, args.device, 1, 8 if args.quick else 128)),
        ("identity", lambda: identity_fp32(model, tok, args.device, args.quick)),
        ("rollouts", lambda: bench_rollouts(model, tok, args.device, args.quick)),
        ("encoder", lambda: bench_encoder(Path(args.minilm_dir), args.device, args.quick)),
        ("sft", lambda: bench_sft(model, tok, args.device, args.quick)),
        ("grpo", lambda: bench_grpo(model, tok, args.device, args.quick, timed_steps=args.grpo_steps)),
        ("grpo_learn", lambda: bench_grpo(model, tok, args.device, args.quick, LEARN_SETTINGS, args.grpo_steps)),
        ("grpo_each", lambda: {key: _guarded(lambda k=key, v=value: bench_grpo(model, tok, args.device, args.quick,
                                                                              {k: v}, args.grpo_steps))
                               for key, value in LEARN_SETTINGS.items()}),
    ]
    failed = []
    for name, run in sections:
        if name not in only:
            continue
        results[name] = _guarded(run)  # one section's failure must not hide the others' numbers
        if "error" in results[name]:
            failed.append(name)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if "trajectories_per_min" in results.get("grpo", {}) and "trajectories_per_min" in results.get("grpo_learn", {}):
        ratio = results["grpo_learn"]["trajectories_per_min"] / results["grpo"]["trajectories_per_min"]
        results["grpo_learn"]["vs_grpo"] = round(ratio, 3)
        print(f"GRPO step, learning presets' settings vs the filed ones: {ratio:.2f}x trajectories/min", flush=True)
    if "trajectories_per_min" in results.get("grpo", {}) and isinstance(results.get("grpo_each"), dict):
        for key, res in results["grpo_each"].items():
            if "trajectories_per_min" in res:
                res["vs_grpo"] = round(res["trajectories_per_min"] / results["grpo"]["trajectories_per_min"], 3)
                print(f"GRPO step, {key}={LEARN_SETTINGS[key]} alone vs the filed settings: {res['vs_grpo']:.2f}x",
                      flush=True)
    if failed:
        print(f"gpu_check: sections failed: {', '.join(failed)}")
        return 1
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
