"""A smaller query encoder distilled into a dense index's embedding space (issue 26 item 7).

A served dense search is mostly the query encoder (docs/results/engines/session32: 2.47 of the ~2.8 CPU ms a query
costs the server are MiniLM's forward pass). The passages in the index keep the full model's vectors; the queries
can be encoded by a student that keeps every other transformer layer of the index's own encoder and is trained to
give the teacher's query vectors (mean squared error, sentence-transformers' layer-reduction distillation recipe).

:func:`distill_query_encoder` writes the student into a folder (a temporary one, renamed into place, ``manifest.json``
last) whose manifest names the teacher's fingerprint, so that ``EncoderConfig.query_model`` is refused for an index
built with another encoder. The student trains on training-split questions and corpus titles only (never the eval
files), and the manifest records its cosine to the teacher on questions held out of that training. What it costs in
retrieval is measured per index (``benchmarks/query_encoder.py --query-model``); it is opt-in, never a default.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from infra.artifacts import read_jsonl, write_manifest
from infra.errors import ConfigError
from infra.paths import resolve_path
from retrieval.encoders import (
    QUERY_MODEL_KIND,
    EncoderConfig,
    SentenceTransformerEncoder,
    config_fingerprint,
    resolve_model_path,
)

log = logging.getLogger(__name__)

#: the training-split questions every shipped data folder has (shared data's train/), and its training corpus' titles
DEFAULT_QUESTIONS: tuple[str, ...] = (
    "shared:train/r1searcher_train.jsonl", "shared:train/2wikimultihopqa_train_migres.jsonl",
    "shared:train/hotpotqa_train_hipporag.jsonl", "shared:train/musique_train_hipporag.jsonl",
)
DEFAULT_TITLES: tuple[str, ...] = ("shared:corpus/train_wiki.jsonl",)


def training_queries(question_files: list[str], title_files: list[str], limit: int | None = None) -> list[str]:
    """Distinct query texts: the ``question`` of every row of ``question_files`` and the ``title`` of every row of
    ``title_files`` (agents search for entity names as often as for questions), in file order, at most ``limit``.

    Raises:
        ConfigError: when a file is missing or yields no text.
    """
    seen: dict[str, None] = {}
    for files, field in ((question_files, "question"), (title_files, "title")):
        for ref in files:
            path = resolve_path(ref)
            if not os.path.exists(path):
                shown = ref if ref == path else f"{ref} ({path})"
                raise ConfigError(f"distillation queries: {shown} does not exist; pass an existing jsonl")
            for row in read_jsonl(path):
                text = " ".join(str(row.get(field) or "").split())
                if text:
                    seen.setdefault(text, None)
    queries = list(seen)[:limit] if limit else list(seen)
    if not queries:
        raise ConfigError("distillation queries: the files hold no 'question' or 'title' text")
    return queries


def _student(teacher_path: str, layers: list[int], dtype: Any) -> Any:
    """A copy of the teacher's sentence-transformers model keeping only ``layers`` of its transformer."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(teacher_path, device="cpu", model_kwargs={"dtype": dtype})
    auto = model[0].auto_model
    auto.encoder.layer = torch.nn.ModuleList(auto.encoder.layer[i] for i in sorted(layers))
    auto.config.num_hidden_layers = len(layers)
    return model


def distill_query_encoder(teacher: EncoderConfig, out: str | Path, layers: list[int] | None = None,
                          question_files: list[str] | None = None, title_files: list[str] | None = None,
                          epochs: int = 4, batch_size: int = 64, learning_rate: float = 2e-4,
                          heldout: int = 512, limit: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Train a student query encoder on the teacher's query vectors and write it to ``out``; returns its manifest.

    Args:
        teacher: the encoder the index was built with (its fingerprint goes into the manifest).
        out: the student's folder (must not exist yet).
        layers: the teacher's transformer layers the student keeps (default: every other one, from the first).
        question_files / title_files: jsonl files of training queries (default: shared data's train split and its
            training corpus' titles); eval files do not belong here.
        epochs, batch_size, learning_rate: the training run (sentence-transformers' trainer, MSE loss).
        heldout: queries kept out of training, on which the manifest reports the cosine to the teacher.
        limit: use at most this many queries (None = all).
        seed: shuffling and the trainer's seed.

    Raises:
        ConfigError: when ``out`` exists, the layers are invalid or too few training queries are left.
    """
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments, losses

    target = Path(out)
    if target.exists():
        raise ConfigError(f"{target} exists; pick a new folder for the distilled query encoder (or delete it)")
    t0 = time.time()
    teacher_fp32 = SentenceTransformerEncoder(teacher.model_copy(update={"dtype": "float32", "query_backend": "torch"}))
    queries = training_queries(list(question_files or DEFAULT_QUESTIONS), list(title_files or DEFAULT_TITLES), limit)
    random.Random(seed).shuffle(queries)
    held, train = queries[:heldout], queries[heldout:]
    if len(train) < batch_size:
        raise ConfigError(f"{len(train)} training queries after holding out {heldout}: pass more question files")
    prefix = teacher_fp32.query_prefix
    log.info("distilling %s: %d training queries, %d held out", teacher.model, len(train), len(held))
    n_layers = len(teacher_fp32._model[0].auto_model.encoder.layer)
    keep = list(layers) if layers is not None else list(range(0, n_layers, 2))
    if not keep or any(i < 0 or i >= n_layers for i in keep) or len(set(keep)) != len(keep):
        raise ConfigError(f"layers={keep}: pick distinct layer indexes in 0..{n_layers - 1} (the teacher has "
                          f"{n_layers})")
    targets = teacher_fp32.encode(train, "query")
    student = _student(resolve_model_path(teacher.model), keep, torch.float32)
    if teacher.max_length is not None:
        student.max_seq_length = teacher.max_length
    data = Dataset.from_dict({"sentence": [prefix + q for q in train] if prefix else train,
                              "label": targets.tolist()})
    tmp = target.parent / f".tmp-{target.name}-{uuid.uuid4().hex[:8]}"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        args = SentenceTransformerTrainingArguments(
            output_dir=str(tmp / "trainer"), num_train_epochs=epochs, per_device_train_batch_size=batch_size,
            learning_rate=learning_rate, warmup_ratio=0.1, seed=seed, save_strategy="no", report_to=[],
            logging_steps=50, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
        trainer = SentenceTransformerTrainer(model=student, args=args, train_dataset=data,
                                             loss=losses.MSELoss(student))
        result = trainer.train()
        shutil.rmtree(tmp / "trainer", ignore_errors=True)
        student.save_pretrained(str(tmp))
        want = teacher_fp32.encode(held, "query")
        got = student.encode([prefix + q for q in held] if prefix else held, convert_to_numpy=True,
                             normalize_embeddings=True, show_progress_bar=False)
        cos = np.sum(want * got, axis=1) / np.maximum(np.linalg.norm(got, axis=1), 1e-12)
        manifest = write_manifest(
            tmp, kind=QUERY_MODEL_KIND, teacher_model=teacher.model, teacher_fingerprint=config_fingerprint(teacher),
            layers=sorted(keep), teacher_layers=n_layers, n_train=len(train), n_heldout=len(held),
            epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, seed=seed,
            question_files=list(question_files or DEFAULT_QUESTIONS), title_files=list(title_files or DEFAULT_TITLES),
            train_loss=float(result.training_loss), heldout_cosine_mean=float(cos.mean()),
            heldout_cosine_min=float(cos.min()), seconds=round(time.time() - t0, 1))
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("distilled query encoder -> %s (held-out cosine mean %.4f, min %.4f)", target,
             manifest["heldout_cosine_mean"], manifest["heldout_cosine_min"])
    return manifest
