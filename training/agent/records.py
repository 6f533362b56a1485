"""Trajectory records: what a rollout produced, per turn, with the token ids and loss mask training needs.

Written as ``trajectories.jsonl`` and ``trajectories.parquet`` plus ``manifest.json`` (last) by
:func:`write_trajectories`; read back with :func:`read_trajectories`.
"""

from __future__ import annotations

import os
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from infra import artifacts


class Turn(BaseModel):
    """One generation step of a trajectory and the search it triggered (if any)."""

    model_config = ConfigDict(frozen=True)

    generated: str = Field(description="Text the model generated in this step (stop string included).")
    query: str | None = Field(default=None, description="Search query issued after this step (None = no search).")
    doc_ids: list[str] = Field(default_factory=list, description="Ids of the retrieved documents.")
    doc_texts: list[str] = Field(default_factory=list, description="Retrieved documents' contents.")
    scores: list[float] = Field(default_factory=list, description="Retriever scores of the documents.")
    inserted: str = Field(default="", description="Text inserted after this step (documents, feedback, turns).")
    finish_reason: str = Field(default="", description="Backend finish reason of the step: stop/length/eos.")
    stop: str | None = Field(default=None, description="Stop string that ended the step, if any.")
    tokens: int = Field(default=0, description="Generated tokens in this step.")
    logprob: float | None = Field(default=None, description="Cumulative log-probability of the step, if computed.")


class Trajectory(BaseModel):
    """A finished (or cut) rollout of one question by one protocol."""

    model_config = ConfigDict(frozen=True)

    question_id: str = Field(description="Question id.")
    question: str = Field(description="Question text.")
    golden_answers: list[str] = Field(default_factory=list, description="Accepted answers (copied for scoring).")
    dataset: str = Field(default="", description="Dataset name.")
    sample: int = Field(default=0, description="Sample index among the n samples of this question.")
    protocol: str = Field(description="Protocol name (a key of training.protocols.registry.PROTOCOLS).")
    prompt: str = Field(description="Prompt text (chat template applied).")
    response: str = Field(description="Full response text after the prompt (generated + inserted).")
    turns: list[Turn] = Field(default_factory=list, description="Generation steps in order.")
    final_answer: str | None = Field(default=None, description="Extracted prediction (None = no answer).")
    finish_reason: str = Field(description="answer / eos / max_turns / length.")
    n_searches: int = Field(default=0, description="Searches executed.")
    generated_spans: list[tuple[int, int]] = Field(
        default_factory=list, description="Character spans [start, end) of generated text within the response."
    )
    token_ids: list[int] = Field(
        default_factory=list,
        description="Response training ids: the sampled ids of generated text, inserted text tokenized on its own.",
    )
    loss_mask: list[int] = Field(default_factory=list, description="1 = generated token, 0 = inserted token.")
    format_ok: bool | None = Field(default=None, description="The protocol validator's verdict on the response.")
    format_reasons: list[str] = Field(default_factory=list, description="Why the format check failed.")
    timings: dict[str, float] = Field(default_factory=dict, description="Seconds: generate, search, total.")


class TrajectoriesRef(BaseModel):
    """Reference to a complete trajectories directory (what tasks pass around instead of the records)."""

    model_config = ConfigDict(frozen=True)

    uri: str = Field(description="Directory (local path or fsspec URI) holding the files and manifest.json.")
    count: int = Field(description="Number of trajectories.")
    protocols: list[str] = Field(default_factory=list, description="Protocols present.")


def write_trajectories(
    trajectories: list[Trajectory], directory: str | os.PathLike[str], **manifest: Any
) -> TrajectoriesRef:
    """Write ``trajectories.jsonl`` + ``trajectories.parquet`` then ``manifest.json`` (last); return a ref.

    Extra keyword arguments go into the manifest (inputs, config hash...).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    uri = str(directory)
    rows = [t.model_dump(mode="json") for t in trajectories]
    artifacts.write_jsonl(artifacts.join(uri, "trajectories.jsonl"), rows)
    flat = [{**r, "turns": orjson.dumps(r["turns"]).decode(), "timings": orjson.dumps(r["timings"]).decode(),
             "generated_spans": [list(s) for s in r["generated_spans"]]} for r in rows]
    table = pa.Table.from_pylist(flat) if flat else pa.table({"question_id": pa.array([], pa.string())})
    with artifacts.atomic_open(artifacts.join(uri, "trajectories.parquet"), "wb") as fh:
        pq.write_table(table, fh)
    protocols = sorted({t.protocol for t in trajectories})
    artifacts.write_manifest(uri, kind="trajectories", count=len(trajectories), protocols=protocols, **manifest)
    return TrajectoriesRef(uri=uri, count=len(trajectories), protocols=protocols)


def read_trajectories(ref: TrajectoriesRef | str | os.PathLike[str]) -> list[Trajectory]:
    """Read the trajectories of a complete directory (raises ArtifactError when the manifest is missing)."""
    uri = ref.uri if isinstance(ref, TrajectoriesRef) else str(ref)
    artifacts.require_manifest(uri, kind="trajectories")
    return [Trajectory.model_validate(r) for r in artifacts.read_jsonl(artifacts.join(uri, "trajectories.jsonl"))]
