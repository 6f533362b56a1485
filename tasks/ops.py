"""Prefect tasks for operations: corpus checks, index refresh, evaluation, the promotion gate, MLflow records.

Thin wrappers: the work lives in ``retrieval.sync``, ``retrieval.index``, ``retrieval.recall``, ``evaluation.gate``
and ``infra.tracking``; retries,
timeouts and tags are declared here. The live-retriever query retries through connection errors, so a retriever
that is restarted mid-run costs a retry, not the flow.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.context import get_run_context

from evaluation.gate import GateDecision, decide_promotion
from infra import artifacts, proc
from infra.errors import SearchloopError
from infra.paths import resolve_path
from retrieval import index, recall, sync
from retrieval.corpus import read_corpus
from retrieval.index import IndexBuildConfig, IndexRef
from retrieval.recall import RecallConfig, RecallReport
from tasks.policy import retry_unless_input_error


class TrackingUnavailable(SearchloopError):
    """The MLflow tracking server cannot be reached; the message says where the results were kept."""


@task(name="check-corpus", retries=2, retry_condition_fn=retry_unless_input_error, retry_delay_seconds=2)
def check_corpus(corpus: str, state_dir: str) -> sync.CorpusCheck:
    """Hash the corpus file and compare it with the last processed one."""
    return sync.check_corpus(corpus, state_dir)


@task(name="diff-corpus", retries=1, retry_condition_fn=retry_unless_input_error, retry_delay_seconds=2)
def diff_corpus(corpus: str, state_dir: str) -> sync.CorpusDiff:
    """Per-passage diff (added / changed / deleted) against the last processed corpus."""
    diff, _ = sync.diff_corpus(corpus, state_dir)
    return diff


@task(name="build-index", retries=1, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=5, timeout_seconds=6 * 3600)
def build_index(cfg: IndexBuildConfig, out_dir: str) -> IndexRef:
    """Build the index of the current corpus (any backend); an identical finished index is reused, a crashed
    dense build resumes from its finished shards."""
    return index.build_index(cfg, out_dir)


@task(name="evaluate-index", retries=1, retry_condition_fn=retry_unless_input_error, retry_delay_seconds=2)
def evaluate_index(index_dir: str, cfg: RecallConfig) -> RecallReport:
    """Recall@k of a finished index directory on the eval files."""
    return recall.evaluate_index_recall(index_dir, cfg)


@task(name="evaluate-live-retriever", retries=6, retry_condition_fn=retry_unless_input_error,
      retry_delay_seconds=[1, 2, 4, 8, 8, 8], timeout_seconds=600)
def evaluate_live_retriever(url: str, cfg: RecallConfig) -> RecallReport:
    """Recall@k of the index a live retriever serves (the incumbent). The client retries briefly itself; a
    retriever that stays down longer (killed, restarting) fails the attempt and the task retries."""
    from retrieval.client import RetrieverClient

    examples = [ex for f in cfg.files for ex in recall.load_examples(resolve_path(f))]
    with RetrieverClient(url, timeout=30, retries=2, backoff_s=0.25) as client:
        return recall.evaluate_recall(client, examples, cfg.ks, cfg.batch_size, index_name=url)


@task(name="promotion-gate")
def gate(metric: str, candidate: float, incumbent: float | None, min_delta: float) -> GateDecision:
    """Decide whether the candidate replaces the incumbent."""
    decision = decide_promotion(metric, candidate, incumbent, min_delta)
    get_run_logger().info("gate: %s", decision.reason)
    return decision


def _tracking_reachable(uri: str) -> bool:
    if not uri.startswith(("http://", "https://")):
        return True
    return proc.is_healthy(f"{uri.rstrip('/')}/health", timeout=3)


@task(name="log-to-mlflow", retries=2, retry_condition_fn=retry_unless_input_error, retry_delay_seconds=3)
def log_to_mlflow(run_name: str, experiment: str, params: dict[str, Any], metrics: dict[str, float],
                  tags: dict[str, str], record: dict[str, Any]) -> str:
    """Log one MLflow run (params, metrics, tags, the decision record as an artifact); returns the run id.

    Raises:
        TrackingUnavailable: when the tracking server does not answer (after the task's retries); artifacts and
            state written before this step are kept, and a rerun resumes from them.
    """
    from infra import tracking
    from infra.settings import get_settings

    uri = get_settings().tracking_uri
    if not _tracking_reachable(uri):
        raise TrackingUnavailable(
            f"MLflow tracking server {uri} is not reachable; the index and decision were kept on disk and the "
            f"corpus state was not committed, so rerunning after `searchloop up` (or fixing MLFLOW_TRACKING_URI) "
            f"logs this run without rebuilding"
        )
    with tracking.stage_run(run_name, params=params, tags=tags, experiment=experiment) as run:
        tracking.log_metrics(metrics)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "decision.json")
            artifacts.write_json(path, record)
            tracking.log_artifact(path)
        return run.info.run_id


@task(name="commit-corpus-state", retries=2, retry_condition_fn=retry_unless_input_error, retry_delay_seconds=2)
def commit_state(state_dir: str, check: sync.CorpusCheck, corpus: str, index_dir: str, extra: dict) -> dict:
    """Record the processed corpus (written last: a crash before it means the next run redoes the work)."""
    return sync.commit_state(state_dir, check, read_corpus(corpus), index_dir, extra)


def configure_s3_from_block(block_name: str) -> str:
    """Configure S3 access from a Prefect ``Secret`` block holding JSON with endpoint_url, key and secret.

    Returns a log-safe description (credentials never logged).
    """
    from prefect.blocks.system import Secret
    from pydantic import SecretStr

    from infra import s3

    data = Secret.load(block_name).get()
    opts = s3.S3Options(endpoint_url=data.get("endpoint_url"), key=SecretStr(data["key"]) if data.get("key") else None,
                        secret=SecretStr(data["secret"]) if data.get("secret") else None)
    return s3.describe(s3.configure(opts))


def flow_run_info() -> dict[str, str]:
    """Prefect flow-run id and name of the current run ({} outside a run)."""
    try:
        ctx = get_run_context()
    except RuntimeError:
        return {}
    fr = getattr(ctx, "flow_run", None) or getattr(getattr(ctx, "task_run", None), "flow_run", None)
    return {"prefect.flow_run_id": str(fr.id), "prefect.flow_run_name": fr.name} if fr else {}


@task(name="record-decision")
def record_decision(key: str, markdown: str) -> None:
    """Attach the decision to the flow run as a markdown artifact (visible in the Prefect UI)."""
    create_markdown_artifact(key=key, markdown=markdown, description="scheduled retraining decision")
