"""Stage functions of the ExSearch EM loop. Each reads refs (paths), writes one stage directory with ``manifest.json``
last and returns a small ref; a directory whose manifest exists is complete and its stage is skipped (logged as
``skipping <step>: already complete at <dir>``), a directory without one is wiped and redone.

Stages: ``build_warmup_data`` -> ``train_sft`` (training.sft.launcher) -> per iteration ``sample_trajectories`` ->
``score_stage`` -> ``select_stage`` -> ``train_sft(weight_mode=...)`` -> ``evaluate_checkpoint``; each returns a typed
record (``training.em.records``). Promotion and early stopping are the pure functions ``beats_champion`` and
``should_stop`` (``training.em.tracking.promote`` applies the first to the model registry); ``sampling_seed`` is the
per-iteration seed.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from evaluation.benchmarks import Question, load_benchmark
from evaluation.metrics import MetricSummary
from infra import artifacts
from infra.paths import resolve_path
from retrieval.open import open_searcher, passages_of
from training.em.config import EMLoopConfig
from training.em.records import EvalRef, SampleRef, ScoreRef, SelectRef, StageRef, WarmupDataRef
from training.generation.spec import generator_session
from training.refs import QuestionSource

log = logging.getLogger(__name__)


R = TypeVar("R", bound=StageRef)


def run_stage(
    step: str, out_dir: str | Path, body: Callable[[Path], dict[str, Any]], keep_parts: bool = False,
    record: type[R] = StageRef,  # type: ignore[assignment]
) -> R:
    """Run ``body(out_dir)`` unless ``out_dir`` is complete; write the manifest last; return ``record``.

    ``body`` returns the record's fields (besides ``step`` and ``path``); they are kept in the manifest's ``data``.

    An incomplete directory is wiped first, unless ``keep_parts``: then ``body`` is trusted to reuse only the
    sub-directories that have their own manifest (the evaluation stage keeps finished datasets).
    """
    out = Path(out_dir)
    done = artifacts.read_manifest(out)
    if done is not None:
        log.info("skipping %s: already complete at %s", step, out)
        return record.model_validate({**done.get("data", {}), "step": step, "path": str(out)})
    if out.exists() and not keep_parts:
        log.info("redoing %s: %s has no manifest (interrupted earlier)", step, out)
        shutil.rmtree(out)
    elif out.exists():
        log.info("resuming %s in %s: parts with a manifest are kept", step, out)
    out.mkdir(parents=True, exist_ok=True)
    data = body(out)
    ref = record.model_validate({**data, "step": step, "path": str(out)})  # a wrong field fails before the manifest
    artifacts.write_manifest(out, stage=step, data=data)
    return ref


def load_questions(sources: list[QuestionSource]) -> list[Question]:
    """Questions from every source, in order (each capped by its limit)."""
    out: list[Question] = []
    for s in sources:
        out += load_benchmark(s.path, limit=s.limit)
    return out


def build_warmup_data(cfg: EMLoopConfig, out_dir: str | Path) -> WarmupDataRef:
    """Warm-up chats from decompositions (+ retriever), FireAct and the user's LLaMA-Factory datasets; validator
    counts in the manifest."""
    from training.warmup import sources as warmup

    def body(out: Path) -> dict[str, Any]:
        rows, stats = [], []
        w = cfg.warmup
        if w.decomposition_files:
            spec = w.retriever(cfg.retrieval)
            passages, searcher = passages_of(spec), open_searcher(spec)
            r, s = warmup.from_decompositions(load_questions(w.decomposition_files), searcher, passages, w.top_k or 3)
            rows, stats = rows + r, [*stats, s]
        if w.fireact_file:
            chats = artifacts.read_jsonl(resolve_path(w.fireact_file))[: w.fireact_limit]
            r, s = warmup.from_fireact(chats)
            rows, stats = rows + r, [*stats, s]
        for src in w.lf_datasets:
            r, s = warmup.from_lf_dataset(resolve_path(src.dataset_info), src.name, src.limit)
            rows, stats = rows + r, [*stats, s]
        artifacts.write_jsonl(out / "warmup.jsonl", rows)
        artifacts.write_json(out / "stats.json", [s.model_dump() for s in stats])
        return {"data": str(out / "warmup.jsonl"), "n": len(rows), "stats": [s.model_dump() for s in stats]}

    return run_stage("warmup_data", out_dir, body, record=WarmupDataRef)


def sampling_seed(cfg: EMLoopConfig, iteration: int) -> int:
    """The E-step's seed in ``iteration``: the preset's rollout seed, moved by 1000 per iteration (fresh samples
    each iteration, the same ones on a re-run)."""
    return (cfg.sampling.rollout.seed or 0) + 1000 * iteration


def sample_trajectories(cfg: EMLoopConfig, model_path: str, out_dir: str | Path, seed: int) -> SampleRef:
    """E-step sampling: K rollouts per training question with the live retriever."""
    from training.agent.records import write_trajectories
    from training.agent.rollout import run_rollouts

    def body(out: Path) -> dict[str, Any]:
        questions = load_questions(cfg.sampling.questions)
        rollout = cfg.sampling.rollout.model_copy(update={"seed": seed})
        with generator_session(cfg.sampling.generator.model_copy(update={"model": model_path})) as gen:
            trajs = run_rollouts(questions, cfg.protocol, gen, open_searcher(cfg.retrieval), rollout)
        write_trajectories(trajs, out / "trajectories", model=model_path, seed=seed)
        finished = sum(t.final_answer is not None for t in trajs)
        return {"trajectories": str(out / "trajectories"), "n": len(trajs), "finished": finished,
                "format_ok": sum(bool(t.format_ok) for t in trajs), "questions": len(questions)}

    return run_stage("sample", out_dir, body, record=SampleRef)


def trajectory_messages(traj: Any) -> list[dict[str, str]] | None:
    """Chat messages of a finished ExSearch trajectory (None when it never reached the answer turn)."""
    from training.protocols.exsearch import split_chatml

    if traj.final_answer is None:
        return None
    msgs = split_chatml(traj.prompt + traj.response)
    # the answer turn may be empty: the E-step replaces it with the gold answer anyway
    return msgs if msgs and msgs[-1]["role"] == "assistant" else None


def score_stage(cfg: EMLoopConfig, model_path: str, traj_dir: str, out_dir: str | Path) -> ScoreRef:
    """E-step scoring with the current model; F1/EM of each trajectory's own prediction alongside."""
    from evaluation.metrics import answer_metrics
    from training.agent.records import read_trajectories
    from training.em.scoring import ScoringInput, score_trajectories

    def body(out: Path) -> dict[str, Any]:
        trajs = read_trajectories(traj_dir)
        items, meta = [], {}
        for i, t in enumerate(trajs):
            msgs = trajectory_messages(t)
            if msgs is None or not t.golden_answers:
                continue
            tid = f"{t.question_id}#{t.sample}#{i}"
            items.append(ScoringInput(trajectory_id=tid, question_id=t.question_id, messages=msgs,
                                      gold_answer=t.golden_answers[0]))
            m = answer_metrics(t.final_answer, t.golden_answers)
            meta[tid] = {"f1": m["f1"], "correct": m["acc"], "gold": t.golden_answers[0], "messages": msgs}
        scores = score_trajectories(items, model_path, cfg.scoring)
        rows = [{**s.model_dump(), **meta[s.trajectory_id]} for s in scores]
        artifacts.write_jsonl(out / "scores.jsonl", rows)
        return {"scores": str(out / "scores.jsonl"), "n_scored": len(rows), "unfinished": len(trajs) - len(items)}

    return run_stage("score", out_dir, body, record=ScoreRef)


def select_stage(cfg: EMLoopConfig, scores_path: str, out_dir: str | Path) -> SelectRef:
    """E-step weights; writes the weighted training file (gold answer substituted), weights and histogram."""
    from training.em.scoring import with_gold_answer
    from training.em.selection import Scored, count_empty_facts, select_weights, weight_histogram

    def body(out: Path) -> dict[str, Any]:
        rows = {r["trajectory_id"]: r for r in artifacts.read_jsonl(scores_path)}
        scored = [Scored(question_id=r["question_id"], trajectory_id=r["trajectory_id"],
                         sum_logprob=float("nan") if r["sum_logprob"] is None else r["sum_logprob"],
                         n_tokens=r["n_tokens"], f1=r["f1"], correct=r["correct"],
                         empty_facts=count_empty_facts(r.get("messages") or [])) for r in rows.values()]
        selected, stats = select_weights(scored, cfg.selection, samples_per_question=cfg.sampling.rollout.n)
        train = []
        for w in selected:
            r = rows[w.trajectory_id]
            gold_msgs = with_gold_answer(r["messages"], r["gold"])
            train.append({"messages": gold_msgs, "weight": w.weight, "prob": w.prob, "question_id": w.question_id})
        artifacts.write_jsonl(out / "train.jsonl", train)
        artifacts.write_jsonl(out / "weights.jsonl", [w.model_dump() for w in selected])
        hist = weight_histogram([w.w for w in selected])
        artifacts.write_json(out / "histogram.json", hist)
        artifacts.write_json(out / "stats.json", stats.model_dump())
        return {"train": str(out / "train.jsonl"), "n_train": len(train), "stats": stats.model_dump()}

    return run_stage("select", out_dir, body, record=SelectRef)


def evaluate_checkpoint(cfg: EMLoopConfig, model_path: str, out_dir: str | Path) -> EvalRef:
    """Held-out evaluation through the evaluation stage (``training.agent.evaluate.evaluate_dataset``, one directory per
    dataset: trajectories, predictions, per-example metrics), then EM/F1/acc with bootstrap intervals per dataset.

    The record is the loops' one evaluation record: an :class:`~evaluation.metrics.ScoreTable` (what RL and
    SmartSearch evaluation return) that also names the stage directory."""
    from evaluation.metrics import aggregate
    from training.agent.evaluate import AgentEvalConfig, evaluate_dataset

    def body(out: Path) -> dict[str, Any]:
        ev = cfg.evaluation
        agent = AgentEvalConfig(protocol=cfg.protocol, retrieval=cfg.retrieval, rollout=ev.rollout,
                                generator=ev.generator.model_copy(update={"model": model_path}))
        searcher, examples = open_searcher(cfg.retrieval), []
        with generator_session(agent.generator) as gen:
            for s in ev.questions:
                name = Path(s.path).name.removesuffix(".jsonl")
                ref = evaluate_dataset(agent.model_copy(update={"limit": s.limit}), s.path,
                                       out / name, generator=gen, searcher=searcher)
                examples += artifacts.read_jsonl(Path(ref.uri) / "examples.jsonl")
        table = aggregate(examples, ["em", "f1", "acc", "format_ok", "searches"], confidence=ev.confidence,
                          n_resamples=ev.n_resamples)
        artifacts.write_json(out / "table.json", table.model_dump())
        artifacts.write_jsonl(out / "examples.jsonl", examples)
        pooled = table.pooled.metrics  # kept in the manifest for readers of the pre-table records
        summary = {k: pooled[k].model_dump() for k in ("em", "f1", "acc", "format_ok") if k in pooled}
        return {**table.model_dump(), "n": len(examples), "metrics": summary, "table": str(out / "table.json")}

    return run_stage("evaluate", out_dir, body, keep_parts=True, record=EvalRef)


def beats_champion(candidate: MetricSummary, champion: MetricSummary | None) -> bool:
    """True when the candidate's held-out F1 mean is above the champion's bootstrap interval (its upper bound)."""
    if champion is None:
        return True
    return candidate.mean > champion.high


def should_stop(f1_history: list[float], drops: int = 2) -> bool:
    """True when held-out F1 fell ``drops`` iterations in a row (history includes the warm-up evaluation)."""
    if len(f1_history) < drops + 1:
        return False
    tail = f1_history[-(drops + 1):]
    return all(b < a for a, b in zip(tail, tail[1:], strict=False))


def align_stage(cfg: EMLoopConfig, data: str, model_path: str, out_dir: str | Path, weight_mode: str,
                mlflow_run_id: str | None, run_name: str) -> Any:
    """M-step: weighted training from ``model_path``; with no selected trajectory the checkpoint is carried over
    unchanged (recorded in the manifest as ``carried_over``) instead of failing the iteration."""
    from training.refs import CheckpointRef
    from training.sft.launcher import train_sft

    if not artifacts.read_jsonl(data):
        out = Path(out_dir)
        done = artifacts.read_manifest(out)
        if done is None:
            log.warning("selection kept no trajectory: carrying %s over unchanged", model_path)
            ref = CheckpointRef(uri=model_path, base_model=model_path, n_examples=0)
            out.mkdir(parents=True, exist_ok=True)
            artifacts.write_manifest(out, stage="train_sft", checkpoint=ref.model_dump(), carried_over=True)
            return ref
        return CheckpointRef.model_validate(done["checkpoint"])
    return train_sft(cfg.alignment, data, model_path, out_dir, weight_mode=weight_mode,
                     mlflow_run_id=mlflow_run_id, run_name=run_name)
