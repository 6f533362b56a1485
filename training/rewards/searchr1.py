"""Search-R1's rewards: ``qa_em.py`` (exact match) and ``qa_em_format.py`` (structure/format shaping)."""


from __future__ import annotations

import re
from collections.abc import Iterable

from evaluation.metrics import exact_match, normalize_answer
from training.protocols import searchr1 as searchr1_protocol
from training.protocols.base import FormatCheck
from training.rewards.common import Reward, RewardBreakdown, as_golds


def searchr1_answer(text: str, min_answer_matches: int = 1) -> str | None:
    """Search-R1's prediction: the last ``<answer>...</answer>``, or ``None`` with fewer than the required matches.

    The seed scores prompt + response and requires **2** matches because its prompt shows one example
    ``<answer> Beijing </answer>``. Scoring the response alone, 1 is the same rule; pass 2 for full sequences.
    """
    matches = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    return matches[-1].strip() if len(matches) >= min_answer_matches else None


def searchr1_em_reward(
    response: str, golds: str | Iterable[str], min_answer_matches: int = 1, format_score: float = 0.0
) -> RewardBreakdown:
    """Search-R1 ``qa_em.compute_score_em``: 1 if the extracted answer exactly matches a gold, else
    ``format_score`` (0), and 0 when no answer is extracted."""
    answer = searchr1_answer(response, min_answer_matches)
    if answer is None:
        return RewardBreakdown(0.0, {"em": 0.0}, "no answer extracted")
    em = exact_match(answer, as_golds(golds))
    return RewardBreakdown(1.0 if em else format_score, {"em": em}, f"answer {answer!r}")


def searchr1_retrieval_hit(text: str, golds: str | Iterable[str]) -> bool:
    """True if a normalized gold is a substring of a normalized ``<information>`` block (Search-R1)."""
    blocks = [normalize_answer(b.strip()) for b in re.findall(r"<information>(.*?)</information>", text, re.DOTALL)]
    return any(normalize_answer(g) in b for b in blocks for g in as_golds(golds))


def searchr1_sequence(text: str, require_assistant_marker: bool = False) -> FormatCheck:
    """Search-R1's ``is_valid_sequence``: the protocol validator applied after ``<|im_start|>assistant`` when that
    marker is present (full sequences, as the seed scores them), else to the whole text (a response)."""
    marker = re.search(r"<\|im_start\|>assistant\s*", text)
    if marker:
        return searchr1_protocol.validate(text[marker.end() :])
    if require_assistant_marker:
        return FormatCheck(ok=False, reasons=["Missing assistant marker"])
    return searchr1_protocol.validate(text)


def searchr1_format_reward(
    response: str,
    golds: str | Iterable[str],
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    retrieval_score: float = 0.0,
    min_answer_matches: int = 1,
) -> RewardBreakdown:
    """Search-R1 ``qa_em_format.compute_score_em`` with the v0.3 scores (0.2 / 0.1 / retrieval 0).

    Correct answer: 1.0 (valid sequence) or 1 - structure_format_score (invalid). Otherwise, valid sequence:
    structure_format_score (+ retrieval_score if a gold is in an ``<information>`` block); invalid: 0 without
    an answer, final_format_score with a wrong one.
    """
    check = searchr1_sequence(response)
    hit = check.ok and searchr1_retrieval_hit(response, golds)
    answer = searchr1_answer(response, min_answer_matches)
    em = exact_match(answer, as_golds(golds)) if answer is not None else 0.0
    shaped = structure_format_score + (retrieval_score if hit else 0.0)
    if em:
        score = 1.0 if check.ok else 1.0 - structure_format_score
    elif check.ok:
        score = shaped
    else:
        score = 0.0 if answer is None else final_format_score
    parts = {"em": em, "valid_format": float(check.ok), "retrieval_hit": float(hit)}
    return RewardBreakdown(score, parts, "; ".join(check.reasons) or "valid sequence")


# ------------------------------------------------------------------------------------------------ SmartSearch


EM = Reward(searchr1_em_reward)
"""``searchr1_em``: exact match of the last answer (``training.rewards.registry``)."""
FORMAT = Reward(searchr1_format_reward)
"""``searchr1_format``: exact match with the format bonus/penalty."""
