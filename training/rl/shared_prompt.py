"""The GRPO loss's forward pass with each distinct prompt computed once (``TRLSearchConfig.share_prompt``).

A GRPO step trains ``num_generations`` completions of every prompt. TRL 0.24 forwards each row as prompt +
completion, so a micro-batch of four rows of one prompt runs that prompt through the model four times. Here the rows
of a micro-batch are grouped by their (unpadded) prompt; each prompt is forwarded once, with gradients, keeping its
key/value cache, and the group's completions are forwarded on that cache expanded to the group's rows (a view: the
backward pass sums the completions' gradients into the one prompt forward). The log-probability of a completion's
first token comes from the prompt's last logit, the others from the completion's own logits, exactly as in TRL's
concatenated forward. With rotary position embeddings the prompt's left padding in TRL's forward only shifts every
position by the same amount, which attention does not see, so the two paths agree up to float order (tested in fp32
against TRL's forward, values and gradients).

:func:`order_by_prompt` fills TRL's micro-batches one prompt's rows at a time (after TRL's shuffle, so the random
stream is untouched): under the loss types whose normalisation does not depend on how a step's rows are cut into
micro-batches (``grpo``: a per-row mean over equal micro-batches, ``dr_grpo``, ``dapo``) the step's gradient is the
same, and every micro-batch then shares one prompt forward. Under ``bnpo`` (a token mean per micro-batch) the order is
left as TRL drew it.
"""

from __future__ import annotations

from typing import Any

#: loss types whose step gradient does not depend on which rows share a micro-batch (equal micro-batch sizes)
ORDER_FREE_LOSSES = ("grpo", "dr_grpo", "dapo")


def prompt_groups(prompt_ids: Any, prompt_mask: Any) -> list[tuple[list[int], Any]]:
    """Rows grouped by their unpadded prompt tokens, in order of first appearance: (row indices, prompt ids (L,))."""
    groups: dict[tuple[int, ...], list[int]] = {}
    tokens: dict[tuple[int, ...], Any] = {}
    for r in range(prompt_ids.size(0)):
        ids = prompt_ids[r][prompt_mask[r].bool()]
        key = tuple(ids.tolist())
        groups.setdefault(key, []).append(r)
        tokens.setdefault(key, ids)
    return [(rows, tokens[key]) for key, rows in groups.items()]


def _expanded_cache(cache: Any, rows: int) -> Any:
    """A new DynamicCache holding ``cache``'s keys and values expanded (as views) to ``rows`` rows."""
    from transformers import DynamicCache

    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        keys, values = layer.keys, layer.values
        out.update(keys.expand(rows, *keys.shape[1:]), values.expand(rows, *values.shape[1:]), i)
    return out


def shared_prompt_logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, temperature: float,
                        compute_entropy: bool = False, batch_size: int | None = None,
                        groups: list[tuple[list[int], Any]] | None = None) -> tuple[Any, Any]:
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` tokens of each row, as TRL 0.24's
    ``_get_per_token_logps_and_entropies`` computes them, with each distinct prompt forwarded once.

    ``input_ids`` / ``attention_mask`` are TRL's (B, P + C): a left-padded prompt then a right-padded completion of
    width C = ``logits_to_keep``. ``batch_size`` bounds the completion rows per forward (TRL's chunking)."""
    import torch
    from transformers import DynamicCache
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    n, width = input_ids.shape
    prompt_width = width - logits_to_keep
    completion_ids = input_ids[:, prompt_width:]
    completion_attention = attention_mask[:, prompt_width:]
    chunk = batch_size or n
    logps: list[Any] = [None] * n
    entropies: list[Any] = [None] * n
    if groups is None:
        groups = prompt_groups(input_ids[:, :prompt_width], attention_mask[:, :prompt_width])
    for rows, prompt in groups:
        if prompt.numel() == 0:
            raise ValueError("share_prompt needs a non-empty prompt in every row; set share_prompt: false")
        out = model(input_ids=prompt[None], attention_mask=torch.ones_like(prompt)[None], use_cache=True,
                    logits_to_keep=1)
        cache, last = out.past_key_values, out.logits[:, -1:, :]
        if not isinstance(cache, DynamicCache):
            raise TypeError(f"share_prompt needs a DynamicCache from the model, got {type(cache).__name__}; set "
                            "share_prompt: false for this model")
        for start in range(0, len(rows), chunk):
            part = rows[start:start + chunk]
            ids = completion_ids[part]
            mask = torch.cat([torch.ones(len(part), prompt.numel(), dtype=completion_attention.dtype,
                                         device=ids.device), completion_attention[part]], dim=1)
            logits = model(input_ids=ids, attention_mask=mask, past_key_values=_expanded_cache(cache, len(part)),
                           use_cache=True).logits
            logits = torch.cat([last.expand(len(part), 1, last.size(-1)), logits[:, :-1, :]], dim=1)
            logits = logits / temperature
            part_logps = selective_log_softmax(logits, ids)
            if compute_entropy:
                with torch.no_grad():
                    part_entropies = entropy_from_logits(logits)
            for j, r in enumerate(part):
                logps[r] = part_logps[j]
                if compute_entropy:
                    entropies[r] = part_entropies[j]
    return torch.stack(logps), (torch.stack(entropies) if compute_entropy else None)


def order_by_prompt(batch: dict[str, Any], loss_type: str) -> dict[str, Any]:
    """``batch`` (TRL's step dict, rows first) with one prompt's rows consecutive, in order of first appearance and
    keeping their order otherwise, so the micro-batches cut from it share prompts; unchanged under loss types whose
    gradient depends on the cut (``bnpo``)."""
    import torch

    if loss_type not in ORDER_FREE_LOSSES:
        return batch
    prompt_ids, prompt_mask = batch["prompt_ids"], batch["prompt_mask"]
    n = prompt_ids.size(0)
    order = [r for rows, _ in prompt_groups(prompt_ids, prompt_mask) for r in rows]
    if order == list(range(n)):
        return batch
    index = torch.tensor(order, device=prompt_ids.device)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if torch.is_tensor(value) and value.dim() > 0 and value.size(0) == n:
            out[key] = value[index]
        elif isinstance(value, list) and len(value) == n:
            out[key] = [value[i] for i in order]
        else:
            out[key] = value
    return out
