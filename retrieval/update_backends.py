"""Backend steps of an incremental index update (``retrieval.update`` plans; this module touches the engines).

The updated passage store is ordered *kept passages in their old row order, then new/changed passages in corpus
order*. That order is what makes in-place updates possible without an id map: removing rows from a faiss flat
index (``remove_ids``) compacts the remaining vectors in order, and appending the fresh vectors gives exactly the
new rows, so faiss ids stay equal to passage-store rows (what ``DenseSearcher`` expects).

Per backend (what each can do in place, and what is rebuilt):
- dense flat: in place (read the old index, ``remove_ids`` of deleted/changed rows, ``add`` the fresh vectors);
- dense hnsw: faiss HNSW cannot remove vectors, so with deletions/changes it is rebuilt from the stored vectors
  (no encoding); with additions only the new vectors are added in place;
- dense ivfpq: IVF ``remove_ids`` does not renumber ids, so it is retrained and rebuilt from the stored vectors;
- bm25: bm25s statistics (idf, average length) are corpus-wide, so the index is rebuilt from the store
  (``retrieval.backends.BM25Backend``);
- colbert (PyLate + Voyager): in place: ``remove_documents`` (Voyager ``mark_deleted``) of deleted/changed rows,
  the remaining document ids renumbered to their new rows, and only the fresh passages encoded and added.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from infra.artifacts import atomic_open, read_manifest
from infra.errors import ArtifactError
from retrieval import encoders
from retrieval.colbert import MODEL_DIR, VOYAGER_NAME, ColbertConfig, _load_pylate
from retrieval.dense import INDEX_FILE, SHARDS_DIR, DenseIndexConfig, ShardRef, build_faiss_index, shard_path
from retrieval.index_config import IndexBuildConfig
from retrieval.store import PassageStore, StoreInfo
from retrieval.vectors import VectorStore, read_rows


def _write_faiss(index: Any, path: Path) -> None:
    import faiss

    tmp = path.with_name(path.name + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, path)


def update_faiss(cfg: DenseIndexConfig, previous: Path, out: Path, removed: list[int], shards: list[ShardRef],
                 n_kept: int, rebuild: bool = False) -> tuple[dict[str, Any], str]:
    """Write ``out/index.faiss`` for the updated store; returns (index params, how it was done).

    Args:
        cfg: faiss config (same build parameters as the previous index).
        previous: the previous index directory (read only).
        out: the new index directory.
        removed: previous-store rows that are gone (deleted or changed passages).
        shards: the new index's embedding shards (rows ``n_kept..`` are the fresh vectors).
        n_kept: rows kept from the previous index (they come first, in their old order).
        rebuild: the faiss build parameters changed: rebuild from the stored vectors.
    """
    import faiss

    n = sum(s.n for s in shards)
    if not rebuild and (cfg.type == "flat" or (cfg.type == "hnsw" and not removed)):
        index = faiss.read_index(str(previous / INDEX_FILE))
        if removed:  # IndexFlat compacts in order: survivors take rows 0..n_kept-1 of the new store
            index.remove_ids(np.asarray(removed, dtype=np.int64))
        fresh = read_rows(shards, np.arange(n_kept, n))
        if len(fresh):
            index.add(np.ascontiguousarray(fresh))
        if index.ntotal != n:
            raise ArtifactError(f"updated faiss index of {out} has {index.ntotal} vectors for {n} passages; rerun "
                                "with refresh=full")
        _write_faiss(index, out / INDEX_FILE)
        params = dict((read_manifest(previous) or {}).get("ref", {}).get("params", {}))
        how = f"faiss {cfg.type}: in place (remove_ids {len(removed)} + add {len(fresh)})"
        return {**params, "ntotal": int(index.ntotal), "built_on_gpu": False}, how
    params = build_faiss_index(shards, cfg, out / INDEX_FILE)
    why = ("faiss build parameters changed" if rebuild else "HNSW cannot remove vectors" if cfg.type == "hnsw"
           else "IVF remove_ids does not renumber ids")
    return params, f"faiss {cfg.type}: {why}; rebuilt from stored vectors (no encoding)"


def assemble_shards(cfg: IndexBuildConfig, out: Path, info: StoreInfo, kept_rows: list[int], vectors: VectorStore,
                    encoder: encoders.Encoder | None) -> tuple[list[ShardRef], int]:
    """Write the new index's shards: stored vectors for kept rows, encoder output for fresh rows only; returns the
    shard refs and the number of passages encoded."""
    store, n_kept, encoded, refs = PassageStore(out), len(kept_rows), 0, []
    for spec in info.shards:
        path = shard_path(out / SHARDS_DIR, spec, cfg.encoder)
        key = path.stem.rsplit("-", 1)[-1]
        if path.exists():  # written by an earlier, interrupted attempt at the same update
            arr = np.load(path, mmap_mode="r")
            refs.append(ShardRef(index=spec.index, path=str(path), key=key, n=arr.shape[0], dim=arr.shape[1],
                                 seconds=0.0, cached=True))
            continue
        parts, seconds = [], 0.0
        if spec.start < min(spec.stop, n_kept):
            parts.append(vectors.vectors(kept_rows[spec.start:min(spec.stop, n_kept)]))
        if (f_start := max(spec.start, n_kept)) < spec.stop:
            enc = encoder or encoders.get_encoder(cfg.encoder)
            texts = [p.contents for p in store.rows(f_start, spec.stop)]
            t0 = time.perf_counter()
            parts.append(np.asarray(enc.encode(texts, "passage"), dtype=np.float32))
            seconds, encoded = time.perf_counter() - t0, encoded + len(texts)
        arr = np.ascontiguousarray(np.concatenate(parts))
        if arr.shape != (spec.stop - spec.start, vectors.dim):
            raise ArtifactError(f"shard {spec.index} of {out}: vectors {arr.shape} do not fit "
                                f"{spec.stop - spec.start} passages of dim {vectors.dim}; rerun with refresh=full")
        with atomic_open(path, "wb") as fh:
            np.save(fh, arr)
        refs.append(ShardRef(index=spec.index, path=str(path), key=key, n=arr.shape[0], dim=arr.shape[1],
                             seconds=seconds, cached=False))
    keep = {Path(r.path).name for r in refs}
    for stale in (out / SHARDS_DIR).glob("*"):
        if stale.name not in keep:
            stale.unlink()
    return refs, encoded


def _renumber(index: Any, new_row_of: dict[str, str]) -> None:
    """Rename PyLate's document ids (old store rows) to the new store rows in its two id maps."""
    docs = index._load_documents_ids_to_embeddings()  # noqa: SLF001 - PyLate keeps the maps behind these helpers
    embs = index._load_embeddings_to_documents_ids()  # noqa: SLF001
    index._save_mappings({new_row_of[d]: e for d, e in docs.items()},  # noqa: SLF001
                         {e: new_row_of[d] for e, d in embs.items()})


def update_colbert(cfg: ColbertConfig, previous: Path, out: Path, kept_rows: list[int], removed: list[int]
                   ) -> tuple[dict[str, Any], str, int]:
    """Update a PyLate Voyager index in place in a copy; returns (params, how, passages encoded).

    Args:
        cfg: colbert config (engine pylate-voyager, same model and index parameters as the previous index).
        previous: the previous index directory (read only; its Voyager files and model are copied).
        out: the new index directory, whose store is already written.
        kept_rows: previous-store row of each kept passage, in new-row order (new row i <- kept_rows[i]).
        removed: previous-store rows that are gone (deleted or changed passages).
    """
    from pylate import indexes

    for name in (MODEL_DIR, VOYAGER_NAME):
        shutil.rmtree(out / name, ignore_errors=True)
        shutil.copytree(previous / name, out / name)
    model = _load_pylate(str(out / MODEL_DIR), cfg)
    index = indexes.Voyager(index_folder=str(out), index_name=VOYAGER_NAME, override=False,
                            embedding_size=model.get_sentence_embedding_dimension(), ef_search=cfg.ef_search)
    if removed:
        index.remove_documents([str(r) for r in removed])
    if removed or kept_rows != list(range(len(kept_rows))):
        _renumber(index, {str(old): str(new) for new, old in enumerate(kept_rows)})
    store = PassageStore(out)
    n_kept, encoded, n_tokens, t0 = len(kept_rows), 0, 0, time.perf_counter()
    for start in range(n_kept, len(store), cfg.chunk_size):
        rows = store.rows(start, start + cfg.chunk_size)
        emb = model.encode([p.contents for p in rows], is_query=False, batch_size=cfg.batch_size,
                           show_progress_bar=False)
        index.add_documents(documents_ids=[str(start + i) for i in range(len(rows))], documents_embeddings=emb)
        encoded += len(rows)
        n_tokens += sum(len(e) for e in emb)
    params = dict((read_manifest(previous) or {}).get("ref", {}).get("params", {}))
    params["n_token_vectors"] = sum(len(e) for e in index._load_documents_ids_to_embeddings().values())  # noqa: SLF001
    how = (f"colbert voyager: in place (mark_deleted {len(removed)} documents, add {encoded} in "
           f"{time.perf_counter() - t0:.1f} s)")
    return {**params, "n_token_vectors_added": n_tokens}, how, encoded
