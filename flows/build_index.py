"""``build-index`` flow: validate corpus -> embed shards -> build index -> manifest -> recall -> MLflow run.

Composition only: every step is a task in ``tasks.retrieval`` wrapping one library function. The shards of a
backend that embeds them (dense) are embedded one task per shard (retried, cached by content hash); a composite
(hybrid) index builds its parts the same way and then writes its own manifest. Returns a
small :class:`BuildIndexResult`.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field

from flows.fanout import FanOutConfig, map_task
from flows.flow_configs import BuildIndexFlowConfig
from flows.specs import Overrides, preset_choice, resolve
from retrieval.backends import get_backend
from retrieval.index import IndexBuildConfig, IndexRef, default_index_dir, index_parts, part_config
from retrieval.recall import RecallReport
from tasks import retrieval as t

__all__ = ["BuildIndexFlowConfig", "BuildIndexResult", "build_index_flow"]
IndexPreset = preset_choice("build-index")


class BuildIndexResult(BaseModel):
    """What the flow returns: references, not objects."""

    model_config = ConfigDict(frozen=True)

    index: IndexRef = Field(description="The built (or reused) index.")
    recall: RecallReport | None = Field(description="Recall report, when evaluated.")
    mlflow_run_id: str = Field(description="MLflow run holding params, counts, timings, sizes and recall.")


def _build_single(cfg: IndexBuildConfig, out: str, force: bool, parallel: FanOutConfig) -> IndexRef:
    existing = None if force else t.find_existing_index(cfg, out)
    if existing is not None:
        return existing
    plan = t.plan_index(cfg, out)
    shards = []
    if get_backend(cfg.backend).embeds_shards:
        calls = [{"store_dir": plan.out_dir, "spec": spec, "shards_dir": str(Path(plan.out_dir) / "shards"),
                  "encoder": cfg.encoder} for spec in plan.store.shards]
        shards = map_task(t.embed_shard.with_options(refresh_cache=force), calls, parallel)
        # a cache hit whose file was deleted since (an output dir removed and rebuilt): embed those shards again
        stale = [i for i, ref in enumerate(shards) if not Path(ref.path).exists()]
        if stale:
            print(f"{len(stale)} cached shard(s) no longer on disk; embedding them again")
            redo = map_task(t.embed_shard.with_options(refresh_cache=True), [calls[i] for i in stale], parallel)
            for i, ref in zip(stale, redo, strict=True):
                shards[i] = ref
    return t.finalize_index(cfg, plan, shards)


@flow(name="build-index", log_prints=True)
def build_index_flow(preset: IndexPreset = "index_mini_bm25", overrides: Overrides = ()) -> BuildIndexResult:  # type: ignore[valid-type]
    """Build, evaluate and record one index.

    Args:
        preset: a build-index preset from flows/configs (the CLI also takes a YAML path).
        overrides: key.sub=value settings on top of the preset, e.g. index.backend=dense.
    """
    cfg: BuildIndexFlowConfig = resolve("build-index", preset, overrides)  # type: ignore[assignment]
    out = cfg.output_dir or str(default_index_dir(cfg.index))
    t.validate_corpus(cfg.index.corpus)
    if part_names := index_parts(cfg.index):
        existing = None if cfg.force else t.find_existing_index(cfg.index, out)
        parts = [] if existing else [
            _build_single(part_config(cfg.index, p), str(Path(out) / p), cfg.force, cfg.parallel)
            for p in part_names
        ]
        ref = existing or t.finalize_hybrid(cfg.index, out, parts)
    else:
        ref = _build_single(cfg.index, out, cfg.force, cfg.parallel)
    report = t.evaluate_recall(ref.uri, cfg.evaluation) if cfg.evaluate else None
    run_id = t.log_index_run(cfg.name, cfg.index, ref, report, {"eval_files": cfg.evaluation.files,
                                                                 "eval_ks": cfg.evaluation.ks})
    return BuildIndexResult(index=ref, recall=report, mlflow_run_id=run_id)
