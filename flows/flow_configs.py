"""Config models of the flows that have no library config of their own: build-index, evaluate, demo.

Kept apart from the flow modules so the CLI validates a preset without importing Prefect (``flows.specs``). The EM
loop and RL flows use ``training.em.config.EMLoopConfig`` and ``training.rl.config.RLConfig``.
"""

from __future__ import annotations

from pydantic import Field

from flows.fanout import FanOutConfig
from infra.config import StrictModel
from retrieval.index import IndexBuildConfig
from retrieval.recall import RecallConfig
from training.agent.evaluate import AgentEvalConfig
from training.agent.traces import TraceConfig
from training.protocols.registry import ProtocolName

DEFAULT_DATASETS = ["hotpotqa_mini", "2wikimultihopqa_mini", "musique_mini", "bamboogle_mini"]


class BuildIndexFlowConfig(StrictModel):
    """A preset for ``searchloop index build``: the index, where it goes, and how it is evaluated."""

    name: str = Field(default="index", description="Run name (MLflow run and default directory label).")
    index: IndexBuildConfig = Field(
        default_factory=lambda: IndexBuildConfig(corpus="data/corpus/mini.jsonl"), description="What to build."
    )
    output_dir: str | None = Field(
        default=None, description="Index directory; None = <home>/runs/indexes/<backend>-<config hash>."
    )
    evaluation: RecallConfig = Field(default_factory=RecallConfig, description="Recall evaluation after the build.")
    evaluate: bool = Field(default=True, description="Run the recall evaluation after the build.")
    force: bool = Field(default=False, description="Rebuild even if an identical complete index exists.")
    parallel: FanOutConfig = Field(
        default_factory=FanOutConfig, description="How shard embeddings run: sequential, threads or ray (fan-out)."
    )


class EvaluateConfig(StrictModel):
    """Parameters of the evaluate flow."""

    agent: AgentEvalConfig = Field(default_factory=AgentEvalConfig, description="Model, retriever, rollout.")
    protocols: list[ProtocolName] = Field(default_factory=lambda: ["research"], min_length=1,
                                 description="Protocols to evaluate (each on every dataset).")
    datasets: list[str] = Field(default_factory=lambda: list(DEFAULT_DATASETS), min_length=1,
                                description="Benchmark names (shipped/shared) or jsonl paths.")
    out_dir: str | None = Field(default=None, description="Output directory (default: <home>/runs/evaluate/<name>).")
    run_name: str = Field(default="evaluate", description="MLflow run name and output folder name.")
    experiment: str = Field(default="searchloop", description="MLflow experiment.")
    traces: TraceConfig = Field(default_factory=TraceConfig,
                                description="Trajectories traced in MLflow per dataset (sampled) and assessments.")
    parallel: FanOutConfig = Field(
        default_factory=FanOutConfig, description="How the protocol x dataset tasks run: sequential, threads, ray."
    )


class DemoConfig(StrictModel):
    """What the demo builds, serves and evaluates (presets by name)."""

    index_presets: list[str] = Field(default_factory=lambda: ["index_mini_bm25"],
                                     min_length=1, description="build-index presets to build and evaluate.")
    serve: int = Field(default=0, ge=0, description="Which of index_presets the agent searches (position).")
    eval_preset: str = Field(default="eval_demo", description="evaluate preset for the agent run.")
    run_agent: bool = Field(default=True, description="Run the agent evaluation after the indexes.")
    train_preset: str | None = Field(
        default="searchr1_learn_demo", description="rl-finetune preset of the closing training stage (None: skip).")
    train_overrides: list[str] = Field(default_factory=list, description="key=value overrides of train_preset.")
