"""CPU bf16 query passes of a BERT sentence encoder without padding: the dense retriever's query encoder.

On this project's 2-core CPUs a query call of a BERT encoder (all-MiniLM-L6-v2, e5, bge) is ~80% linear layers, and
oneDNN already runs those near the core's bf16 peak (docs/results/engines/session49). What was left is what the
padded Hugging Face forward adds around them: padded tokens (one forward pass per length group), a GELU, two
residual adds, a pooler output nobody reads, and per-module Python for every pass. :class:`UnpaddedBert` runs a
call's real tokens as one ``[tokens, hidden]`` matrix through every linear layer (Q, K and V as one product; GELU and
the residual adds fused into the products, ``mkldnn._linear_pointwise``, weights packed once as in
:mod:`retrieval.packed_linear`) and never pads: attention runs one ``scaled_dot_product_attention`` per token length
over a view of those rows (no gather, no mask; 3.5% less CPU than padded length groups).
Pooling (mean or CLS) runs in fp32. The vectors are as close to the fp32 model as the padded bf16 path's are, or
closer (tests/retrieval/test_unpadded_bert.py; the benchmark prints the agreement).

:func:`unpadded_bert` answers None for anything it does not cover, and the encoder then keeps the padded path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: the token rows of a call are padded to a multiple of this, so oneDNN meets a bounded set of matrix shapes (a new
#: shape costs a primitive creation, 0.5-1 ms on this CPU, about a quarter of one product at 600 rows)
ROW_MULTIPLE = 16


def bert_parts(model: Any) -> tuple[Any, str, bool] | None:
    """(BertModel, 'mean' | 'cls', lower_case) of a sentence-transformers ``model`` that is a Transformer over a
    CPU ``BertModel`` (absolute positions, GELU, encoder only) with mean or CLS pooling, optionally Normalize; None
    for anything else."""
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
    if bert.embeddings.word_embeddings.weight.device.type != "cpu":
        return None
    pooling = modules[1].get_config_dict()
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
    if modes not in (["pooling_mode_mean_tokens"], ["pooling_mode_cls_token"]) or not pooling.get("include_prompt",
                                                                                                   True):
        return None
    return bert, "mean" if modes == ["pooling_mode_mean_tokens"] else "cls", bool(getattr(modules[0],
                                                                                           "do_lower_case", False))


def unpadded_bert(model: Any) -> UnpaddedBert | None:
    """An :class:`UnpaddedBert` for a sentence-transformers ``model`` (:func:`bert_parts`, weights in bf16), or None
    when the model is anything else or this CPU cannot run packed bf16 linears
    (:func:`retrieval.packed_linear.packing_supported`)."""
    import torch

    from retrieval.packed_linear import packing_supported

    parts = bert_parts(model)
    if parts is None or parts[0].embeddings.word_embeddings.weight.dtype != torch.bfloat16:
        return None
    if not packing_supported():
        return None
    return UnpaddedBert(*parts)


class CallLayout:
    """How a call's texts lie in one ``[rows, hidden]`` token matrix: sorted by length, texts of one length
    adjacent (one attention pass each), rows padded up to a multiple of :data:`ROW_MULTIPLE` with token id 0."""

    def __init__(self, token_ids: list[list[int]]) -> None:
        import torch

        n = len(token_ids)
        self.order = sorted(range(n), key=lambda i: len(token_ids[i]))
        lengths = [len(token_ids[i]) for i in self.order]
        #: (texts, length) of each attention pass
        self.passes = [(lengths.count(length), length) for length in sorted(set(lengths))]
        self.total = sum(lengths)
        self.rows = -(-self.total // ROW_MULTIPLE) * ROW_MULTIPLE
        pad = self.rows - self.total
        self.ids = torch.tensor([t for i in self.order for t in token_ids[i]] + [0] * pad)
        self.positions = torch.tensor([p for length in lengths for p in range(length)] + [0] * pad)
        self.lens = torch.tensor(lengths)
        #: row counts of the passes, then of the padding rows
        self.split = [size * length for size, length in self.passes] + [pad]

    def attention(self, qkv: Any, rest: Any, heads: int) -> Any:
        """[rows, hidden] attention contexts from the fused ``qkv`` rows ([rows, 3 * hidden]): one
        ``scaled_dot_product_attention`` per length over a view of its rows; the padding rows take ``rest``'s."""
        import torch
        import torch.nn.functional as F

        hidden = qkv.shape[1] // 3
        contexts = []
        for part, (size, length) in zip(qkv.split(self.split), self.passes, strict=False):
            q, k, v = part.view(size, length, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            ctx = F.scaled_dot_product_attention(q, k, v)
            contexts.append(ctx.transpose(1, 2).reshape(size * length, hidden))
        contexts.append(rest[self.total:])  # the extra rows: read by no text
        return torch.cat(contexts)

    def pool(self, h: Any, pooling: str) -> np.ndarray:
        """fp32 [texts, hidden] pooled vectors (mean or CLS) of the token rows ``h``, in the call's order."""
        import torch

        h = h[:self.total].float()
        n = len(self.order)
        if pooling == "cls":
            pooled = h[torch.cumsum(self.lens, 0) - self.lens]
        else:
            text = torch.repeat_interleave(torch.arange(n), self.lens)
            pooled = torch.zeros(n, h.shape[1]).index_add_(0, text, h) / self.lens[:, None].float()
        out = torch.empty_like(pooled)
        out[torch.tensor(self.order)] = pooled
        return out.numpy()


class UnpaddedEncoder:
    """What the unpadded BERT passes share: tokenizing a call as sentence-transformers does, then ``encode``."""

    lower_case: bool = False

    def encode_texts(self, tokenizer: Any, texts: list[str], max_length: int) -> np.ndarray:
        """fp32 [n, hidden] pooled (not normalized) vectors of ``texts`` tokenized by ``tokenizer`` (a Hugging Face
        tokenizer) as sentence-transformers does (stripped, lower-cased if its model does, truncated to ``max_length``),
        without padding them."""
        texts = [t.strip().lower() if self.lower_case else t.strip() for t in texts]
        ids = tokenizer(texts, padding=False, truncation=True, max_length=max_length,
                        return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        return self.encode(ids)

    def encode(self, token_ids: list[list[int]]) -> np.ndarray:
        """fp32 [n, hidden] pooled (not normalized) vectors of a call's texts given as token ids."""
        raise NotImplementedError


class UnpaddedBert(UnpaddedEncoder):
    """Inference-only bf16 BERT forward over a call's unpadded tokens (weights packed from ``bert``)."""

    def __init__(self, bert: Any, pooling: str, lower_case: bool = False) -> None:
        import torch

        def packed(linear: Any) -> tuple[Any, Any]:
            return torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().contiguous()), linear.bias.detach()

        def norm(layer_norm: Any) -> tuple[Any, Any, float]:
            return layer_norm.weight.detach(), layer_norm.bias.detach(), layer_norm.eps

        emb = bert.embeddings
        self.pooling, self.lower_case = pooling, lower_case
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

    def encode(self, token_ids: list[list[int]]) -> np.ndarray:
        """fp32 [n, hidden] pooled (not normalized) vectors of a call's texts given as token ids (one sentence
        each: token type 0)."""
        import torch
        import torch.nn.functional as F

        linear = torch.ops.mkldnn._linear_pointwise
        add_linear = torch.ops.mkldnn._linear_pointwise.binary
        hidden = self.hidden
        call = CallLayout(token_ids)
        with torch.inference_mode():
            h = self.word[call.ids] + self.position[call.positions] + self.token_type[0]
            h = F.layer_norm(h, (hidden,), *self.embed_norm)
            for qkv_w, out_w, norm1, up_w, down_w, norm2 in self.layers:
                ctx = call.attention(linear(h, qkv_w[0], qkv_w[1], "none", [], ""), h, self.heads)
                h = F.layer_norm(add_linear(ctx, h, out_w[0], out_w[1], "add"), (hidden,), *norm1)
                up = linear(h, up_w[0], up_w[1], "gelu", [], "none")
                h = F.layer_norm(add_linear(up, h, down_w[0], down_w[1], "add"), (hidden,), *norm2)
            return call.pool(h, self.pooling)
