"""Benchmark records and loading: shipped minis, full sets from any path, FlashRAG and R1-Searcher jsonl."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Question(BaseModel):
    """One QA example. ``golden_answers``: any of them counts as correct."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Dataset-unique id.")
    question: str = Field(description="Question text.")
    golden_answers: list[str] = Field(default_factory=list, description="Accepted answers.")
    dataset: str = Field(default="", description="Dataset name (hotpotqa, 2wikimultihopqa, musique, bamboogle...).")
    supporting_doc_ids: list[str] = Field(default_factory=list, description="Corpus ids of gold passages.")
    metadata: dict = Field(default_factory=dict, description="Anything else the source row carried.")
