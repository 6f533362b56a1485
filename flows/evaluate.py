"""``evaluate`` flow: every protocol x dataset as a retried task, then the report, all in one MLflow run."""

from __future__ import annotations

import time

from prefect import flow
from pydantic import BaseModel, Field

from flows.fanout import map_task
from flows.flow_configs import DEFAULT_DATASETS, EvaluateConfig
from flows.specs import Overrides, preset_choice, resolve
from infra.settings import get_settings
from infra.tracking import stage_run
from tasks.evaluation import evaluate_dataset_task, log_evaluation_task, summarize_task
from tasks.run_status import RUN_STATUS_HOOKS

__all__ = ["DEFAULT_DATASETS", "EvaluateConfig", "EvaluateResult", "evaluate"]
EvalPreset = preset_choice("evaluate")

def _in_deployment() -> bool:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return bool(ctx and ctx.flow_run and ctx.flow_run.deployment_id)


class EvaluateResult(BaseModel):
    """What the flow returns: the MLflow run, the report directory and the table."""

    run_id: str = Field(description="MLflow run id.")
    report_dir: str = Field(description="Directory with report.md and scores.png.")
    table: dict[str, dict[str, float]] = Field(description="{protocol/dataset: {metric: mean}}.")
    markdown: str = Field(description="Markdown table.")


@flow(name="evaluate", log_prints=True, **RUN_STATUS_HOOKS)
def evaluate(preset: EvalPreset = "eval_demo", overrides: Overrides = ()) -> EvaluateResult:  # type: ignore[valid-type]
    """Evaluate each protocol on each dataset; log per-dataset metrics, predictions and a report to MLflow.

    Args:
        preset: an evaluate preset from flows/configs (the CLI also takes a YAML path).
        overrides: key.sub=value settings on top of the preset, e.g. agent.limit=5.
    """
    config: EvaluateConfig = resolve("evaluate", preset, overrides)  # type: ignore[assignment]
    out = config.out_dir or str(get_settings().runs_dir / "evaluate" / f"{config.run_name}-{int(time.time())}")
    params = config.model_dump(mode="json")
    params["agent"]["protocol"] = ",".join(config.protocols)  # each task runs agent with one of these, not the default
    with stage_run(config.run_name, params=params, experiment=config.experiment,
                   tags={"searchloop.flow": "evaluate"}) as run:
        calls, protos = [], []
        for protocol in config.protocols:
            agent = config.agent.model_copy(update={"protocol": protocol})
            for dataset in config.datasets:
                name = dataset.replace("/", "_").removesuffix(".jsonl")
                calls.append({"cfg": agent, "dataset": dataset, "out_dir": f"{out}/{protocol}/{name}"})
                protos.append(protocol)
        refs = map_task(evaluate_dataset_task, calls, config.parallel)
        details = {"model": config.agent.generator.model, "protocols": ", ".join(config.protocols),
                   "mlflow_run": run.info.run_id}
        summary = summarize_task(refs, protos, f"{out}/report", "searchloop agent evaluation", details)
        log_evaluation_task(run.info.run_id, summary, refs, config.traces)
    if _in_deployment():  # the CLI prints the table itself; a deployment run shows it in its log
        print(summary.markdown)
    return EvaluateResult(run_id=run.info.run_id, report_dir=summary.uri, table=summary.table,
                          markdown=summary.markdown)
