"""The retriever reference every config names: :class:`RetrieverSpec` (a leaf: pydantic and ``infra.config`` only).

Opening it is :func:`retrieval.open.open_searcher`; the bearer token's environment variable :data:`TOKEN_ENV` is
read by :class:`retrieval.client.RetrieverClient`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, SecretStr, field_validator, model_serializer, model_validator

from infra.config import StrictModel

TOKEN_ENV = "SEARCHLOOP_RETRIEVER_TOKEN"  # the token when none is passed (how workers get it: never in a record)

_LEGACY = {"kind": "the kind follows from which of url/index/corpus is set",
           "backend": "the backend follows from which of url/index/corpus is set"}


#: what encodes a dense index's queries (``EncoderConfig.query_backend``): the torch model, its int8 pass
#: (retrieval.int8_bert), or ONNX Runtime (fp32, int8)
QueryBackend = Literal["torch", "torch-int8", "onnx", "onnx-int8"]
QUERY_BACKENDS: tuple[str, ...] = get_args(QueryBackend)


class RetrieverSpec(StrictModel):
    """Where searches go: a server (``url``), a built index directory (``index``) or corpus files (``corpus``)."""

    one_of: ClassVar[tuple[str, ...]] = ("url", "index", "corpus")

    url: str | None = Field(default=None, description="Base URL of a searchloop/FlashRAG-compatible retriever server.")
    index: str | None = Field(
        default=None, description="Directory built by `searchloop index build` (bm25, dense, colbert or hybrid).")
    corpus: list[str] | None = Field(
        default=None, description="Corpus jsonl file(s) to index with BM25 in memory (a single path is accepted).")
    token: SecretStr | None = Field(
        default=None, description=f"Bearer token for the server (recorded as '**********'; unset: ${TOKEN_ENV}).")
    timeout_s: float = Field(default=30.0, gt=0, description="HTTP timeout per retriever call (url).")
    wait_s: float = Field(default=0.0, ge=0, description="url: wait up to this long for the server to be healthy.")
    query_backend: QueryBackend | None = Field(
        default=None, description="index: what encodes a dense index's queries (EncoderConfig.query_backend); None = "
        "the setting the index was built with.")
    query_model: str | None = Field(
        default=None, description="index: a query encoder distilled into a dense index's space "
        "(EncoderConfig.query_model, `searchloop index distill-queries`); None = the index's own encoder.")

    @model_serializer(mode="wrap")
    def _drop_unset_query_backend(self, handler: Any) -> dict[str, Any]:
        """Unset, ``query_backend`` and ``query_model`` are left out of dumps, so the keys of runs whose configs
        embed a spec stay what they were before the fields existed."""
        data = handler(self)
        for key in ("query_backend", "query_model"):
            if data.get(key, "") is None:
                del data[key]
        return data

    @model_validator(mode="before")
    @classmethod
    def _no_legacy_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, why in _LEGACY.items():
                if key in data:
                    raise ValueError(f"`{key}` is gone ({why}): set exactly one of url / index / corpus")
        return data

    @field_validator("corpus", mode="before")
    @classmethod
    def _one_path_is_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _exactly_one(self) -> RetrieverSpec:
        given = [k for k in self.one_of if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"set exactly one of url / index / corpus (got {given or 'none'}), e.g. "
                             "index=.searchloop/runs/indexes/<dir> or corpus=data/corpus/mini.jsonl")
        return self

    @property
    def kind(self) -> str:
        """``url``, ``index`` or ``corpus``: which one is set."""
        return next(k for k in self.one_of if getattr(self, k))

    def describe(self) -> str:
        """A short human/MLflow-safe description (no token)."""
        if self.url:
            return f"url:{self.url}"
        if self.index:
            return f"index:{self.index}"
        return "bm25:" + ",".join(self.corpus or [])
