"""SmartSearch stages 1 and 2 and the held-out evaluation, each writing a directory that ends with its manifest.

- :func:`run_stage1` (screened imitation): sample with the policy (+ scripted teacher trajectories when the preset
  asks; with ``policy_warmup_steps`` the policy is first fine-tuned a few steps on the screened teacher
  trajectories, :func:`warm_up_policy`, a stand-in for the seed's strong sampling model), judge every round,
  screen (format, redundancy <= 1, every verdict 1, F1 >= min_f1), SFT on the kept ones with retrieved text
  masked (``mask_retrieved: false`` = the seed's unmasked SFT). Zero kept trajectories is not an error: the stage
  records it and passes its input model on.
- :func:`run_stage2` (query alignment): sample with the SFT model, judge, refine the low-quality rounds, continue
  each refined prefix with the same model, judge the regenerations, build pairs by the seed's rules, LoRA DPO,
  merge. Zero pairs passes the model on the same way.
- :func:`evaluate_model`: greedy agent evaluation on held-out sets, means with bootstrap intervals.

Every stage's data (trajectories, verdicts, refinements, screen decisions, pairs) is written as files under the
stage directory, which the flow logs as MLflow artifacts.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from evaluation.metrics import ScoreTable
from infra import artifacts
from training.smartsearch.config import SamplingSpec, SmartSearchConfig
from training.smartsearch.pairs import Scored, build_pairs, pair_counts, score, screen_reason

log = logging.getLogger(__name__)


class StageResult(BaseModel):
    """A finished SmartSearch stage: its checkpoint (or the input model passed on) and its counts."""

    stage: str = Field(description="sft | dpo | grpo.")
    dir: str = Field(description="Stage directory.")
    model: str = Field(description="HF folder of the stage's output policy (the input when it trained nothing).")
    trained: bool = Field(description="False when the stage had no data and passed its input on.")
    counts: dict[str, float] = Field(default_factory=dict, description="Sampled, kept, judged, refined, pairs...")
    losses: list[float] = Field(default_factory=list, description="Training loss per logged step.")
    seconds: float = Field(default=0.0, description="Wall time of the stage.")
    checkpoint: dict[str, Any] = Field(default_factory=dict, description="The engine's CheckpointRef fields.")


def finished(out_uri: str) -> StageResult | None:
    """The result of a completed stage directory, or None."""
    done = artifacts.read_manifest(out_uri)
    return StageResult.model_validate(done["result"]) if done and "result" in done else None


def protocol_for(cfg: SmartSearchConfig) -> Any:
    """The SmartSearch protocol with the preset's top-k, turn limit and template."""
    from training.protocols.base import load_protocol

    return load_protocol("smartsearch", top_k=cfg.top_k, max_turns=cfg.stage3.max_turns,
                         template=cfg.template)


def load_questions(sources: list[Any]) -> list[Any]:
    """Questions of every source (repo-relative paths or benchmark names), each cut to its limit."""
    from evaluation.benchmarks import load_benchmark

    return [q for s in sources for q in load_benchmark(s.path, limit=s.limit)]


def rollout_config(s: SamplingSpec) -> Any:
    """The rollout engine's settings for a sampling spec (the protocol's turn limit applies)."""
    from training.agent.rollout import RolloutConfig

    return RolloutConfig(n=s.n, temperature=s.temperature, best_of=1, seed=s.seed,
                         max_tokens_per_turn=s.max_tokens_per_turn, max_total_tokens=s.max_total_tokens)


def sample(cfg: SmartSearchConfig, model: str, questions: list[Any], s: SamplingSpec, searcher: Any
           ) -> tuple[list[Any], Any, Any]:
    """Trajectories of ``model`` on ``questions`` (n per question); returns (trajectories, generator, tokenizer)."""
    from training.agent.rollout import run_rollouts
    from training.generation.hf import TransformersGenerator
    from training.generation.models import resolve_policy

    gen = TransformersGenerator.from_model(resolve_policy(model))
    trajs = run_rollouts(questions, protocol_for(cfg), gen, searcher, rollout_config(s), gen.tokenizer)
    return trajs, gen, gen.tokenizer


def teacher_trajectories(cfg: SmartSearchConfig, tokenizer: Any) -> list[Any]:
    """Scripted strong-policy trajectories: warm-up episodes replayed through the rollout engine."""
    from types import SimpleNamespace

    from training.rl.warmup import warmup_sources
    from training.warmup.renderers import render_episode

    w = cfg.stage1.teacher
    if w is None:
        return []
    shim = SimpleNamespace(retrieval=cfg.retrieval, top_k=cfg.top_k,
                           stages=[SimpleNamespace(top_k=cfg.top_k, max_turns=cfg.stage3.max_turns)],
                           template=cfg.template, stage_top_k=lambda stage: stage.top_k or cfg.top_k)
    sources, _ = warmup_sources(shim, w)
    protocol = protocol_for(cfg)
    out = []
    for episodes in sources.values():
        for i, ep in enumerate(episodes):
            traj, _ = render_episode(protocol, ep, tokenizer, w.max_fact_words)
            out.append(traj.model_copy(update={"sample": 500 + i}))
    return out


def sft_rows(kept: list[Any], tokenizer: Any, mask_retrieved: bool) -> list[dict[str, Any]]:
    """Tokenized SFT rows (prompt masked; retrieved text masked unless ``mask_retrieved`` is False)."""
    from training.warmup.renderers import IGNORE_INDEX, full_tokens, segments_of

    rows = []
    for t in kept:
        ids, labels = full_tokens(tokenizer, t.prompt, segments_of(t))
        if not mask_retrieved:
            n_prompt = len(ids) - len(tokenizer(t.response, add_special_tokens=False)["input_ids"])
            first = next((i for i, lab in enumerate(labels) if lab != IGNORE_INDEX), n_prompt)
            labels = [IGNORE_INDEX] * first + ids[first:]
        rows.append({"question_id": t.question_id, "input_ids": ids, "labels": labels})
    return rows


def sft_fit(rows: list[dict[str, Any]], cutoff_len: int) -> dict[str, int]:
    """How many SFT rows the trainer keeps: ``training.sft.launcher.write_tokenized_dataset`` drops rows longer
    than ``cutoff_len`` and rows without a supervised token (counted here so ``counts.json`` tells the truth)."""
    from training.warmup.renderers import IGNORE_INDEX

    over = sum(len(r["input_ids"]) > cutoff_len for r in rows)
    empty = sum(len(r["input_ids"]) <= cutoff_len and all(lab == IGNORE_INDEX for lab in r["labels"]) for r in rows)
    return {"kept": len(rows) - over - empty, "over_cutoff": over, "no_labels": empty}


def _write_records(out: Path, name: str, rows: list[Any]) -> None:
    artifacts.write_jsonl(out / name, [r.model_dump(mode="json") if hasattr(r, "model_dump") else r for r in rows])


def run_stage1(cfg: SmartSearchConfig, judge: Any, searcher: Any, out_uri: str,
               mlflow_run_id: str | None = None) -> StageResult:
    """Stage 1 (module docstring); skipped when the directory is complete."""
    from training.generation.models import resolve_policy
    from training.sft.launcher import train_sft_tokenized

    done = finished(out_uri)
    if done is not None:
        return done
    t0, out = time.perf_counter(), artifacts.local_path(out_uri)
    s1 = cfg.stage1
    policy, warm_counts = s1.policy or cfg.model, dict[str, float]()
    if s1.policy_warmup_steps:
        from training.generation.models import load_tokenizer

        tok0 = load_tokenizer(resolve_policy(policy))
        teacher = teacher_trajectories(cfg, tok0)
        t_verdicts = judge.judge_trajectories(teacher)
        policy, warm_counts = warm_up_policy(cfg, teacher, t_verdicts, tok0, out / "warmup")
        sampled, _, tok = sample(cfg, policy, load_questions(s1.questions), s1.sampling, searcher)
        verdicts = [*judge.judge_trajectories(sampled), *t_verdicts]
    else:
        sampled, _, tok = sample(cfg, policy, load_questions(s1.questions), s1.sampling, searcher)
        teacher = teacher_trajectories(cfg, tok)
        verdicts = judge.judge_trajectories([*sampled, *teacher])
    pool = [*sampled, *teacher]
    sources = ["policy"] * len(sampled) + ["teacher"] * len(teacher)
    scored = [score(t, v, src) for t, v, src in zip(pool, verdicts, sources, strict=True)]
    reasons = [_screen(cfg, s) for s in scored]
    kept = [t for t, r in zip(pool, reasons, strict=True) if r == "kept"]
    _write_records(out, "trajectories.jsonl", pool)
    _write_records(out, "verdicts.jsonl", [v for vs in verdicts for v in vs])
    _write_records(out, "screen.jsonl", [{**s.model_dump(mode="json", exclude={"prompt", "response"}),
                                          "decision": r} for s, r in zip(scored, reasons, strict=True)])
    counts: dict[str, float] = {"sampled_policy": len(sampled), "sampled_teacher": len(teacher),
                                "kept": len(kept), **_verdict_counts(verdicts, pool), **warm_counts}
    for src in ("policy", "teacher"):
        own = [(t, vs) for t, vs, s_ in zip(pool, verdicts, sources, strict=True) if s_ == src]
        counts |= {f"{k}_{src}": v for k, v in _verdict_counts([vs for _, vs in own], [t for t, _ in own]).items()}
    counts |= {f"kept_{src}": sum(1 for s, r in zip(scored, reasons, strict=True) if r == "kept" and s.source == src)
               for src in ("policy", "teacher")}
    counts |= {f"dropped_{k}": v for k, v in Counter(r for r in reasons if r != "kept").items()}
    model, trained, ckpt, losses = str(resolve_policy(cfg.model)), False, {}, []
    rows = sft_rows(kept, tok, s1.mask_retrieved)
    fits = sft_fit(rows, s1.sft.cutoff_len)
    counts |= {"sft_rows": len(rows), "sft_rows_trained": fits["kept"],
               "sft_rows_over_cutoff": fits["over_cutoff"], "sft_rows_no_labels": fits["no_labels"]}
    if fits["over_cutoff"]:
        log.warning("stage 1: %d of %d kept trajectories are longer than sft.cutoff_len=%d and are not trained on",
                    fits["over_cutoff"], len(rows), s1.sft.cutoff_len)
    if fits["kept"]:
        data = out / "sft_rows.jsonl"
        artifacts.write_jsonl(data, rows)
        ref = train_sft_tokenized(s1.sft, data, str(resolve_policy(cfg.model)), out / "sft",
                                  mlflow_run_id=mlflow_run_id, run_name="stage1-sft")
        model, trained, ckpt = ref.uri, True, ref.model_dump()
        counts["sft_rows_trained"] = float(ref.n_examples or fits["kept"])
        losses = [r["loss"] for r in artifacts.read_jsonl(out / "sft" / "loss_curve.jsonl")]
    else:
        log.warning("stage 1 has no trajectory to train on (%s); SFT skipped, the initial model goes on", dict(counts))
    return _finish(out, "sft", str(model), trained, counts, losses, t0, ckpt)


def _screen(cfg: SmartSearchConfig, s: Scored) -> str:
    sc = cfg.stage1.screen
    return screen_reason(s, sc.min_f1, sc.require_format, sc.failed_verdict, cfg.judge.max_redundancy)


def warm_up_policy(cfg: SmartSearchConfig, teacher: list[Any], verdicts: list[list[Any]], tokenizer: Any,
                   out: Path) -> tuple[str, dict[str, float]]:
    """``stage1.policy_warmup_steps``: fine-tune ``cfg.model`` that many steps on the teacher trajectories the
    stage-1 screen keeps; returns (the checkpoint the policy samples from, ``warmup_*`` counts).

    A stand-in for the seed's strong sampling policy (a 135M base model never writes ``<search>``, so none of its
    rounds would reach the judge); the same screen and SFT settings as the stage's own SFT, fewer steps. With no
    kept teacher row the initial policy is sampled as it is (counted, logged)."""
    from training.generation.models import resolve_policy
    from training.sft.launcher import train_sft_tokenized

    s1 = cfg.stage1
    kept = [t for t, v in zip(teacher, verdicts, strict=True) if _screen(cfg, score(t, v, "teacher")) == "kept"]
    rows = sft_rows(kept, tokenizer, s1.mask_retrieved)
    fits = sft_fit(rows, s1.sft.cutoff_len)
    counts: dict[str, float] = {"warmup_rows": fits["kept"], "warmup_steps": 0}
    policy = s1.policy or cfg.model
    if not fits["kept"]:
        log.warning("stage 1 policy warm-up: no teacher trajectory passed the screen; the policy samples as it is")
        return policy, counts
    artifacts.write_jsonl(out / "sft_rows.jsonl", rows)
    # not reported into the stage's MLflow run (the stage's own SFT reports there; a second trainer's params would
    # clash); its loss curve stays in warmup/sft/ and its counts in counts.json
    sft = s1.sft.model_copy(update={"max_steps": s1.policy_warmup_steps, "report_to_mlflow": False})
    ref = train_sft_tokenized(sft, out / "sft_rows.jsonl", str(resolve_policy(policy)), out / "sft",
                              run_name="stage1-policy-warmup")
    counts["warmup_steps"] = float(ref.steps or s1.policy_warmup_steps)
    curve = artifacts.read_jsonl(out / "sft" / "loss_curve.jsonl")
    counts |= {"warmup_loss_first": curve[0]["loss"], "warmup_loss_last": curve[-1]["loss"]} if curve else {}
    return ref.uri, counts


def model_written_rounds(trajs: list[Any], verdicts: list[list[Any]]) -> int:
    """Judged rounds with no executed search behind them: ``</result>`` blocks the policy wrote itself (the judge
    judges every ``</result>`` of the text, as the seed's does; this count tells them from real searches)."""
    return sum(max(0, len(vs) - sum("</result>" in turn.inserted for turn in t.turns))
               for t, vs in zip(trajs, verdicts, strict=True))


def _verdict_counts(verdicts: list[list[Any]], trajs: list[Any] | None = None) -> dict[str, float]:
    flat = [v for vs in verdicts for v in vs]
    written = {"rounds_model_written": model_written_rounds(trajs, verdicts)} if trajs is not None else {}
    return {"rounds_judged": len(flat), **written, "verdict_1": sum(v.verdict == 1 for v in flat),
            "verdict_0": sum(v.verdict == 0 for v in flat), "verdict_failed": sum(v.verdict is None for v in flat),
            "redundant_rounds": sum(v.redundancy > 1 for v in flat), "low_quality": sum(v.low_quality for v in flat)}


def _finish(out: Path, stage: str, model: str, trained: bool, counts: dict[str, float], losses: list[float],
            t0: float, ckpt: dict[str, Any]) -> StageResult:
    result = StageResult(stage=stage, dir=str(out), model=model, trained=trained, counts=counts, losses=losses,
                         seconds=time.perf_counter() - t0, checkpoint=ckpt)
    artifacts.write_json(out / "counts.json", counts)
    artifacts.write_manifest(out, kind="smartsearch_stage", stage=stage, result=result.model_dump())
    return result


def run_stage2(cfg: SmartSearchConfig, judge: Any, refiner: Any, searcher: Any, init_model: str,
               out_uri: str) -> StageResult:
    """Stage 2 (module docstring); ``refiner`` = (EndpointClient, RefinerSpec); skipped when complete."""
    from training.generation.models import resolve_policy
    from training.smartsearch.dpo import train_dpo
    from training.smartsearch.refine import continue_from_prefixes, refine_rounds, refined_prefix, unpack_refiner

    done = finished(out_uri)
    if done is not None:
        return done
    init_model = str(resolve_policy(init_model))
    t0, out = time.perf_counter(), artifacts.local_path(out_uri)
    s2 = cfg.stage2
    originals, gen, tok = sample(cfg, init_model, load_questions(s2.questions), s2.sampling, searcher)
    verdicts = judge.judge_trajectories(originals)
    client, spec, support = unpack_refiner(refiner)
    refinements = refine_rounds(client, spec, originals, verdicts, cfg.judge.max_redundancy, support)
    by_key = {(t.question_id, t.sample): t for t in originals}
    prefixes = [refined_prefix(by_key[(r.question_id, r.sample)], r.round, r.refined_query)
                for r in refinements if r.refined_query]
    todo = [p for p in prefixes for _ in range(s2.regenerations)]
    regens = continue_from_prefixes(todo, protocol_for(cfg), gen, searcher, rollout_config(s2.sampling), tok)
    regen_verdicts = judge.judge_trajectories(regens)
    o_scored = [score(t, v) for t, v in zip(originals, verdicts, strict=True)]
    r_scored = [score(t, v, "regeneration", parent_sample=p.original_sample, refined_round=p.round)
                for t, v, p in zip(regens, regen_verdicts, todo, strict=True)]
    pairs = build_pairs(o_scored, r_scored, s2.min_f1, cfg.judge.max_redundancy)
    _write_records(out, "trajectories.jsonl", originals)
    _write_records(out, "regenerations.jsonl", regens)
    _write_records(out, "verdicts.jsonl", [v for vs in [*verdicts, *regen_verdicts] for v in vs])
    _write_records(out, "refinements.jsonl", refinements)
    _write_records(out, "scores.jsonl", [s.model_dump(mode="json", exclude={"prompt", "response"})
                                         for s in [*o_scored, *r_scored]])
    _write_records(out, "pairs.jsonl", pairs)
    counts: dict[str, float] = {
        "sampled": len(originals), "correct_originals": sum(s.f1 >= s2.min_f1 for s in o_scored),
        **_verdict_counts(verdicts, originals), "refine_requests": len(refinements),
        "refined": sum(r.refined_query is not None for r in refinements),
        "refine_failed": sum(r.refined_query is None for r in refinements), "regenerations": len(regens),
        "correct_regenerations": sum(s.f1 >= s2.min_f1 for s in r_scored),
        **{f"{k}_regenerations": v for k, v in _verdict_counts(regen_verdicts, regens).items()},
        **{f"pairs_{k}": v for k, v in pair_counts(pairs).items()}, "pairs": len(pairs),
        "endpoint_failed_calls": client.failures if client is not None else 0}
    del gen
    if not pairs:
        log.warning("stage 2 built no DPO pair (%s); DPO skipped, the SFT model goes on", counts)
        return _finish(out, "dpo", init_model, False, counts, [], t0, {})
    ref = train_dpo(s2.dpo, [p.model_dump() for p in pairs], init_model, out / "dpo")
    curve = artifacts.read_jsonl(out / "dpo" / "loss_curve.jsonl")
    losses = [r["loss"] for r in curve]
    margins = [r["rewards/margins"] for r in curve if "rewards/margins" in r]
    counts |= {"dpo_steps": len(curve), "dpo_loss_first": losses[0], "dpo_loss_last": losses[-1]} if losses else {}
    counts |= {"dpo_margin_first": margins[0], "dpo_margin_last": margins[-1]} if margins else {}
    return _finish(out, "dpo", ref.uri, True, counts, losses, t0, ref.model_dump())


def evaluate_model(cfg: SmartSearchConfig, model: str, out_uri: str) -> ScoreTable:
    """Greedy held-out evaluation: one row per benchmark, means with bootstrap intervals (``score_checkpoint``)."""
    from training.agent.evaluate import AgentEvalConfig, GeneratorSpec, score_checkpoint
    from training.agent.rollout import RolloutConfig

    rollout = RolloutConfig(temperature=0.0, best_of=1, top_k=cfg.top_k, max_turns=cfg.stage3.max_turns,
                            max_total_tokens=cfg.eval.max_new_tokens,
                            max_tokens_per_turn=min(cfg.eval.max_new_tokens, 512))
    ecfg = AgentEvalConfig(protocol="smartsearch", generator=GeneratorSpec(model=model), retrieval=cfg.retrieval,
                           rollout=rollout, limit=cfg.eval.limit)
    return score_checkpoint(ecfg, cfg.eval.benchmarks, out_uri, cfg.eval.confidence,
                            metrics=("em", "f1", "format_ok", "searches"))


def scored_from_file(path: str) -> list[Scored]:
    """Scores written by a stage (``scores.jsonl``) back as records (prompt/response left empty)."""
    return [Scored(prompt="", response="", **r) for r in artifacts.read_jsonl(path)]
