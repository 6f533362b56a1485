"""Held-out evidence that an RL recipe learned: the start and final policies scored on the same questions.

The shared learning-evidence library (``training.agent.heldout``: held-out set, rows, paired bootstrap, plots,
evidence folder) does the work; this module supplies the RL side:

- the held-out questions from the preset (``eval.benchmarks`` from row ``eval.offset``, ``eval.limit`` each; the
  learn presets take rows 50-119 of each dev file, the same 210 questions as every recipe), retrieved over
  ``eval.corpus``;
- ``reward``: the last stage's own reward computed by the very function TRL trains with
  (``training.rewards.adapters.trl_reward_func``: the same response text and token ids, so ReSearch's EOS check
  applies), and F1 / EM / cover-EM under the preset's normalization (R1-Searcher's own rule for R1-Searcher):
  ``cover_em`` is FlashRAG's ``acc`` (a gold is a substring of the prediction), ``cem`` is R1-Searcher's token
  cover-EM (every gold token in the prediction's tokens, any order: "France, Paris" covers "Paris France");
- ``acc_l``: LLM-judged accuracy (``evaluation.judge``; R1-Searcher's True/False prompt for R1-Searcher, ReSearch's
  JSON prompt otherwise) when a judge endpoint is configured (``SEARCHLOOP_JUDGE_BASE_URL`` ...); absent otherwise;
- :func:`heldout_curve_callback`: the live policy scored on an even spread of held-out questions during training;
- :func:`write_learning_report`: the learning curve (per-step training health + the held-out curve) and the paired
  start-vs-final report, evidence folder and MLflow artifacts (``training.agent.heldout.report_learning``).
"""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from infra import artifacts
from infra.config import StrictModel

log = logging.getLogger(__name__)

METRICS = ("reward", "f1", "em", "cover_em", "cem", "format_ok", "n_searches", "answer_retrieved")


def heldout_fields(*row_sets: list[dict[str, Any]]) -> tuple[str, ...]:
    """The summary's fields: :data:`METRICS` present in every row, plus ``acc_l`` when every row has a verdict."""
    rows = [r for rs in row_sets for r in rs]
    fields = tuple(f for f in METRICS if all(f in r for r in rows))
    if rows and all(isinstance(r.get("acc_l"), (int, float)) for r in rows):
        fields += ("acc_l",)
    return fields


def judged_accuracy(protocol: str, trajectories: list[Any]) -> list[float | None] | None:
    """ACC_L per trajectory (1/0, None for a failed call), or None when no judge endpoint is configured."""
    from evaluation.judge import JudgeItem, judge_answers, judge_config_from_env

    config = judge_config_from_env("r1searcher" if protocol == "r1searcher" else "research")
    if config is None:
        return None
    items = [JudgeItem(question=t.question, golden_answers=list(t.golden_answers), prediction=t.final_answer or "")
             for t in trajectories]
    result = judge_answers(items, config)
    log.info("held-out ACC_L: %s", result.message)
    return None if result.skipped else result.scores


class LearningRef(StrictModel):
    """The finished start-vs-final report of a recipe."""

    dir: str = Field(description="Evidence folder (rows, train_ids.txt, summary.json/md, curve, plots).")
    table: str = Field(description="Markdown before/after table with paired intervals.")
    improved: dict[str, bool] = Field(description="Field -> whether the paired interval of final - start is > 0.")
    n: int = Field(description="Held-out questions.")


def eval_config(cfg: Any, model: str) -> Any:
    """The agent-evaluation config (``training.agent.evaluate``) of a policy of RL preset ``cfg``: greedy, the
    preset's retriever (or ``eval.corpus``), the evaluation top-k and normalization."""
    from retrieval.open import RetrieverSpec
    from training.agent.evaluate import AgentEvalConfig
    from training.agent.rollout import RolloutConfig

    stage = cfg.stages[-1]
    retriever = RetrieverSpec(corpus=[cfg.eval.corpus]) if cfg.eval.corpus else cfg.retrieval
    rollout = RolloutConfig(temperature=0.0, best_of=1, top_k=cfg.eval_top_k(),
                            max_turns=stage.max_turns, max_total_tokens=cfg.eval.max_new_tokens, chunk=cfg.eval.chunk)
    generator = cfg.eval.generator.model_copy(update={"model": model})
    return AgentEvalConfig(protocol=cfg.protocol, generator=generator, retrieval=retriever, rollout=rollout,
                           limit=cfg.eval.limit, normalization=cfg.eval_normalization())


def heldout_questions(cfg: Any) -> list[Any]:
    """The preset's held-out questions: each ``eval.benchmarks`` file from row ``eval.offset``, ``eval.limit`` rows."""
    from evaluation.benchmarks import load_benchmark

    out = []
    for name in cfg.eval.benchmarks:
        qs = load_benchmark(name)[cfg.eval.offset:]
        out.extend(qs[: cfg.eval.limit] if cfg.eval.limit else qs)
    return out


def heldout_rows(cfg: Any, trajectories: list[Any], tokenizer: Any, judge: bool = True) -> list[dict[str, Any]]:
    """Evidence rows (``training.agent.heldout.heldout_row`` fields) with the last stage's TRL reward and the
    preset's answer normalization."""
    from evaluation.metrics import answer_metrics
    from training.agent.heldout import heldout_row
    from training.rewards.adapters import trl_reward_func

    last = cfg.stages[-1]
    reward = trl_reward_func(last.reward, eos_token_id=tokenizer.eos_token_id, **last.reward_options)
    scores = reward([t.prompt for t in trajectories], [t.response for t in trajectories],
                    golden_answers=[t.golden_answers for t in trajectories],
                    question=[t.question for t in trajectories],
                    completion_ids=[list(t.token_ids) for t in trajectories])
    acc_l = judged_accuracy(cfg.protocol, trajectories) if judge else None
    rows = []
    for i, (t, r) in enumerate(zip(trajectories, scores, strict=True)):
        m = answer_metrics(t.final_answer, t.golden_answers, cfg.eval_normalization())
        row = {**heldout_row(t, r), "f1": m["f1"], "em": m["em"], "cover_em": m["acc"], "cem": m["cem"]}
        if acc_l is not None:
            row["acc_l"] = acc_l[i]
        rows.append(row)
    return rows


def evaluate_heldout(cfg: Any, model: str, out_uri: str) -> str:
    """Greedy rollouts of ``model`` on the held-out questions -> ``out_uri/heldout.jsonl`` (+ trajectories,
    manifest last); returns the jsonl path. A directory with a manifest is reused."""
    from training.agent.evaluate import open_searcher
    from training.agent.heldout import means
    from training.agent.records import write_trajectories
    from training.agent.rollout import run_rollouts
    from training.generation.models import load_tokenizer, resolve_policy
    from training.generation.spec import generator_session

    path = artifacts.join(out_uri, "heldout.jsonl")
    if artifacts.read_manifest(out_uri) is not None:
        return path
    ecfg = eval_config(cfg, resolve_policy(model))
    questions = heldout_questions(cfg)
    from infra.memory import inference_heap

    t0 = time.perf_counter()
    # generation's blocks come from the heap, not fresh mmaps: after training fixed the threshold (the final
    # evaluation), and from the first block on before it (the start evaluation; training fixes it next anyway).
    # Leaving the block trims the heap: the training that follows starts from a small one.
    with inference_heap(force=True):
        # auto: the engine faster for this many questions; the session empties its KV store and closes a worker
        with generator_session(ecfg.generator, items=len(questions)) as generator:
            trajs = run_rollouts(questions, ecfg.protocol, generator, open_searcher(ecfg.retrieval), ecfg.rollout)
        seconds = time.perf_counter() - t0
        del generator  # the last reference: its weights go before the heap is trimmed
        gc.collect()
    rows = heldout_rows(cfg, trajs, load_tokenizer(resolve_policy(model)))
    write_trajectories(trajs, artifacts.join(out_uri, "trajectories"), protocol=cfg.protocol)
    artifacts.write_jsonl(path, rows)
    artifacts.write_manifest(out_uri, kind="rl_heldout", model=model, count=len(rows),
                             means=means(rows, heldout_fields(rows)), seconds=seconds)
    log.info("held-out %s: %d questions in %.0f s, %s", model, len(rows), seconds,
             means(rows, heldout_fields(rows)))
    return path


#: the packages whose code decides a held-out evaluation's rows (rollouts, generation, retrieval, metrics, rewards)
CODE_PACKAGES = ("training", "retrieval", "evaluation", "infra")
REPO_ROOT = Path(__file__).resolve().parents[2]


def code_fingerprint(root: Path = REPO_ROOT, packages: tuple[str, ...] = CODE_PACKAGES) -> str:
    """SHA-256 over every ``*.py`` file of ``packages`` under ``root`` (repo-relative path and bytes, sorted): any
    change to the code that rolls out, generates, retrieves or scores makes a new fingerprint."""
    files = sorted(f for pkg in packages for f in (root / pkg).rglob("*.py") if "__pycache__" not in f.parts)
    return artifacts.content_hash(part for f in files for part in (f.relative_to(root).as_posix(), f.read_bytes()))


def _model_fingerprint(model: str) -> str:
    """The policy's files (names and bytes) when it is a local folder or file; its name otherwise."""
    from training.generation.models import resolve_policy

    path = Path(resolve_policy(model))
    if path.is_file():
        return artifacts.file_sha256(str(path))
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if f.is_file())
        return artifacts.content_hash(part for f in files
                                      for part in (f.relative_to(path).as_posix(), artifacts.file_sha256(str(f))))
    return model


def start_cache_key(cfg: Any, model: str) -> str:
    """What a start evaluation's rows depend on, hashed: the policy's bytes, the questions, the evaluation config
    (its ``backend: auto`` resolved for this many questions), the recipe's reward and normalization, the code
    (:func:`code_fingerprint`), library versions, this machine (device, CPU, cores, native bf16) and torch's threads."""
    import torch

    from infra.config import config_hash
    from training.generation.choice import machine_key
    from training.generation.models import resolve_policy

    questions = heldout_questions(cfg)
    ecfg = eval_config(cfg, resolve_policy(model))
    ecfg = ecfg.model_copy(update={"generator": ecfg.generator.resolved(len(questions))})
    last = cfg.stages[-1]
    return config_hash({
        "model": _model_fingerprint(model), "questions": [q.model_dump(mode="json") for q in questions],
        "eval": ecfg.model_dump(mode="json"), "reward": [last.reward, last.reward_options],
        "normalization": cfg.eval_normalization(), "protocol": cfg.protocol, "code": code_fingerprint(),
        "versions": artifacts.library_versions(), "machine": machine_key(), "threads": torch.get_num_threads()})


def start_cache_dir(cfg: Any, model: str) -> str:
    """``<runs>/rl/heldout_cache/<key>``: where a start evaluation is kept for the next run that starts from the same
    policy with the same questions, settings, code and machine."""
    from infra.settings import get_settings

    return str(get_settings().runs_dir / "rl" / "heldout_cache" / start_cache_key(cfg, model))


def _copy_dir(src: str, dst: str, note: dict[str, Any] | None = None) -> None:
    """Copy a complete directory (manifest included) to ``dst`` through a temporary sibling and a rename; ``note``
    is written as ``reused.json`` into the copy."""
    import shutil
    import uuid

    src_p, dst_p = artifacts.local_path(src), artifacts.local_path(dst)
    tmp = dst_p.with_name(f".{dst_p.name}.tmp-{uuid.uuid4().hex[:8]}")
    shutil.copytree(src_p, tmp)
    if note is not None:
        artifacts.write_json(str(tmp / "reused.json"), note)
    if dst_p.exists():  # an incomplete earlier attempt (no manifest): replaced
        shutil.rmtree(dst_p)
    tmp.rename(dst_p)


def _evaluate_in_child(cfg_json: str, model: str, out_uri: str) -> None:
    """Child-process entry of :func:`evaluate_isolated` (module level, so a spawned process can import it)."""
    from training.rl.config import RLConfig

    evaluate_heldout(RLConfig.model_validate_json(cfg_json), model, out_uri)


def evaluate_isolated(cfg: Any, model: str, out_uri: str) -> str:
    """:func:`evaluate_heldout` in a fresh spawned process (``eval.isolate_start``): the same rows, and this process's
    heap never holds the evaluation's generation blocks. Raises when the child fails or leaves no manifest."""
    import multiprocessing

    from infra.errors import SearchloopError

    path = artifacts.join(out_uri, "heldout.jsonl")
    if artifacts.read_manifest(out_uri) is not None:
        return path
    child = multiprocessing.get_context("spawn").Process(
        target=_evaluate_in_child, args=(cfg.model_dump_json(), model, out_uri), name="heldout-start")
    child.start()
    child.join()
    if child.exitcode != 0 or artifacts.read_manifest(out_uri) is None:
        raise SearchloopError(f"the held-out evaluation of {model} in a child process failed (exit code "
                              f"{child.exitcode}; its log is above); eval.isolate_start=false runs it in this process")
    return path


def evaluate_start(cfg: Any, model: str, out_uri: str) -> str:
    """The start policy's held-out rows (:func:`evaluate_heldout`), reused from :func:`start_cache_dir` when an
    earlier run evaluated the same policy bytes on the same questions with the same settings, code and machine
    (``eval.reuse_start``; local paths only). Greedy rollouts are deterministic there, so the copy is what this run
    would compute; a run that computes it leaves a copy for the next. With ``eval.isolate_start`` it is computed in
    a fresh process (:func:`evaluate_isolated`)."""
    from infra.errors import ArtifactError

    path = artifacts.join(out_uri, "heldout.jsonl")
    if artifacts.read_manifest(out_uri) is not None:
        return path
    evaluate = evaluate_isolated if cfg.eval.isolate_start else evaluate_heldout
    if not cfg.eval.reuse_start:
        return evaluate(cfg, model, out_uri)
    try:
        cache = start_cache_dir(cfg, model)
        artifacts.local_path(out_uri)
    except ArtifactError:  # a remote run folder: computed, not cached
        return evaluate(cfg, model, out_uri)
    if artifacts.read_manifest(cache) is not None:
        _copy_dir(cache, out_uri, note={"from": cache, "model": model})
        log.info("held-out start: reused %s (same policy bytes, questions, settings, code and machine; "
                 "eval.reuse_start=false recomputes it)", cache)
        return path
    evaluate(cfg, model, out_uri)
    _copy_dir(out_uri, cache)
    return path


def log_heldout(path: str, label: str) -> None:
    """Means of a held-out row file as ``heldout/<label>/<metric>`` plus the file, to the active MLflow run."""
    from infra.tracking import log_artifact, log_metrics
    from training.agent.heldout import means

    rows = artifacts.read_jsonl(path)
    log_metrics({f"heldout/{label}/{k}": v for k, v in means(rows, heldout_fields(rows)).items()})
    log_artifact(artifacts.local_path(path), "heldout")


def training_ids(cfg: Any, data: Any) -> list[str]:
    """Every question id a step trained on: the stages' training splits and the warm-up rows."""
    from training.rl.data import read_parquet, train_split
    from training.rl.warmup import warmup_root

    ids = {str(r["extra_info"]["id"]) for s in cfg.stages for r in read_parquet(data.split_uri(train_split(s, data)))}
    warm = Path(artifacts.local_path(warmup_root(cfg))) / "data" / "warmup.jsonl" if cfg.init.warmup else None
    if warm is not None and warm.exists():
        ids |= {str(r["question_id"]) for r in artifacts.read_jsonl(str(warm))}
    return sorted(ids)


def learning_curve(ckpts: list[Any]) -> list[dict[str, Any]]:
    """Per-step curve over the chained stages: training health (reward, format failures, KL, searches, length)
    and the held-out curve points, steps continuing across stages."""
    rows: dict[float, dict[str, Any]] = {}
    offset = 0.0
    for c in ckpts:
        stage_dir = Path(c.stage_dir)
        for name, prefix in (("health.json", "health/"), ("curve.json", "")):
            p = stage_dir / name
            for r in artifacts.read_json(str(p)) if p.exists() else []:
                step = offset + float(r["step"])
                row = rows.setdefault(step, {"step": step, "stage": c.stage})
                for k, v in r.items():
                    if k != "step":
                        row[("heldout_" + k) if not prefix else k.removeprefix(prefix)] = v
        offset += float(c.steps)
    return [rows[k] for k in sorted(rows)]


def write_learning_report(cfg: Any, start: str, final: str, ckpts: list[Any], data: Any, out_uri: str) -> LearningRef:
    """The paired start-vs-final report of the recipe: evidence folder in ``out_uri`` (copied to
    ``eval.evidence_dir``), plots, MLflow artifacts under ``learning/`` of the active run, and the health alarms
    (the stages' ``alarms.json`` from training plus the held-out rows' and curve's, ``health:`` thresholds)."""
    from evaluation.criteria import question_groups
    from infra.paths import home_relative, repo_path
    from infra.tracking import active_run_id
    from training.agent.alarms import Alarm
    from training.agent.heldout import report_learning, summary_table

    run_id = active_run_id()
    alarm_files = [Path(c.stage_dir) / "alarms.json" for c in ckpts]
    trained = [Alarm(**a) for p in alarm_files if p.exists() for a in artifacts.read_json(str(p))]
    start_meta = artifacts.read_manifest(str(Path(artifacts.local_path(start)).parent)) or {}
    final_meta = artifacts.read_manifest(str(Path(artifacts.local_path(final)).parent)) or {}
    start_rows, final_rows = artifacts.read_jsonl(start), artifacts.read_jsonl(final)
    summary = report_learning(
        cfg.name, start_rows, final_rows, training_ids(cfg, data), fields=heldout_fields(start_rows, final_rows),
        out_dir=artifacts.local_path(out_uri), curve=learning_curve(ckpts), x="step",
        evidence_dir=str(repo_path(cfg.eval.evidence_dir)) if cfg.eval.evidence_dir else None,
        mlflow_run_id=run_id, alarm_config=cfg.health, alarm_window=cfg.health.window,
        training_alarms=trained,
        steps=[c.steps for c in ckpts], start_model=home_relative(start_meta.get("model")),
        final_model=home_relative(ckpts[-1].uri),
        heldout_seconds={"start": start_meta.get("seconds"), "final": final_meta.get("seconds")},
        groups=question_groups(heldout_questions(cfg), cfg.eval.split_by))
    for c in ckpts:  # the stages' own training-health plots next to the evidence
        for name in ("health.png", "curve.png"):
            src = Path(c.stage_dir) / name
            for target in [artifacts.local_path(out_uri)] + (
                    [repo_path(cfg.eval.evidence_dir)] if cfg.eval.evidence_dir else []):
                if src.exists():
                    (Path(target) / f"{c.stage}_{name}").write_bytes(src.read_bytes())
    return LearningRef(dir=str(artifacts.local_path(out_uri)), table=summary_table(summary),
                       improved=summary["improved"], n=summary["n_heldout"])


def curve_questions(cfg: Any) -> list[Any]:
    """``eval.curve_questions`` held-out questions spread evenly over the whole held-out set."""
    qs = heldout_questions(cfg)
    n = min(cfg.eval.curve_questions, len(qs))
    return [qs[i * len(qs) // n] for i in range(n)]


def heldout_curve_callback(cfg: Any, out_dir: str) -> Any:
    """A transformers ``TrainerCallback`` scoring the live policy on :func:`curve_questions` at step 0 and every
    ``eval.curve_every`` steps (greedy, the held-out settings); logs ``heldout_curve/<metric>`` to the active MLflow
    run and rewrites ``out_dir/curve.json`` + ``curve.png`` each time."""
    from transformers import TrainerCallback

    from training.agent.alarms import answer_stats
    from training.agent.evaluate import open_searcher
    from training.agent.heldout import means, plot_learning_curves
    from training.agent.rollout import run_rollouts
    from training.generation.hf import TransformersGenerator

    ecfg = eval_config(cfg, cfg.model)
    questions = curve_questions(cfg)
    every = cfg.eval.curve_every

    class HeldoutCurve(TrainerCallback):
        def __init__(self) -> None:
            self.points: list[dict[str, float]] = []

        def _score(self, step: int, model: Any, tokenizer: Any) -> None:
            import torch

            from infra.tracking import active_run_id, log_metrics

            was_training = model.training
            model.eval()
            try:
                with torch.no_grad():
                    gen = TransformersGenerator(model, tokenizer, batch_size=64)
                    trajs = run_rollouts(questions, ecfg.protocol, gen, open_searcher(ecfg.retrieval), ecfg.rollout,
                                         tokenizer)
            finally:
                model.train(was_training)
            rows = heldout_rows(cfg, trajs, tokenizer, judge=False)
            point = {"step": float(step), **means(rows, METRICS), **answer_stats(rows)}
            self.points.append(point)
            log.info("held-out curve at step %d: %s", step, point)
            if active_run_id() is not None:
                log_metrics({f"heldout_curve/{k}": v for k, v in point.items() if k != "step"}, step=step)
            artifacts.write_json(str(Path(out_dir) / "curve.json"), self.points)
            plot_learning_curves(self.points, Path(out_dir) / "curve.png", x="step",
                                 title=f"held-out curve (n={len(questions)}, greedy)")

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 0:
                self._score(0, kwargs["model"], kwargs["processing_class"])

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step % every == 0:
                self._score(state.global_step, kwargs["model"], kwargs["processing_class"])

    return HeldoutCurve()


def format_failures(cfg: Any, rows: list[dict[str, Any]]) -> str:
    """Why the held-out rows that are not format-ok ended, against the budget that ended them: e.g. "failures: 42
    out of generation passes (max_turns 2), 13 at the token budget (eval.max_new_tokens 96)"."""
    reasons = {"max_turns": f"out of generation passes (max_turns {cfg.stages[-1].max_turns})",
               "length": f"at the token budget (eval.max_new_tokens {cfg.eval.max_new_tokens})"}
    counts: dict[str, int] = {}
    for r in rows:
        if not r.get("format_ok"):
            why = r.get("finish_reason") or "unknown"
            counts[why] = counts.get(why, 0) + 1
    parts = [f"{n} {reasons.get(why, f'ended by {why}')}" for why, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return "failures: " + (", ".join(parts) or "none")


def check_start_policy(cfg: Any, path: str) -> str | None:
    """The start-policy gate (``eval.start_min_format_ok``): None when the policy RL starts from answers in the
    protocol's format on enough held-out questions, else the reason; tagged on the active MLflow run, and raised
    as ``TrainingHealthError`` before any RL step when ``eval.start_gate`` is ``stop``."""
    from infra.tracking import set_tags
    from training.rl.health import TrainingHealthError

    floor = cfg.eval.start_min_format_ok
    rows = artifacts.read_jsonl(path)
    if floor is None or not rows:
        return None
    rate = sum(float(r.get("format_ok") or 0) for r in rows) / len(rows)
    if rate >= floor:
        return None
    reason = (f"start policy format-ok on {rate:.0%} of {len(rows)} held-out questions, under "
              f"eval.start_min_format_ok={floor:.0%}: RL would spend its updates on format, not answers. "
              f"{format_failures(cfg, rows)}. Solve format in warm-up (more init.warmup.sft steps or rows, or "
              f"a budget the warm-up's trajectories fit), or set eval.start_min_format_ok=null")
    from infra.tracking import active_run_id

    if active_run_id() is not None:  # a library call without a run only logs (set_tags would start a run)
        set_tags({"health.alarm.start_format": reason})
    if cfg.eval.start_gate == "stop":
        raise TrainingHealthError(f"RL not started: {reason}")
    log.warning("%s", reason)
    return reason
