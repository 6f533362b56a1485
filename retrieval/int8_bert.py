"""int8 query passes of a BERT sentence encoder on the CPU: ``EncoderConfig.query_backend="torch-int8"``.

The unpadded pass of :mod:`retrieval.unpadded_bert` with its four products per layer as ``torch._int_mm`` (int8 x int8
to int32, twice the bf16 rate of a Zen 4 core with avx512_vnni) and their epilogues fused into one pass per row
(:mod:`retrieval.int8_kernels`). What keeps the vectors close to the fp32 model:

- Activations are quantized per token (each row its own scale), so a query's vector does not depend on the other
  queries of its call (ONNX Runtime's dynamic int8 quantizes per call: session 48 found a query's top-5 set changed
  with its call for 46% of dev questions).
- Weights are quantized per output channel.
- SmoothQuant (Xiao et al., 2023): each product's input channels are divided by ``s_j = max|x_j|^alpha /
  max|w_j|^(1 - alpha)`` and its weight columns multiplied by it, moving the activations' outlier channels into the
  weights. ``max|x_j|`` is calibrated on training questions (never an eval file) with the fp32 model; the division is
  folded into the previous epilogue (or, for the attention output, into V's output channels).
- Everything between the products (attention, layer norms, GELU, pooling) runs in fp32.

What it costs in retrieval quality and what it saves is measured per index: ``benchmarks/query_encoder.py`` (agreement
with fp32 and recall of the gold passages) and docs/results/engines/session50.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from retrieval.unpadded_bert import CallLayout, UnpaddedEncoder, bert_parts

#: SmoothQuant's migration strength (0 = none, 1 = all of the activations' range into the weights)
DEFAULT_ALPHA = 0.65


def int8_supported() -> bool:
    """Whether this CPU and environment run the int8 pass: ``torch._int_mm`` on the CPU and numba importable."""
    try:
        import numba  # noqa: F401
        import torch

        a = torch.ones(16, 16, dtype=torch.int8)
        return int(torch._int_mm(a, a)[0, 0]) == 16
    except Exception:  # noqa: BLE001 - any failure means "not here"
        return False


def calibration_questions() -> list[str]:
    """The questions of the shipped training minis (``data/train/*_train_mini.jsonl``, 140 questions; never an eval
    file): what :func:`calibrate` runs when the encoder builds its int8 pass. On the 960 dev questions of the session-50
    exploration they smoothed as well as 1,500 shared training questions (docs/results/engines/session50)."""
    import orjson

    from infra.settings import SHIPPED_DATA

    files = sorted(p for p in (SHIPPED_DATA / "train").glob("*_train_mini.jsonl") if not p.name.startswith("corpus"))
    questions = [row["question"] for f in files for line in f.read_bytes().splitlines() if line.strip()
                 for row in [orjson.loads(line)] if row.get("question")]
    if not questions:
        raise FileNotFoundError(f"no training questions under {SHIPPED_DATA / 'train'} to calibrate the int8 query "
                                "pass: restore data/train/*_train_mini.jsonl from the repository")
    return questions


def calibrate(model: Any, texts: Iterable[str], batch_size: int = 64) -> dict[str, Any]:
    """Per input channel max |x| of every linear layer of the sentence-transformers ``model``'s BERT (fp32) over
    ``texts``, by linear-layer name."""
    import torch

    parts = bert_parts(model)
    if parts is None:
        raise ValueError("calibrate needs a sentence-transformers BERT model (retrieval.unpadded_bert.bert_parts)")
    linears = {name: mod for name, mod in parts[0].encoder.named_modules() if isinstance(mod, torch.nn.Linear)}
    seen: dict[str, Any] = {}

    def hook(name: str) -> Any:
        def record(_mod: Any, inputs: tuple[Any, ...]) -> None:
            x = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0).float()
            seen[name] = x if name not in seen else torch.maximum(seen[name], x)
        return record

    handles = [mod.register_forward_pre_hook(hook(name)) for name, mod in linears.items()]
    try:
        with torch.inference_mode():
            model.encode(list(texts), batch_size=batch_size, show_progress_bar=False)
    finally:
        for handle in handles:
            handle.remove()
    return seen


class _Product:
    """One linear layer as int8: weight [in, out] int8 (a transposed view), per-output scale and bias (fp32), and
    the per-input smoothing its input must be multiplied by before quantization."""

    def __init__(self, weight: Any, bias: Any, act_max: Any, alpha: float) -> None:
        import torch

        w = weight.detach().float()
        smooth = act_max.clamp_min(1e-5) ** alpha / w.abs().amax(0).clamp_min(1e-5) ** (1 - alpha)
        w = w * smooth
        scale = w.abs().amax(1).clamp_min(1e-8) / 127
        self.weight = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8).t()
        self.scale = scale.contiguous().numpy()
        self.bias = bias.detach().float().contiguous().numpy()
        self.smooth = (1 / smooth).contiguous().numpy()

    def product(self, q: np.ndarray) -> np.ndarray:
        """int32 [rows, out] = q [rows, in] (int8) x weight."""
        import torch

        return torch._int_mm(torch.from_numpy(q), self.weight).numpy()


class Int8Bert(UnpaddedEncoder):
    """Inference-only BERT forward over a call's unpadded tokens with int8 products (see the module docstring)."""

    def __init__(self, bert: Any, pooling: str, lower_case: bool = False, *, calibration: dict[str, Any],
                 alpha: float = DEFAULT_ALPHA) -> None:
        import torch

        emb = bert.embeddings
        self.pooling, self.lower_case, self.alpha = pooling, lower_case, alpha
        self.word = emb.word_embeddings.weight.detach().float()
        self.position = emb.position_embeddings.weight.detach().float()
        self.token_type = emb.token_type_embeddings.weight.detach().float()
        self.embed_norm = (emb.LayerNorm.weight.detach().float(), emb.LayerNorm.bias.detach().float(),
                           emb.LayerNorm.eps)
        self.heads = bert.config.num_attention_heads
        self.hidden = bert.config.hidden_size

        def norm(layer_norm: Any) -> tuple[np.ndarray, np.ndarray, float]:
            return (layer_norm.weight.detach().float().numpy(), layer_norm.bias.detach().float().numpy(),
                    float(layer_norm.eps))

        self.layers = []
        for i, layer in enumerate(bert.encoder.layer):
            name = f"layer.{i}."
            missing = [n for n in ("attention.self.query", "attention.output.dense", "intermediate.dense",
                                   "output.dense") if name + n not in calibration]
            if missing:
                raise ValueError(f"calibration has no statistics for {[name + n for n in missing]}: calibrate() "
                                 "this model")
            att = layer.attention
            qkv = _Product(torch.cat([att.self.query.weight, att.self.key.weight, att.self.value.weight]),
                           torch.cat([att.self.query.bias, att.self.key.bias, att.self.value.bias]),
                           calibration[name + "attention.self.query"], alpha)
            out = _Product(att.output.dense.weight, att.output.dense.bias,
                           calibration[name + "attention.output.dense"], alpha)
            # the attention output's smoothing goes into V: its contexts are weighted sums of V's rows
            h = self.hidden
            qkv.scale[2 * h:] *= out.smooth
            qkv.bias[2 * h:] *= out.smooth
            up = _Product(layer.intermediate.dense.weight, layer.intermediate.dense.bias,
                          calibration[name + "intermediate.dense"], alpha)
            down = _Product(layer.output.dense.weight, layer.output.dense.bias, calibration[name + "output.dense"],
                            alpha)
            self.layers.append((qkv, out, norm(att.output.LayerNorm), up, down, norm(layer.output.LayerNorm)))
        self._ones = np.ones(self.hidden, np.float32)

    def encode(self, token_ids: list[list[int]]) -> np.ndarray:
        """fp32 [n, hidden] pooled (not normalized) vectors of a call's texts given as token ids (one sentence
        each: token type 0)."""
        import torch
        import torch.nn.functional as F

        from retrieval import int8_kernels as k

        hidden, heads = self.hidden, self.heads
        call = CallLayout(token_ids)
        rows = call.rows
        with torch.inference_mode():
            h = self.word[call.ids] + self.position[call.positions] + self.token_type[0]
            h = F.layer_norm(h, (hidden,), *self.embed_norm).numpy()
            q = np.empty((rows, hidden), np.int8)
            s = np.empty(rows, np.float32)
            k.quantize_rows(h, self.layers[0][0].smooth, q, s)
            last = len(self.layers) - 1
            for i, (qkv, out, norm1, up, down, norm2) in enumerate(self.layers):
                fused = np.empty((rows, 3 * hidden), np.float32)
                k.dequantize_rows(qkv.product(q), s, qkv.scale, qkv.bias, fused)
                ctx = call.attention(torch.from_numpy(fused), torch.from_numpy(h), heads).numpy()
                k.quantize_rows(ctx, self._ones, q, s)
                h1 = np.empty((rows, hidden), np.float32)
                k.dequantize_add_norm_quantize(out.product(q), s, out.scale, out.bias, h, *norm1, up.smooth, h1,
                                               q, s, True)
                q4 = np.empty((rows, up.bias.shape[0]), np.int8)
                k.dequantize_gelu_quantize(up.product(q), s, up.scale, up.bias, down.smooth, q4, s)
                h = np.empty((rows, hidden), np.float32)
                smooth = self.layers[i + 1][0].smooth if i < last else self._ones
                k.dequantize_add_norm_quantize(down.product(q4), s, down.scale, down.bias, h1, *norm2, smooth, h,
                                               q, s, i < last)
            return call.pool(torch.from_numpy(h), self.pooling)
