"""R1-Searcher's two reward servers: stage 1 (format + retrieval) and stage 2 (format + answer F1)."""


from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Literal

from evaluation.metrics import f1_score, token_cover_em
from infra.errors import ConfigError
from training.protocols import r1searcher as r1_protocol
from training.rewards.common import Reward, RewardBreakdown, as_golds


def r1searcher_answer(response: str) -> str:
    """R1-Searcher's prediction: text between the last ``<answer>`` and the next ``</answer>``, stripped."""
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


def r1searcher_solution(response: str, eos_token: str | None = None) -> str:
    """The text R1-Searcher's reward server scores: EOS runs stripped from both ends, one EOS appended, stripped.

    The appended EOS keeps trailing newlines (e.g. after ``<|end_of_documents|>``) in place and ends up in the
    prediction when the last ``<answer>`` is unclosed. Without ``eos_token`` only leading whitespace is removed.
    """
    if not eos_token:
        return response.lstrip()
    while response.startswith(eos_token):
        response = response[len(eos_token) :]
    while response.endswith(eos_token):
        response = response[: -len(eos_token)]
    return (response + eos_token).strip()


def r1searcher_stage1_reward(
    response: str, golds: str | Iterable[str], eos_token: str | None = None
) -> RewardBreakdown:
    """R1-Searcher stage 1 (``reward_server_llama_stage1.py``): answer ±1 + retrieve 0.5 + format 0.5.

    - answer: +1 if both answer tags are present and CEM (R1-Searcher normalization) holds, else -1;
    - retrieve: +0.5 if the seven query/document tag counts are equal and >= 1;
    - format: +0.5 if there is no ``<think>`` (the prompt opened it) and exactly one ``</think>``, ``<answer>``
      and ``</answer>``.

    Args:
        response: the text generated after the prompt's trailing ``<think>``.
        golds: gold answers (the seed has one; CEM is maximised over several).
        eos_token: the EOS text the seed appends (Qwen base ``<|endoftext|>``, Llama-3.1 ``<|eot_id|>``); see
            :func:`r1searcher_solution`.
    """
    sol = r1searcher_solution(response, eos_token)
    has_tags = "<answer>" in sol and "</answer>" in sol
    answer = 1.0 if has_tags and token_cover_em(r1searcher_answer(sol), as_golds(golds)) else -1.0
    retrieve = 0.5 if r1_protocol.stage1_retrieve_ok(sol) else 0.0
    structure = 0.5 if r1_protocol.stage1_format_ok(sol) else 0.0
    parts = {"answer": answer, "retrieve": retrieve, "format": structure}
    return RewardBreakdown(answer + retrieve + structure, parts, f"cem {'hit' if answer > 0 else 'miss'}")


def r1searcher_stage2_reward(
    response: str, golds: str | Iterable[str], style: Literal["qwen", "llama"] = "qwen", eos_token: str | None = None
) -> RewardBreakdown:
    """R1-Searcher stage 2: answer F1 (0 without answer tags) minus 2 (Qwen) or 1 (Llama) on any violation.

    Qwen checks (``reward_server_qwen_zero.py``) and Llama checks (``reward_server_llama_stage2.py``) are listed
    in :func:`training.protocols.r1searcher.format_violations`; ``eos_token`` as in
    :func:`r1searcher_stage1_reward`.
    """
    if style not in ("qwen", "llama"):
        raise ConfigError(f"R1-Searcher style must be 'qwen' or 'llama', got {style!r}")
    sol = r1searcher_solution(response, eos_token)
    has_tags = "<answer>" in sol and "</answer>" in sol
    f1 = f1_score(r1searcher_answer(sol), as_golds(golds), "r1searcher") if has_tags else 0.0
    violations = r1_protocol.format_violations(sol, style)
    penalty = (2.0 if style == "qwen" else 1.0) if violations else 0.0
    reason = "; ".join(violations) if violations else "format ok"
    return RewardBreakdown(f1 - penalty, {"f1": f1, "penalty": -penalty}, reason)


# -------------------------------------------------------------------------------------------------- Search-R1


STAGE1 = Reward(r1searcher_stage1_reward)
"""``r1searcher_stage1``: format + retrieval (``training.rewards.registry``)."""
STAGE2 = Reward(partial(r1searcher_stage2_reward, style="qwen"))
"""``r1searcher_stage2``: format + answer F1, the Qwen server's format rule."""
STAGE2_LLAMA = Reward(partial(r1searcher_stage2_reward, style="llama"))
"""``r1searcher_stage2_llama``: the same with the Llama server's format rule."""
