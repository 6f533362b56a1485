"""CPU bf16 query passes of a BERT sentence encoder without padding: the dense retriever's query encoder.

On this project's 2-core CPUs a query call of a BERT encoder (all-MiniLM-L6-v2, e5, bge) is ~80% linear layers, and
oneDNN already runs those near the core's bf16 peak (docs/results/engines/session49). What was left is what the
padded Hugging Face forward adds around them: padded tokens (one forward pass per length group), a GELU, two
residual adds, a pooler output nobody reads, and per-module Python for every pass. :class:`UnpaddedBert` runs a
call's real tokens as one ``[tokens, hidden]`` matrix through every linear layer (Q, K and V as one product; GELU and
the residual adds fused into the products, ``mkldnn._linear_pointwise``, weights packed once as in
:mod:`retrieval.packed_linear`) and pads only for attention, one ``scaled_dot_product_attention`` per length group.
Pooling (mean or CLS) runs in fp32. The vectors are as close to the fp32 model as the padded bf16 path's are, or
closer (tests/retrieval/test_unpadded_bert.py; the benchmark prints the agreement).

:func:`unpadded_bert` answers None for anything it does not cover, and the encoder then keeps the padded path.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: the token rows of a call are padded to a multiple of this, so oneDNN meets a bounded set of matrix shapes (a new
#: shape costs a primitive creation, 0.5-1 ms on this CPU, about a quarter of one product at 600 rows)
ROW_MULTIPLE = 16


def unpadded_bert(model: Any) -> UnpaddedBert | None:
    """An :class:`UnpaddedBert` for a sentence-transformers ``model`` (Transformer over a bf16 CPU ``BertModel``,
    mean or CLS pooling, optionally Normalize), or None when the model is anything else or this CPU cannot run
    packed bf16 linears (:func:`retrieval.packed_linear.packing_supported`)."""
    import torch

    from retrieval.packed_linear import packing_supported

    modules = list(model) if hasattr(model, "__iter__") else []
    names = [type(m).__name__ for m in modules]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return None
    bert = getattr(modules[0], "auto_model", None)
    if type(bert).__name__ != "BertModel" or type(bert).__module__ != "transformers.models.bert.modeling_bert":
        return None
    cfg = bert.config
    if (getattr(cfg, "position_embedding_type", "absolute") != "absolute" or cfg.hidden_act != "gelu"
            or getattr(cfg, "is_decoder", False) or cfg.hidden_size % cfg.num_attention_heads):
        return None
    weight = bert.embeddings.word_embeddings.weight
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return None
    pooling = modules[1].get_config_dict()
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
    if modes not in (["pooling_mode_mean_tokens"], ["pooling_mode_cls_token"]) or not pooling.get("include_prompt",
                                                                                                   True):
        return None
    if not packing_supported():
        return None
    return UnpaddedBert(bert, "mean" if modes == ["pooling_mode_mean_tokens"] else "cls")


class UnpaddedBert:
    """Inference-only BERT forward over a call's unpadded tokens (weights shared with, or packed from, ``bert``)."""

    def __init__(self, bert: Any, pooling: str) -> None:
        import torch

        def packed(linear: Any) -> tuple[Any, Any]:
            return torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().contiguous()), linear.bias.detach()

        def norm(layer_norm: Any) -> tuple[Any, Any, float]:
            return layer_norm.weight.detach(), layer_norm.bias.detach(), layer_norm.eps

        emb = bert.embeddings
        self.pooling = pooling
        self.word = emb.word_embeddings.weight.detach()
        self.position = emb.position_embeddings.weight.detach()
        self.token_type = emb.token_type_embeddings.weight.detach()
        self.embed_norm = norm(emb.LayerNorm)
        self.heads = bert.config.num_attention_heads
        self.hidden = bert.config.hidden_size
        self.layers = []
        for layer in bert.encoder.layer:
            attn = layer.attention
            qkv = torch.nn.Linear(self.hidden, 3 * self.hidden, dtype=self.word.dtype)
            with torch.no_grad():
                qkv.weight.copy_(torch.cat([attn.self.query.weight, attn.self.key.weight, attn.self.value.weight]))
                qkv.bias.copy_(torch.cat([attn.self.query.bias, attn.self.key.bias, attn.self.value.bias]))
            self.layers.append((packed(qkv), packed(attn.output.dense), norm(attn.output.LayerNorm),
                                packed(layer.intermediate.dense), packed(layer.output.dense),
                                norm(layer.output.LayerNorm)))

    def encode(self, features: dict[str, Any], lengths: list[int], groups: list[list[int]]) -> np.ndarray:
        """fp32 [n, hidden] pooled (not normalized) vectors of a right-padded tokenized call. ``lengths``: each
        text's token count; ``groups``: the texts' indexes cut into attention passes (each index once)."""
        import torch
        import torch.nn.functional as F

        linear = torch.ops.mkldnn._linear_pointwise
        n, hidden, heads = len(lengths), self.hidden, self.heads
        head_dim = hidden // heads
        order = torch.tensor([i for group in groups for i in group])  # the call's texts, group by group
        lens = torch.tensor(lengths)[order]
        width = int(lens.max())
        valid = torch.arange(width)[None, :] < lens[:, None]  # [n, width], rows in `order`
        total = int(lens.sum())
        rows = -(-total // ROW_MULTIPLE) * ROW_MULTIPLE
        extra = torch.zeros(rows - total, dtype=torch.long)  # rows up to a multiple of ROW_MULTIPLE (token id 0)
        ids = torch.cat([features["input_ids"][order, :width][valid], extra])
        types = features.get("token_type_ids")
        types = torch.cat([types[order, :width][valid], extra]) if types is not None else torch.zeros_like(ids)
        positions = torch.cat([torch.arange(width).expand(n, width)[valid], extra])
        with torch.inference_mode():
            h = self.word[ids] + self.position[positions] + self.token_type[types]
            h = F.layer_norm(h, (hidden,), *self.embed_norm)
            # per attention pass: each text's token rows padded to the pass's longest text (pad slots read row 0,
            # masked out as keys, dropped as outputs)
            starts = torch.cumsum(lens, 0) - lens
            gather, keep, passes, first = [], [], [], 0
            for group in groups:
                size = len(group)
                glens, gstart = lens[first:first + size], starts[first:first + size]
                gwidth = int(glens.max())
                cols = torch.arange(gwidth)
                inside = cols[None, :] < glens[:, None]
                gather.append(torch.where(inside, gstart[:, None] + cols[None, :], 0).reshape(-1))
                keep.append(inside.reshape(-1))
                mask = None if bool(inside.all()) else torch.zeros(size, 1, 1, gwidth, dtype=h.dtype).masked_fill(
                    ~inside[:, None, None, :], float("-inf"))
                passes.append((size, gwidth, mask))
                first += size
            gather_rows = torch.cat(gather)
            # the real tokens' rows back in call order, then the extra rows (any row will do: no text reads them)
            keep_rows = torch.cat([torch.cat(keep).nonzero().squeeze(1), extra])
            split = [size * gwidth for size, gwidth, _ in passes]
            for qkv_w, out_w, norm1, up_w, down_w, norm2 in self.layers:
                qkv = linear(h, qkv_w[0], qkv_w[1], "none", [], "")
                contexts = []
                for part, (size, gwidth, mask) in zip(qkv[gather_rows].split(split), passes, strict=True):
                    q, k, v = part.view(size, gwidth, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
                    ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    contexts.append(ctx.transpose(1, 2).reshape(size * gwidth, hidden))
                context = torch.cat(contexts)[keep_rows]
                h = F.layer_norm(torch.ops.mkldnn._linear_pointwise.binary(context, h, out_w[0], out_w[1], "add"),
                                 (hidden,), *norm1)
                up = linear(h, up_w[0], up_w[1], "gelu", [], "none")
                h = F.layer_norm(torch.ops.mkldnn._linear_pointwise.binary(up, h, down_w[0], down_w[1], "add"),
                                 (hidden,), *norm2)
            h = h[:total].float()
            if self.pooling == "cls":
                pooled = h[starts]
            else:
                text = torch.repeat_interleave(torch.arange(n), lens)
                pooled = torch.zeros(n, hidden).index_add_(0, text, h) / lens[:, None].float()
            out = torch.empty_like(pooled)
            out[order] = pooled
        return out.numpy()
