"""The EM recipe's own held-out signal: the gold answer's mean per-token log-likelihood after the model's own
greedy trajectory, ``(1/|y*|) log p(y* | x, z_greedy)`` (the quantity the E-step weights by and the M-step raises).

For a finished ExSearch trajectory the final assistant message is replaced by the gold answer; for an unfinished one
(cut by a length/turn limit) the forced end-search user turn is appended first, as the protocol does after its last
search, so every held-out question gets a finite score. Scored with ``training.em.scoring`` (answer tokens only).
"""

from __future__ import annotations

import math
from typing import Any

from training.agent.records import Trajectory
from training.em.records import HeldoutRef, SampleRef, SelectRef
from training.em.scoring import ScoringConfig, ScoringInput, score_trajectories


def answer_messages(traj: Trajectory) -> list[dict[str, str]]:
    """The trajectory's chat ending with an assistant answer turn (content replaced by the scorer)."""
    from training.protocols.exsearch import FINAL_SENTENCE, split_chatml

    msgs = [dict(m) for m in split_chatml(traj.prompt + traj.response)]
    if traj.final_answer is not None and msgs and msgs[-1]["role"] == "assistant":
        return msgs
    if msgs and msgs[-1]["role"] == "assistant" and not msgs[-1]["content"].strip():
        msgs = msgs[:-1]  # an empty open assistant turn
    if msgs and msgs[-1]["role"] == "user" and "end search." in msgs[-1]["content"]:
        return [*msgs, {"role": "assistant", "content": ""}]
    final = FINAL_SENTENCE.format(question=traj.question)
    return [*msgs, {"role": "user", "content": final}, {"role": "assistant", "content": ""}]


def answer_loglik_reward_fn(model_path: str, cfg: ScoringConfig | None = None, model: Any = None,
                            tokenizer: Any = None) -> Any:
    """A held-out ``RewardFn``: mean per-token gold log-likelihood after each trajectory (NaN without a gold)."""
    scoring = (cfg or ScoringConfig()).model_copy(update={"tokens": "answer"})

    def fn(trajs: list[Trajectory]) -> list[float]:
        items = [ScoringInput(trajectory_id=f"{t.question_id}#{i}", question_id=t.question_id,
                              messages=answer_messages(t), gold_answer=t.golden_answers[0])
                 for i, t in enumerate(trajs) if t.golden_answers]
        scores = {s.trajectory_id: s for s in score_trajectories(items, model_path, scoring, model, tokenizer)}
        out = []
        for i, t in enumerate(trajs):
            s = scores.get(f"{t.question_id}#{i}")
            out.append(s.sum_logprob / s.n_tokens if s is not None and s.n_tokens else math.nan)
        return out

    return fn


def train_question_ids(cfg: Any) -> list[str]:
    """Every question id a training stage of ``cfg`` (an ``EMLoopConfig``) reads: warm-up decompositions, FireAct
    chats (``fireact:<sha1 of the question>[:12]``, they carry no id) and the E-step sampling questions."""
    import hashlib

    from infra import artifacts
    from infra.paths import resolve_path
    from training.em.stages import load_questions

    ids = [q.id for q in load_questions(list(cfg.warmup.decomposition_files) + list(cfg.sampling.questions))]
    if cfg.warmup.fireact_file:
        for chat in artifacts.read_jsonl(resolve_path(cfg.warmup.fireact_file))[: cfg.warmup.fireact_limit]:
            text = next((m["content"] for m in chat.get("messages", []) if m.get("role") == "user"), "")
            ids.append("fireact:" + hashlib.sha1(text.encode()).hexdigest()[:12])
    return ids


def heldout_stage(cfg: Any, model_path: str, out_dir: Any) -> HeldoutRef:
    """Greedy held-out evaluation of ``model_path`` (rows in ``heldout.jsonl``; manifest last, skipped when done)."""
    from pathlib import Path

    from retrieval.open import open_searcher
    from training.agent.heldout import build_heldout, check_disjoint, evaluate_heldout, means
    from training.em.stages import run_stage
    from training.generation.spec import GeneratorSpec, open_generator

    learn = cfg.learning

    def body(out: Path) -> dict[str, Any]:
        questions = build_heldout(learn.heldout)
        check_disjoint(train_question_ids(cfg), questions)
        gen = open_generator(GeneratorSpec(model=model_path, backend="transformers", batch_size=learn.batch_size))
        reward = answer_loglik_reward_fn(model_path, cfg.scoring, model=gen.model, tokenizer=gen.tokenizer)
        rows = evaluate_heldout(questions, cfg.protocol, gen, open_searcher(cfg.retrieval), learn.rollout, reward,
                                out / "heldout.jsonl")
        return {"rows": str(out / "heldout.jsonl"), "n": len(rows), "means": means(rows), "model": model_path}

    return run_stage("heldout", out_dir, body, record=HeldoutRef)


def curve_row(iteration: int, heldout: HeldoutRef | None, sample: SampleRef | None = None,
              select: SelectRef | None = None, loss: float | None = None) -> dict[str, Any]:
    """One learning-curve point of an EM iteration (0 = the warm-up checkpoint, the EM start)."""
    row: dict[str, Any] = {"iteration": iteration}
    if heldout:
        m = heldout.means
        row.update(heldout_reward=m["reward"], heldout_f1=m["f1"], heldout_em=m["em"],
                   heldout_format_ok=m["format_ok"], heldout_searches=m["n_searches"])
    if sample and sample.n:
        row.update(sample_format_ok=sample.format_ok / sample.n, sample_finished=sample.finished / sample.n)
    if select:
        if math.isfinite(select.stats.mean_ess):
            row["select_mean_ess"] = select.stats.mean_ess
        row["n_train"] = float(select.n_train)
    if loss is not None and math.isfinite(loss):
        row["train_loss"] = loss
    return row


def write_learning_report(cfg: Any, start: HeldoutRef, final: HeldoutRef, curve: list[dict[str, Any]],
                          run_id: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The paired start-vs-final report of an EM run (``training.agent.heldout.report_learning``): under
    ``<experiment>/learning``, copied to ``learning.evidence_dir`` (repo-relative allowed), logged to run ``run_id``."""
    from pathlib import Path

    from evaluation.criteria import question_groups
    from infra import artifacts
    from infra.paths import repo_path
    from training.agent.heldout import build_heldout, report_learning

    learn = cfg.learning
    if learn is None:
        raise ValueError("write_learning_report needs cfg.learning (the held-out recipe)")
    evidence = repo_path(learn.evidence_dir) if learn.evidence_dir else None
    read = artifacts.read_jsonl
    return report_learning(learn.recipe, read(start.rows), read(final.rows), train_question_ids(cfg),
                           Path(final.path).parent.parent / "learning", curve=curve, x="iteration",
                           evidence_dir=evidence, mlflow_run_id=run_id, n_resamples=learn.n_resamples,
                           groups=question_groups(build_heldout(learn.heldout), learn.split_by),
                           start_checkpoint=start.model, final_checkpoint=final.model, **extra)
