"""ColBERT late interaction: PyLate + Voyager on CPU (the default), colbert-ai PLAID on GPU workers.

Why two engines (measured, ../shared/notes/deps.md §6, on this 2-core machine):
- colbert-ai 0.2.22 runs on CPU but JIT-compiles four C++ extensions on first use (~3 min cold, then 25 s to index
  100 passages, mostly process spawning); its searcher needs three more extension builds (~2.5 min cold). That is
  too slow and fragile for tests and the CPU demo, but PLAID is the reference engine and fast on a GPU, so it is
  the ``colbert-plaid`` engine here, imported only when chosen (GPU test marked ``gpu``).
- PyLate 1.6.0 with its Voyager (HNSW over token vectors) index builds no extensions: 1,000 passages indexed in
  ~15 s cold, queries in well under a second. Its PLAID(use_fast=False) builds the same kind of extensions (145 s
  cold) and fast-plaid has no wheel for torch 2.13. So the CPU path is ``pylate-voyager``.

Quality caveat: offline we only have all-MiniLM-L6-v2, not a trained ColBERT checkpoint. PyLate turns it into a
ColBERT model by adding [Q]/[D] marker tokens and a 384->128 projection that is *randomly initialised* (seeded, and
saved inside the index so queries and documents share it). Token-level MaxSim over random projections of good
contextual embeddings still retrieves, but well below a trained ColBERT; the numbers prove the mechanics, not the
method. Point ``colbert.model`` at a trained PyLate/ColBERT checkpoint to get real quality.

Note: Voyager keeps its id maps as pickle files written by PyLate; only load ColBERT indexes you built yourself.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from infra.config import StrictModel
from infra.errors import ConfigError
from retrieval.encoders import MINILM_ALIASES, resolve_model_path
from retrieval.store import PassageStore
from retrieval.types import Hit

log = logging.getLogger(__name__)

MODEL_DIR = "colbert_model"
VOYAGER_NAME = "voyager"
PLAID_NAME = "plaid"


class ColbertConfig(StrictModel):
    """Late-interaction engine, model and index parameters."""

    engine: Literal["pylate-voyager", "colbert-plaid"] = Field(
        default="pylate-voyager", description="pylate-voyager runs on CPU; colbert-plaid (colbert-ai) on GPU workers."
    )
    model: str = Field(
        default="minilm",
        description="ColBERT checkpoint (path/name); 'minilm' builds one from all-MiniLM-L6-v2 with an untrained "
        "projection (mechanics only). colbert-plaid needs a trained checkpoint such as colbert-ir/colbertv2.0.",
    )
    document_length: int = Field(default=180, ge=16, description="Max document tokens.")
    query_length: int = Field(default=32, ge=4, description="Query tokens (padded with [MASK] for expansion).")
    batch_size: int = Field(default=32, ge=1, description="Texts per forward pass.")
    chunk_size: int = Field(default=2000, ge=1, description="Passages encoded and added to Voyager per step.")
    voyager_m: int = Field(default=16, ge=4, description="Voyager HNSW neighbours per node.")
    ef_construction: int = Field(default=100, ge=8, description="Voyager build-time candidate list size.")
    ef_search: int = Field(default=200, ge=8, description="Voyager search-time candidate list size.")
    k_token: int = Field(default=64, ge=1, description="Candidate token neighbours per query token before MaxSim.")
    plaid_nbits: int = Field(default=2, ge=1, le=8, description="colbert-plaid residual compression bits.")
    seed: int = Field(default=0, description="Seed for the projection layer when it has to be initialised.")


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _load_pylate(model_path: str, cfg: ColbertConfig) -> Any:
    from pylate import models

    return models.ColBERT(
        model_name_or_path=model_path,
        device=_device(),
        document_length=cfg.document_length,
        query_length=cfg.query_length,
    )


def _build_pylate(store: PassageStore, cfg: ColbertConfig, out: Path) -> dict[str, Any]:
    import torch
    from pylate import indexes

    torch.manual_seed(cfg.seed)
    model = _load_pylate(resolve_model_path(cfg.model), cfg)
    model.save(str(out / MODEL_DIR))  # the (possibly random) projection must be the one queries use
    index = indexes.Voyager(
        index_folder=str(out), index_name=VOYAGER_NAME, override=True,
        embedding_size=model.get_sentence_embedding_dimension(), M=cfg.voyager_m,
        ef_construction=cfg.ef_construction, ef_search=cfg.ef_search,
    )
    n_tokens = 0
    for start in range(0, len(store), cfg.chunk_size):
        rows = store.rows(start, start + cfg.chunk_size)
        emb = model.encode([p.contents for p in rows], is_query=False, batch_size=cfg.batch_size,
                           show_progress_bar=False)
        n_tokens += sum(len(e) for e in emb)
        index.add_documents(documents_ids=[str(start + i) for i in range(len(rows))], documents_embeddings=emb)
    return {"engine": cfg.engine, "n_token_vectors": n_tokens, "dim": model.get_sentence_embedding_dimension()}


def _build_plaid(store: PassageStore, cfg: ColbertConfig, out: Path) -> dict[str, Any]:
    if cfg.model.lower() in MINILM_ALIASES:
        raise ConfigError("colbert.engine=colbert-plaid needs a trained ColBERT checkpoint (colbert-ai re-initialises "
                          "the projection on every load); set colbert.model=colbert-ir/colbertv2.0 or a local copy")
    from colbert import Indexer
    from colbert.infra import ColBERTConfig, Run, RunConfig

    collection = [p.contents for p in store]
    with Run().context(RunConfig(nranks=1, experiment="searchloop", root=str(out))):
        conf = ColBERTConfig(nbits=cfg.plaid_nbits, doc_maxlen=cfg.document_length, query_maxlen=cfg.query_length,
                             index_root=str(out))
        Indexer(checkpoint=cfg.model, config=conf).index(name=PLAID_NAME, collection=collection, overwrite=True)
    return {"engine": cfg.engine, "checkpoint": cfg.model}


def build_colbert_index(store_dir: str | os.PathLike[str], cfg: ColbertConfig) -> dict[str, Any]:
    """Encode every passage of the store in ``store_dir`` and write the late-interaction index next to it.

    Returns:
        Effective parameters for the manifest (engine, token-vector count, dim).
    """
    out = Path(store_dir)
    store = PassageStore(out)
    if len(store) == 0:
        raise ConfigError("cannot build a ColBERT index over an empty corpus")
    if cfg.engine == "colbert-plaid":
        return _build_plaid(store, cfg, out)
    return _build_pylate(store, cfg, out)


class ColbertSearcher:
    """PyLate Voyager index + saved ColBERT model: token-level candidates, then exact MaxSim reranking."""

    name = "colbert"

    def __init__(self, model: Any, retriever: Any, store: PassageStore, cfg: ColbertConfig) -> None:
        self.model, self.retriever, self.store, self.cfg = model, retriever, store, cfg

    @classmethod
    def load(cls, directory: str | os.PathLike[str], cfg: ColbertConfig) -> ColbertSearcher | PlaidSearcher:
        """Load an index built by :func:`build_colbert_index` with the same ``cfg``."""
        if cfg.engine == "colbert-plaid":
            return PlaidSearcher.load(directory, cfg)
        from pylate import indexes, retrieve

        d = Path(directory)
        model = _load_pylate(str(d / MODEL_DIR), cfg)
        index = indexes.Voyager(index_folder=str(d), index_name=VOYAGER_NAME, override=False,
                                embedding_size=model.get_sentence_embedding_dimension(), ef_search=cfg.ef_search)
        return cls(model, retrieve.ColBERT(index=index), PassageStore(d), cfg)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` passages per query by ColBERT MaxSim (one encoder call and one index call per batch)."""
        if not queries:
            return []
        k = max(1, min(k, len(self.store)))
        q = self.model.encode(list(queries), is_query=True, batch_size=self.cfg.batch_size, show_progress_bar=False)
        results = self.retriever.retrieve(queries_embeddings=q, k=k, k_token=self.cfg.k_token, device="cpu")
        return [[self._hit(r["id"], r["score"]) for r in per_query] for per_query in results]

    def _hit(self, row: str, score: float) -> Hit:
        p = self.store[int(row)]
        return Hit(id=p.id, title=p.title, text=p.text, score=float(score))


class PlaidSearcher:
    """colbert-ai PLAID searcher (GPU workers); pids are passage-store rows."""

    name = "colbert"

    def __init__(self, searcher: Any, store: PassageStore) -> None:
        self._searcher, self.store = searcher, store

    @classmethod
    def load(cls, directory: str | os.PathLike[str], cfg: ColbertConfig) -> PlaidSearcher:
        """Open the PLAID index in ``directory``."""
        from colbert import Searcher
        from colbert.infra import ColBERTConfig, Run, RunConfig

        d = Path(directory)
        store = PassageStore(d)
        with Run().context(RunConfig(nranks=1, experiment="searchloop", root=str(d))):
            searcher = Searcher(index=PLAID_NAME, index_root=str(d), collection=[p.contents for p in store],
                                config=ColBERTConfig(query_maxlen=cfg.query_length))
        return cls(searcher, store)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Top-``k`` passages per query from PLAID."""
        if not queries:
            return []
        ranking = self._searcher.search_all({i: q for i, q in enumerate(queries)}, k=max(1, k)).todict()
        out = []
        for i in range(len(queries)):
            hits = []
            for pid, _rank, score in ranking.get(i, []):
                p = self.store[int(pid)]
                hits.append(Hit(id=p.id, title=p.title, text=p.text, score=float(score)))
            out.append(hits)
        return out
