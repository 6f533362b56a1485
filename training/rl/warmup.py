"""Warm-up SFT before RL: the preset's protocol rendered from decompositions / FireAct, then a masked SFT.

A 135M model never writes ReSearch/R1-Searcher/Search-R1 tags on its own, so every reward in a GRPO group is the
same and every advantage is zero. The seeds start RL from a model that already follows the format (SmartSearch:
SFT -> RL; ReSearch / R1-Searcher rely on instruct models that do). ``init.warmup`` in an RL preset adds that step:

1. :func:`build_rl_warmup_data`: episodes from ``training.warmup.sources`` sources, rendered with the *preset's*
protocol
   object (same top-k, turn limit and template as the RL rollouts) by ``training.warmup.renderers``; validator
   survival counts per source in ``stats.json``.
2. :func:`train_rl_warmup`: ``training.sft.launcher.train_sft_tokenized`` (LLaMA-Factory's SFT workflow with our
   trainer, document tokens masked), LoRA merged into an HF folder that TRL (or verl) loads as the initial policy.

Both write ``manifest.json`` last and are skipped when it exists, so a re-run of the flow reuses the warm-up.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import Field

from infra import artifacts
from infra.config import StrictModel
from training.rl.engines import get_engine
from training.sft.config import WarmupConfig

log = logging.getLogger(__name__)


class WarmupRef(StrictModel):
    """A finished warm-up: the merged HF folder and what went into it."""

    uri: str = Field(description="HF model folder of the warmed-up policy.")
    data: str = Field(description="Tokenized warm-up rows (jsonl).")
    n_rows: int = Field(description="Valid warm-up trajectories.")
    n_trained: int = Field(description="Rows given to the engine (after the cutoff filter).")
    stats: list[dict[str, Any]] = Field(default_factory=list, description="Validator survival per source.")
    train_loss: float | None = Field(default=None, description="Last logged SFT loss.")


def protocol_kwargs(cfg: Any) -> dict[str, Any]:
    """The first stage's protocol settings: identical to ``training.rl.stages.train_stage_trl``'s rollouts."""
    stage = cfg.stages[0]
    return {"top_k": cfg.stage_top_k(stage), "max_turns": stage.max_turns, "template": cfg.template}


def warmup_root(cfg: Any) -> str:
    """The warm-up's directory, keyed by what it depends on only (model, protocol settings, warm-up config without
    its timeout, rollout retriever): presets that differ in RL or evaluation settings share one warm-up."""
    from infra.config import config_hash
    from infra.settings import get_settings

    w = cfg.init.warmup.model_dump(mode="json")
    w["sft"].pop("timeout_s", None)
    key = {"model": cfg.model, "protocol": cfg.protocol, "protocol_kwargs": protocol_kwargs(cfg), "warmup": w,
           "rollout_budget": rollout_budget(cfg),
           "retrieval": cfg.retrieval.model_dump(mode="json") if not cfg.init.warmup.corpus else None}
    return str(get_settings().runs_dir / "rl" / "warmup" / f"{cfg.protocol}-{config_hash(key)[:10]}")


def _searcher_and_passages(cfg: Any, w: WarmupConfig) -> tuple[Any, dict[str, Any]]:
    from retrieval.open import open_searcher, passages_of

    spec = w.retriever(cfg.retrieval)
    return open_searcher(spec), passages_of(spec)


def warmup_sources(cfg: Any, w: WarmupConfig) -> tuple[dict[str, list[Any]], dict[str, int]]:
    """Episodes per source label, and skip counts of the inputs that gave none."""
    from evaluation.benchmarks import load_benchmark
    from infra.paths import resolve_path
    from training.warmup import renderers as wp

    if w.lf_datasets:
        from infra.errors import ConfigError

        raise ConfigError("init.warmup.lf_datasets is read by the EM loop's chat SFT; RL warm-up renders "
                          "episodes in the preset's protocol, so use decomposition_files / fireact_file here")
    sources: dict[str, list[Any]] = {}
    skipped: dict[str, int] = {}
    if w.decomposition_files:
        searcher, passages = _searcher_and_passages(cfg, w)
        questions = [q for s in w.decomposition_files for q in load_benchmark(s.path, limit=s.limit)]
        top_k = w.top_k or protocol_kwargs(cfg)["top_k"]
        eps, skip = wp.decomposition_episodes(questions, searcher, passages, top_k)
        sources |= eps
        skipped |= {f"decomposition:{k}": v for k, v in skip.items()}
    if w.fireact_file:
        chats = artifacts.read_jsonl(resolve_path(w.fireact_file))[: w.fireact_limit]
        eps, skip = wp.fireact_episodes(chats)
        sources["fireact"] = eps
        skipped |= {f"fireact:{k}": v for k, v in skip.items()}
    return wp.without_search(sources, w.no_search_share), skipped


def rollout_budget(cfg: Any) -> tuple[int, int] | None:
    """(tokens per generation step, generated tokens per trajectory) of the first stage's TRL rollouts; None when
    ``init.fit_rollout_budget`` is off or the engine is verl."""
    trl = cfg.stages[0].trl
    if not cfg.init.fit_rollout_budget or not get_engine(cfg.engine).local_rollouts or trl is None:
        return None
    return trl.max_tokens_per_turn or trl.max_completion_length, trl.max_completion_length


def fit_rollout_budget(rows: list[dict[str, Any]], tokenizer: Any, per_step: int,
                       total: int) -> tuple[list[dict[str, Any]], int]:
    """Keep the warm-up rows a rollout could produce: every generated step within ``per_step`` tokens and all of
    them within ``total``. Training on longer trajectories teaches steps the RL rollouts cut off (no answer, no
    reward). Returns (kept rows, dropped count)."""
    kept = []
    for r in rows:
        lens = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t, generated in r["segments"] if generated]
        if max(lens, default=0) <= per_step and sum(lens) <= total:
            kept.append(r)
    return kept, len(rows) - len(kept)


def build_rl_warmup_data(cfg: Any, out_uri: str) -> dict[str, Any]:
    """Render the warm-up episodes with the preset's protocol; ``{"data", "n", "stats", "skipped"}`` (cached)."""
    from training.generation.models import load_tokenizer, resolve_policy
    from training.warmup.renderers import build_protocol_warmup

    done = artifacts.read_manifest(out_uri)
    if done is not None:
        log.info("skipping rl warm-up data: already complete at %s", out_uri)
        return done["data"]
    w = cfg.init.warmup
    tok = load_tokenizer(resolve_policy(cfg.model))
    sources, skipped = warmup_sources(cfg, w)
    rows, stats = build_protocol_warmup(cfg.protocol, sources, tok, w.max_fact_words, **protocol_kwargs(cfg))
    budget = rollout_budget(cfg)
    over = 0
    if budget is not None:
        rows, over = fit_rollout_budget(rows, tok, *budget)
        log.info("warm-up: %d trajectories dropped, longer than the rollout budget %s", over, budget)
    data = artifacts.join(out_uri, "warmup.jsonl")
    artifacts.write_jsonl(data, rows)
    result = {"data": data, "n": len(rows), "stats": [s.model_dump() for s in stats], "skipped": skipped,
              "over_rollout_budget": over}
    artifacts.write_json(artifacts.join(out_uri, "stats.json"), result["stats"])
    artifacts.write_manifest(out_uri, stage="rl_warmup_data", data=result, protocol=cfg.protocol,
                             protocol_kwargs=protocol_kwargs(cfg))
    return result


def train_rl_warmup(cfg: Any, out_uri: str, mlflow_run_id: str | None = None) -> WarmupRef:
    """Warm-up data (cached) + tokenized SFT (cached) from ``cfg.model``; the merged folder is the RL init."""
    from training.generation.models import resolve_policy
    from training.sft.launcher import train_sft_tokenized

    data = build_rl_warmup_data(cfg, artifacts.join(out_uri, "data"))
    if not data["n"]:
        from infra.errors import ConfigError

        raise ConfigError(f"no warm-up trajectory of protocol {cfg.protocol!r} passed its validator "
                          f"(stats: {data['stats']}); check init.warmup sources")
    sft_dir = Path(artifacts.local_path(artifacts.join(out_uri, "sft")))
    # run_name: the engine renames the MLflow child run to it, so it must stay the child run's name
    ref = train_sft_tokenized(cfg.init.warmup.sft, data["data"], resolve_policy(cfg.model), sft_dir,
                              mlflow_run_id=mlflow_run_id, run_name="warmup")
    return WarmupRef(uri=ref.uri, data=data["data"], n_rows=data["n"], n_trained=ref.n_examples,
                     stats=data["stats"], train_loss=ref.train_loss)


def log_warmup(ref: WarmupRef) -> None:
    """Validator survival per source and the SFT loss curve to the active MLflow run."""
    from infra.tracking import log_artifact, log_metrics

    metrics: dict[str, float] = {"warmup/rows": ref.n_rows, "warmup/trained": ref.n_trained}
    for s in ref.stats:
        key = s["source"].replace(":", "_")
        metrics[f"warmup/{key}/valid"] = s["valid"]
        metrics[f"warmup/{key}/candidates"] = s["candidates"]
    if ref.train_loss is not None:
        metrics["warmup/train_loss"] = ref.train_loss
    log_metrics(metrics)
    stats = Path(ref.data).with_name("stats.json")
    if stats.exists():
        log_artifact(stats, "warmup")
