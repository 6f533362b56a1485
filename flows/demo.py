"""``demo`` flow, the main job on embedded defaults: indexes -> live retriever -> recall -> agent evaluation ->
a short real training stage.

Builds the indexes its preset names over the shipped mini corpus (BM25 by default; each a ``build-index`` subflow
with its recall table and MLflow run), serves one over HTTP on 127.0.0.1, and evaluates SmolLM2 as a search agent on
mini benchmarks through that server (the ``evaluate`` subflow). Then it trains (the ``rl-finetune`` subflow of
``train_preset``: warm-up SFT, a few GRPO steps) and compares the policy RL started from with the trained one on
held-out questions, paired. Prints the tables and the MLflow run ids.
"""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows.build_index import build_index_flow
from flows.evaluate import evaluate
from flows.flow_configs import DemoConfig
from flows.rl_finetune import rl_finetune
from flows.specs import Overrides, preset_choice, resolve
from infra.settings import get_settings
from tasks.serving import start_retriever_task, stop_retriever_task

__all__ = ["DemoConfig", "DemoResult", "demo"]
DemoPreset = preset_choice("demo")


class DemoResult(BaseModel):
    """Run ids and tables of the demo."""

    index_runs: dict[str, str] = Field(description="preset -> MLflow run id of its build-index run.")
    recall: dict[str, dict[str, float]] = Field(description="preset -> {dataset: recall@5 any-gold}.")
    eval_run: str | None = Field(description="MLflow run id of the agent evaluation.")
    eval_table: str | None = Field(description="Markdown table of the agent evaluation.")
    train_run: str | None = Field(default=None, description="MLflow run id of the training stage.")
    train_table: str | None = Field(default=None, description="Held-out start vs trained policy, paired intervals.")


@flow(name="demo", log_prints=True)
def demo(preset: DemoPreset = "demo", overrides: Overrides = ()) -> DemoResult:  # type: ignore[valid-type]
    """Build, serve, evaluate, train.

    Args:
        preset: a demo preset from flows/configs (the CLI also takes a YAML path).
        overrides: key=value settings on top of the preset, e.g. run_agent=false.
    """
    config: DemoConfig = resolve("demo", preset, overrides)  # type: ignore[assignment]
    builds = {p: build_index_flow(p) for p in config.index_presets}
    recall = {p: {d.dataset: d.any_gold[5] for d in r.recall.datasets if d.n and 5 in d.any_gold}
              for p, r in builds.items() if r.recall}
    eval_run = table = None
    if config.run_agent:
        served = builds[config.index_presets[config.serve]]
        service = start_retriever_task(served.index.uri, str(get_settings().home / "services"))
        try:
            result = evaluate(config.eval_preset, (f"agent.retrieval.url={service.url}",
                                                   "agent.retrieval.corpus=null"))
            eval_run, table = result.run_id, result.markdown
        finally:
            stop_retriever_task(service)
    train_run = train_table = None
    if config.train_preset:
        trained = rl_finetune(config.train_preset, tuple(config.train_overrides))
        train_run = trained.run_id
        train_table = trained.learning.table if trained.learning else None
    return DemoResult(index_runs={p: r.mlflow_run_id for p, r in builds.items()}, recall=recall,
                      eval_run=eval_run, eval_table=table, train_run=train_run, train_table=train_table)
