"""Core retrieval types shared by every backend, the server and the client."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class Passage(BaseModel):
    """One retrievable unit of a corpus. ``contents`` is ``"Title"\\ntext`` (the FlashRAG/Search-R1 convention)."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Corpus-unique id.")
    title: str = Field(default="", description="Document title (may be empty).")
    text: str = Field(description="Passage text without the title.")

    @property
    def contents(self) -> str:
        """FlashRAG-style contents: quoted title line, newline, text."""
        return f'"{self.title}"\n{self.text}' if self.title else self.text


class Hit(BaseModel):
    """One search result."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(description="Passage id.")
    title: str = Field(default="", description="Passage title.")
    text: str = Field(description="Passage text without the title.")
    score: float = Field(description="Backend score; higher is better.")

    @property
    def contents(self) -> str:
        """FlashRAG-style contents of the hit."""
        return f'"{self.title}"\n{self.text}' if self.title else self.text


@runtime_checkable
class Searcher(Protocol):
    """A loaded index. ``search`` takes a batch of queries and returns the top-k hits per query."""

    name: str

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Return, for each query, up to ``k`` hits sorted by descending score."""
        ...
