"""``retrain`` flow: scheduled retraining triggered by corpus changes.

check corpus hash -> (unchanged: fast no-op that says so) -> per-passage diff (added / changed / deleted) -> refresh
the index: with ``refresh: incremental`` (default) and a previous index, ``retrieval.update`` writes a new index from
it, encoding only new/changed passages and reusing every unchanged vector (faiss flat and ColBERT Voyager updated in
place, HNSW/IVF-PQ rebuilt from the stored vectors, BM25 rebuilt: its statistics are corpus-wide); with
``refresh: full`` or no previous index, a full build (``retrieval.index``; a dense build resumes from finished
shards) -> recall of candidate vs incumbent (the live retriever when
``retriever_url`` is set, else the previous champion index) -> promotion gate -> retrain the model: by default
``rl-finetune`` on the cheap preset (``searchr1_learn_demo``: 2 GRPO steps) started from the registered
``@champion``, the trained policy compared with the champion on the preset's held-out questions (paired bootstrap),
``@champion`` moved only when the paired interval of ``promote_on`` lies above 0 -> one MLflow run + a markdown
artifact on the flow run saying why -> commit the corpus state
(last: if anything before fails, e.g. MLflow is down, the next run redoes only what has no manifest).

Deploy it on a schedule with ``searchloop deploy register`` (interval from ``RetrainConfig``), or run it once with
``searchloop deploy run retrain``.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, get_run_logger
from pydantic import Field

from evaluation.gate import recall_gate_value
from infra import artifacts
from infra.config import StrictModel
from infra.errors import ConfigError
from infra.lazy import load_object
from infra.paths import resolve_path
from infra.settings import get_settings
from retrieval.backends import get_backend
from retrieval.index import IndexBuildConfig, IndexRef
from retrieval.recall import RecallConfig, RecallReport
from tasks import index_update, ops

# trainer -> (module, flow function, override pointing the trainer's retriever at the new corpus)
TRAINERS = {
    "em-loop": ("flows.em_loop", "em_loop", "retrieval.corpus=['{corpus}']"),
    "rl-finetune": ("flows.rl_finetune", "rl_finetune", None),
}


class RetrainConfig(StrictModel):
    """Parameters of the scheduled retraining flow (the Prefect UI form is generated from this model)."""

    name: str = Field(default="default", description="Name of this watch; its state lives under state_root/name.")
    corpus: str = Field(
        default="data/corpus/mini.jsonl", description="Corpus jsonl to watch (path, repo-relative path or s3://)."
    )
    state_root: str | None = Field(default=None, description="Where watch state and indexes live (default home).")
    index: IndexBuildConfig | None = Field(
        default=None, description="Index build settings (backend, encoder...); its corpus is replaced by `corpus`."
    )
    refresh: Literal["incremental", "full"] = Field(
        default="incremental", description="incremental: update the previous index (encode only new/changed "
        "passages, reuse the rest); full: rebuild the index from scratch."
    )
    evaluation: RecallConfig = Field(
        default_factory=lambda: RecallConfig(ks=[5]), description="Eval files and cut-offs for the recall gate."
    )
    top_k: int = Field(default=5, ge=1, description="k of the recall@k gate metric (must be in evaluation.ks).")
    min_delta: float = Field(default=-0.02, description="Gate: candidate >= incumbent + min_delta to promote.")
    retriever_url: str | None = Field(default=None, description="Live retriever serving the incumbent index.")
    trainer: Literal["none", "em-loop", "rl-finetune"] = Field(
        default="rl-finetune", description="Model retraining run after an index change: rl-finetune (default: a "
        "short GRPO stage from the champion, then the champion-vs-candidate held-out comparison), em-loop (its own "
        "champion gate) or none."
    )
    preset: str | None = Field(default="searchr1_learn_demo", description="Preset of the trainer flow (None: its "
                               "default). The default is the cheap one: 2 GRPO steps, 24 held-out questions.")
    promote_on: Literal["reward", "f1", "em", "cover_em", "format_ok"] = Field(
        default="reward", description="Held-out field whose paired interval (candidate - "
                            "champion) must lie above 0 to move @champion: reward, f1, em, cover_em, format_ok.")
    trainer_overrides: list[str] = Field(
        default_factory=list, description="Extra key=value overrides for the trainer flow (e.g. base_model=...)."
    )
    experiment: str = Field(default="searchloop-retrain", description="MLflow experiment.")


class RetrainResult(StrictModel):
    """What a retraining run did."""

    status: Literal["no-op", "promoted", "rejected"] = Field(description="Outcome.")
    message: str = Field(description="Human-readable summary (also in the flow-run log).")
    corpus_sha256: str = Field(description="Hash of the corpus that was checked.")
    index_dir: str | None = Field(default=None, description="Index built in this run.")
    index_reused: bool = Field(default=False, description="True when a finished index was found and not rebuilt.")
    refresh: dict = Field(default_factory=dict, description="How the index was refreshed: method, counts, how, why.")
    mlflow_run_id: str | None = Field(default=None, description="MLflow run with the decision.")


def _state_dir(cfg: RetrainConfig) -> str:
    root = cfg.state_root or str(get_settings().home / "retrain")
    return artifacts.join(root, cfg.name)


def _model_hook(cfg: RetrainConfig) -> str:
    """Run the trainer flow as a subflow; return a one-line note for the record.

    ``rl-finetune``: train from the ``@champion`` version (the preset's model while there is none, warm-up SFT
    then included), compare the trained policy with the one it started from on the preset's held-out questions
    (paired bootstrap), and move ``@champion`` to the new version only when the paired interval of
    ``promote_on`` lies above 0. Trainer inputs that a finished run already covered are not trained or registered
    again. ``em-loop`` owns its champion gate.
    """
    if cfg.trainer == "none":
        return "model retraining skipped (trainer=none)"
    module_name, fn_name, corpus_override = TRAINERS[cfg.trainer]
    try:
        trainer = load_object(f"{module_name}:{fn_name}")
    except ConfigError:
        return f"model retraining skipped: {module_name}.{fn_name} is not available in this build"
    overrides = ([corpus_override.format(corpus=cfg.corpus)] if corpus_override else []) + cfg.trainer_overrides
    preset = {"preset": cfg.preset} if cfg.preset else {}
    if cfg.trainer == "rl-finetune":
        return _rl_retrain(cfg, trainer, overrides, preset)
    result = trainer(overrides=overrides, **preset)
    stages = result if isinstance(result, list) else [result]
    moved = any(bool(getattr(r, "promoted", False)) for r in stages)
    return f"{cfg.trainer} retrained on the new corpus ({len(stages)} stage(s)); champion moved: {moved}"


def _rl_retrain(cfg: RetrainConfig, trainer: Any, overrides: list[str], preset: dict[str, str]) -> str:
    from flows.specs import resolve
    from infra import tracking

    rl_cfg = resolve("rl-finetune", cfg.preset, overrides)
    name = f"searchloop-{rl_cfg.name}"  # type: ignore[attr-defined]  # where rl-finetune registers its policy
    champion = tracking.get_alias(name, "champion")
    # the champion's version, not the alias: the trainer's run directory is keyed by its config, so "@champion"
    # would resume the previous run after the alias moved
    start = [f"model=models:/{name}/{champion.version}", "init.warmup=null"] if champion is not None else []
    run_overrides = [*overrides, *start, "eval.compare_start=true", "register_model=true"]
    root = _trainer_root(cfg.preset, run_overrides)
    if _finished(rl_cfg, root):
        return (f"rl-finetune: nothing new to train: the same preset, start model "
                f"({f'v{champion.version}' if champion is not None else 'the preset model'}) and questions were "
                f"trained and compared in {root} already, so no version is registered again; give new questions "
                "(trainer_overrides: data.train=[...]) for a new run")
    result = trainer(overrides=run_overrides, **preset)
    if result.registered is None or result.learning is None:
        return "rl-finetune ran but registered no version or held-out comparison: champion unchanged"
    field = cfg.promote_on
    version = result.registered.version
    against = f"champion v{champion.version}" if champion is not None else "the preset's start model"
    interval = _paired_interval(result.learning, field)
    trained = f"; training MLflow run {result.run_id}" if getattr(result, "run_id", None) else ""
    if result.learning.improved.get(field, False):
        tracking.set_alias(result.registered.name, "champion", version)
        return (f"rl-finetune: {result.registered.name} v{version} promoted to @champion: held-out {field} paired "
                f"interval vs {against}{interval} is above 0 ({result.learning.n} questions){trained}")
    return (f"rl-finetune: {result.registered.name} v{version} registered, not promoted: held-out {field} paired "
            f"interval vs {against}{interval} includes 0 or is below ({result.learning.n} questions); "
            f"@champion unchanged{trained}")


def _trainer_root(preset: str | None, overrides: list[str]) -> str:
    """The run directory rl-finetune will use for these overrides (same inputs -> same directory, resumed)."""
    from flows.specs import resolve
    from infra.paths import experiment_root

    cfg = resolve("rl-finetune", preset, overrides)
    return str(experiment_root("rl", cfg.name, cfg.key()))  # type: ignore[attr-defined]  # as rl_finetune does


def _finished(rl_cfg: Any, root: str) -> bool:
    """True when ``root`` holds a finished last stage and its held-out comparison (a rerun would only re-register)."""
    last = artifacts.join(root, rl_cfg.stages[-1].name)
    return artifacts.read_manifest(last) is not None and artifacts.exists(artifacts.join(root, "evidence",
                                                                                            "summary.json"))


def _paired_interval(learning: Any, field: str) -> str:
    """`` (new - old +0.0500, 95% CI [-0.0042, +0.1292])`` from the comparison's ``summary.json``; "" when absent."""
    path = artifacts.join(str(getattr(learning, "dir", "") or ""), "summary.json")
    if not getattr(learning, "dir", None) or not artifacts.exists(path):
        return ""
    summary = artifacts.read_json(path)
    d = summary.get("paired", {}).get(field)
    if not d:
        return ""
    level = round(100 * float(summary.get("confidence", 0.95)))
    return f" (new - old {d['diff']:+.4f}, {level}% CI [{d['low']:+.4f}, {d['high']:+.4f}])"


def _incumbent(cfg: RetrainConfig, previous_index: str | None) -> RecallReport | None:
    if cfg.retriever_url:
        return ops.evaluate_live_retriever(cfg.retriever_url, cfg.evaluation)
    if previous_index and artifacts.read_manifest(previous_index) is not None:
        return ops.evaluate_index(previous_index, cfg.evaluation)
    return None


@flow(name="retrain", description="Scheduled retraining: corpus change -> index refresh -> gate -> retrain hook.")
def retrain(config: RetrainConfig = RetrainConfig()) -> RetrainResult:  # noqa: B008 - frozen model default
    """Check the corpus and, when it changed, refresh the index and run the promotion gate."""
    log = get_run_logger()
    config = config.model_copy(update={"corpus": resolve_path(config.corpus)})
    state_dir = _state_dir(config)
    check = ops.check_corpus(config.corpus, state_dir)
    if not check.changed:
        msg = f"no-op: corpus {config.corpus} unchanged (sha256 {check.sha256[:12]}); nothing rebuilt or retrained"
        log.info(msg)
        return RetrainResult(status="no-op", message=msg, corpus_sha256=check.sha256, index_dir=check.previous_index)
    diff = ops.diff_corpus(config.corpus, state_dir)
    log.info("corpus changed (%s -> %s): %s", (check.previous_sha256 or "none")[:12], check.sha256[:12], diff.counts())
    index_dir = artifacts.join(state_dir, "indexes", check.sha256[:16])
    build_cfg = (config.index or IndexBuildConfig(corpus=config.corpus)).model_copy(update={"corpus": config.corpus})
    ref, refresh = _refresh_index(config, build_cfg, check.previous_index, index_dir)
    log.info("index refresh: %s", refresh)
    report = ops.evaluate_index(index_dir, config.evaluation)
    incumbent_report = _incumbent(config, check.previous_index)
    candidate = recall_gate_value(report, config.top_k)
    incumbent = recall_gate_value(incumbent_report, config.top_k) if incumbent_report else None
    decision = ops.gate(f"recall_at_{config.top_k}", candidate, incumbent, config.min_delta)
    model_note = _model_hook(config) if decision.promote else "model retraining skipped: gate rejected"
    champion = index_dir if decision.promote else check.previous_index
    record = {"corpus": config.corpus, "sha256": check.sha256, "diff": diff.counts(), "index_dir": index_dir,
              "index_reused": ref.reused, "refresh": refresh, "decision": decision.model_dump(),
              "champion_index": champion, "model": model_note}
    run_id = ops.log_to_mlflow(
        f"retrain-{config.name}", config.experiment, params=config.model_dump(mode="json"),
        metrics={**{f"diff_{k}": v for k, v in diff.counts().items()}, "candidate_recall": candidate,
                 **({"incumbent_recall": incumbent} if incumbent is not None else {}),
                 "promoted": float(decision.promote), "n_passages": ref.n_passages, "index_reused": float(ref.reused),
                 **{f"time.{k}": v for k, v in ref.timings.items()}, **report.metrics(), **_refresh_metrics(refresh)},
        tags={"decision": "promoted" if decision.promote else "rejected", "reason": decision.reason[:500],
              "refresh": refresh["method"], "refresh_how": refresh.get("how", "")[:500],
              "model": model_note[:500], "backend": ref.backend, **ops.flow_run_info()},
        record=record,
    )
    status = "promoted" if decision.promote else "rejected"
    msg = f"index {status}: {decision.reason}; model: {model_note}; MLflow run {run_id}"
    ops.record_decision(f"retrain-{config.name}".lower().replace("_", "-"), _markdown(record, msg))
    ops.commit_state(state_dir, check, config.corpus, index_dir, {"champion_index": champion, "mlflow_run_id": run_id})
    log.info(msg)
    return RetrainResult(status=status, message=msg, corpus_sha256=check.sha256, index_dir=index_dir,
                         index_reused=ref.reused, mlflow_run_id=run_id, refresh=refresh)


def _refresh_index(cfg: RetrainConfig, build_cfg: IndexBuildConfig, previous: str | None,
                   index_dir: str) -> tuple[IndexRef, dict]:
    """Incremental update from the previous index when configured and possible, else a full build."""
    if cfg.refresh == "incremental" and previous and artifacts.read_manifest(previous) is not None:
        upd = index_update.update_index(build_cfg, previous, index_dir)
        return upd.ref, upd.record()
    why = "refresh=full" if cfg.refresh == "full" else "no previous index"
    ref = ops.build_index(build_cfg, index_dir)
    return ref, {"method": "full", "reason": why, "how": f"{ref.backend}: full build", "previous": previous or "",
                 "counts": {"encoded": 0 if ref.reused else get_backend(ref.backend).encoded_by_full_build(
                     artifacts.local_path(ref.uri), artifacts.read_manifest(ref.uri) or {}),
                            "total": ref.n_passages}}


def _refresh_metrics(refresh: dict) -> dict[str, float]:
    counts = {f"refresh_{k}": float(v) for k, v in refresh.get("counts", {}).items()}
    return {**counts, "refresh_incremental": float(refresh["method"] == "incremental")}


def _markdown(record: dict, msg: str) -> str:
    diff, refresh = record["diff"], record["refresh"]
    c = refresh.get("counts", {})
    return (f"## Scheduled retraining\n\n**{msg}**\n\n| added | changed | deleted | unchanged | total |\n"
            f"|---|---|---|---|---|\n| {diff['added']} | {diff['changed']} | {diff['deleted']} | "
            f"{diff['unchanged']} | {diff['total']} |\n\n"
            f"### Index refresh: {refresh['method']}{' (' + refresh['reason'] + ')' if refresh.get('reason') else ''}"
            f"\n\n{refresh.get('how', '')}\n\n| passages | reused | encoded |\n|---|---|---|\n"
            f"| {c.get('total', '')} | {c.get('reused', 0)} | {c.get('encoded', '')} |\n\n"
            f"Index: `{record['index_dir']}`\n")
