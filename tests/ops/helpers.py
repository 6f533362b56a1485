"""Helpers for the ops tests: Prefect API polling and MLflow queries against the test stack."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson

REPO = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.3) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def flow_run(run_id: str):
    """Read a flow run through the Prefect API (call inside ``Stack.client_env``)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(UUID(run_id))


def task_runs(run_id: str) -> list:
    """Task runs of a flow run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(run_id)])))


def mlflow_runs(tracking_uri: str, experiment: str = "searchloop-retrain", filter_string: str = "") -> list:
    """Runs of an experiment on the MLflow server (newest first)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string=filter_string, order_by=["start_time DESC"])


def gold_ids(n_questions: int, eval_set: str = "hotpotqa_mini") -> set[str]:
    """Gold supporting passage ids of the first ``n_questions`` of a shipped eval set."""
    rows = (REPO / "data" / "eval" / f"{eval_set}.jsonl").read_bytes().splitlines()[:n_questions]
    return {pid for row in rows for pid in orjson.loads(row)["supporting_doc_ids"]}


def edit_corpus(path: Path, drop: set[str] = frozenset(), change: set[str] = frozenset(),
                add: list[dict] | None = None) -> None:
    """Rewrite a corpus jsonl: drop ids, append ' (revised)' to the text of ids, append new rows."""
    out = []
    for line in path.read_bytes().splitlines():
        row = orjson.loads(line)
        if row["id"] in drop:
            continue
        if row["id"] in change:
            row["text"] += " (revised)"
            row.pop("contents", None)
        out.append(orjson.dumps(row))
    out.extend(orjson.dumps(r) for r in add or [])
    path.write_bytes(b"\n".join(out) + b"\n")
