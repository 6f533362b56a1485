"""The index build config and the table of retriever backends (a leaf: config models and infra only).

:data:`INDEX_BACKENDS` names each backend's :class:`retrieval.backends.IndexBackend` as a dotted import string
(imported only when chosen, like ``training.generation.base.GENERATORS``). ``IndexBuildConfig.backend`` is checked
against the table when the config loads, so adding a backend is one module plus one line here (see
docs/extending.md).
"""

from __future__ import annotations

from pydantic import Field

from infra.config import StrictModel
from infra.lazy import table_name
from retrieval.colbert import ColbertConfig
from retrieval.dense import DenseIndexConfig
from retrieval.encoders import EncoderConfig
from retrieval.hybrid import HybridConfig

INDEX_BACKENDS: dict[str, str] = {
    "bm25": "retrieval.backends:BM25Backend",
    "dense": "retrieval.backends:DenseBackend",
    "colbert": "retrieval.backends:ColbertBackend",
    "hybrid": "retrieval.backends:HybridBackend",
}
BackendName = table_name(INDEX_BACKENDS, "index backend")


class BM25Config(StrictModel):
    """BM25 parameters (bm25s, Lucene variant)."""

    k1: float = Field(default=1.2, gt=0, description="Term-frequency saturation.")
    b: float = Field(default=0.75, ge=0, le=1, description="Length normalization.")


class IndexBuildConfig(StrictModel):
    """Everything that determines an index: corpus, backend and the backend's parameters."""

    corpus: str = Field(
        description="Corpus jsonl (path or s3:// URI). Relative paths resolve from the working directory, then the "
        "repository; 'shared:<rel>' resolves under the shared data dir (SEARCHLOOP_SHARED_DATA_DIR)."
    )
    backend: BackendName = Field(  # type: ignore[valid-type]
        default="bm25", description="A name in retrieval.index_config.INDEX_BACKENDS: bm25, dense (faiss), colbert "
        "(late interaction), hybrid.")
    split_words: int | None = Field(
        default=None, ge=10, description="Split documents longer than this many words (~100 = DPR/KILT); None = keep."
    )
    limit: int | None = Field(default=None, ge=1, description="Index only the first N passages (quick runs).")
    shard_size: int = Field(
        default=4096, ge=1, description="Passages per embedding shard (dense); keep >= 512: the encoder sorts by "
        "length within a shard, and 128-passage shards measured 0.8x its throughput (benchmarks/index_build.py)."
    )
    encoder: EncoderConfig = Field(default_factory=EncoderConfig, description="Dense encoder.")
    faiss: DenseIndexConfig = Field(default_factory=DenseIndexConfig, description="faiss index type and params.")
    colbert: ColbertConfig = Field(default_factory=ColbertConfig, description="Late-interaction engine and params.")
    bm25: BM25Config = Field(default_factory=BM25Config, description="BM25 parameters.")
    hybrid: HybridConfig = Field(default_factory=HybridConfig, description="Backends fused by the hybrid index.")
