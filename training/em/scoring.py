"""E-step scoring: teacher-forced log-likelihood of a trajectory's supervised tokens with the gold answer in place.

For each chat trajectory (``messages`` alternating user/assistant after an optional system turn) the last assistant
message, the model's predicted answer, is replaced by the gold answer. The current model then scores, with no
gradients, the supervised tokens: ``tokens="answer"`` (the default) = the final assistant turn only
(``log p(y* | x, z)``); ``tokens="trajectory"`` = every assistant turn (``log p(z, y* | x)``, what ExSearch's released
``_entropy.py`` scores, as a per-token mean). User turns, which hold the retrieved documents, are never scored.

Why answer-only is the default: the trajectories are sampled from the model itself, so the self-normalised importance
weight of ``z_i`` for the posterior ``p(z | x, y*)`` is ``p(y* | x, z_i)``; the ``p(z_i | x)`` factor cancels with the
proposal. Scoring the whole trajectory multiplies it back in and collapses the weights onto the shortest, most likely
trajectory whatever its answer. ``trajectory`` stays as a named option for ablations.

Token spans come from the tokenizer's own chat template: the assistant turn i covers the tokens between
``template(messages[:i], add_generation_prompt=True)`` and ``template(messages[:i+1])``, so they match what an SFT
engine supervises (content plus the end-of-turn marker). The template must be prefix-stable (ChatML is); otherwise
``ScoringError`` is raised. Batches are packed under a token budget; sequences longer than ``max_length`` get
``sum_logprob = NaN`` (the selection step drops them and counts them). torch/transformers are imported lazily.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra import progress
from infra.errors import DataError
from training.em.config import ScoringConfig

log = logging.getLogger(__name__)


class ScoringInput(BaseModel):
    """One trajectory to score."""

    model_config = ConfigDict(frozen=True)

    trajectory_id: str = Field(description="Unique trajectory id.")
    question_id: str = Field(description="Question id (selection groups by it).")
    messages: list[dict[str, str]] = Field(description="Chat turns; the last one is the assistant's answer.")
    gold_answer: str = Field(description="Gold answer substituted for the final assistant message.")


class ScoreResult(BaseModel):
    """Teacher-forced score of one trajectory."""

    trajectory_id: str = Field(description="Trajectory id.")
    question_id: str = Field(description="Question id.")
    sum_logprob: float = Field(description="Sum of log p over supervised tokens (NaN if not scored).")
    n_tokens: int = Field(description="Supervised tokens scored.")


def with_gold_answer(messages: Sequence[dict[str, str]], gold: str) -> list[dict[str, str]]:
    """Copy of ``messages`` whose final assistant message is replaced by ``gold``.

    Raises:
        DataError: when the conversation does not end with an assistant turn.
    """
    if not messages or messages[-1].get("role") != "assistant":
        raise DataError("a scored trajectory must end with the assistant's answer turn; got "
                        f"{messages[-1].get('role') if messages else 'no turns'!r} - drop unfinished trajectories")
    return [dict(m) for m in messages[:-1]] + [{"role": "assistant", "content": gold}]


def supervised_spans(tokenizer: Any, messages: Sequence[dict[str, str]], tokens: str) -> tuple[list[int], list[int]]:
    """Token ids of the whole chat and the label mask (1 = scored) from the chat template.

    Returns:
        (input_ids ``[T]``, mask ``[T]``).
    """
    def ids(msgs: Sequence[dict[str, str]], gen: bool) -> list[int]:
        return list(tokenizer.apply_chat_template(list(msgs), tokenize=True, add_generation_prompt=gen))

    full = ids(messages, False)
    mask = [0] * len(full)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if tokens == "answer":
        turns = turns[-1:]
    for i in turns:
        start, end = len(ids(messages[:i], True)), len(ids(messages[: i + 1], False))
        if full[:end] != ids(messages[: i + 1], False) or start > end:
            raise DataError("the tokenizer's chat template is not prefix-stable; scoring spans would be wrong. "
                            "Use a ChatML-style template or score with tokens='answer' on a single-turn layout")
        mask[start:end] = [1] * (end - start)
    return full, mask


def _batches(lengths: list[int], budget: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and lengths[i] * (len(cur) + 1) > budget:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def _forward_logprobs(model: Any, seqs: list[list[int]], masks: list[list[int]], pad_id: int) -> list[float]:
    import torch

    device = next(model.parameters()).device
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    lab_mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, (s, m) in enumerate(zip(seqs, masks, strict=True)):
        ids[row, : len(s)] = torch.tensor(s)
        att[row, : len(s)] = 1
        lab_mask[row, : len(m)] = torch.tensor(m, dtype=torch.bool)
    ids, att, lab_mask = ids.to(device), att.to(device), lab_mask.to(device)
    # logits only where a scored token is predicted: hidden position j predicts token j + 1. With answer-only scoring
    # that is a few positions instead of B x T x vocab floats (11.6 GB at 8k tokens x 49k vocab, enough to be
    # OOM-killed beside another run); models whose forward takes ``logits_to_keep`` (transformers' causal LMs)
    # apply their own head and post-processing to just those positions.
    keep = torch.nonzero(lab_mask[:, 1:].any(dim=0)).squeeze(1)
    if keep.numel() == 0:
        return [0.0] * len(seqs)
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        logits = model(input_ids=ids, attention_mask=att, logits_to_keep=keep).logits.float()
    else:
        logits = model(input_ids=ids, attention_mask=att).logits[:, keep, :].float()
    target, scored = ids[:, keep + 1], lab_mask[:, keep + 1]
    token_lp = -torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="none"
    ).view(target.shape)
    return (token_lp * scored).sum(dim=1).tolist()


def score_trajectories(
    items: Sequence[ScoringInput], model_path: str, cfg: ScoringConfig, model: Any = None, tokenizer: Any = None
) -> list[ScoreResult]:
    """Score trajectories with the model at ``model_path`` (or a given model/tokenizer), no gradients.

    Args:
        items: trajectories with their gold answers.
        model_path: HF model folder (loaded when ``model`` is None).
        cfg: scoring config.
        model: optional already-loaded causal LM.
        tokenizer: optional tokenizer with a chat template.

    Returns:
        One ScoreResult per input, in input order.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = tokenizer or AutoTokenizer.from_pretrained(model_path)
    if model is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=getattr(torch, cfg.dtype)).to(device)
    model.eval()
    encoded = [supervised_spans(tok, with_gold_answer(it.messages, it.gold_answer), cfg.tokens) for it in items]
    sums = [math.nan] * len(items)
    ok = [i for i, (ids, _) in enumerate(encoded) if len(ids) <= cfg.max_length]
    if len(ok) < len(items):
        log.warning("%d trajectories exceed max_length=%d and are not scored", len(items) - len(ok), cfg.max_length)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    with torch.inference_mode(), progress.track("scoring", total=len(ok), unit="trajectory") as bar:
        for batch in _batches([len(encoded[i][0]) for i in ok], cfg.batch_tokens):
            idx = [ok[j] for j in batch]
            lps = _forward_logprobs(model, [encoded[i][0] for i in idx], [encoded[i][1] for i in idx], pad_id)
            for i, lp in zip(idx, lps, strict=True):
                sums[i] = lp
            bar.advance(len(idx))
    return [
        ScoreResult(trajectory_id=it.trajectory_id, question_id=it.question_id, sum_logprob=s, n_tokens=sum(enc[1]))
        for it, s, enc in zip(items, sums, encoded, strict=True)
    ]
