"""ReSearch's reward (``re_search.py``): 0 for a bad format or no EOS, else F1 of the last ``\\boxed{}``
inside ``<answer>`` if F1 > 0, else 0.1."""


from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from evaluation.metrics import f1_score
from training.protocols import research as research_protocol
from training.rewards.common import Reward, RewardBreakdown, as_golds, warn_once


def research_answer(response: str) -> str | None:
    """ReSearch's prediction: the last boxed content inside the first ``<answer>...</answer>``."""
    return research_protocol.extract_answer(response)


def research_reward(
    response: str, golds: str | Iterable[str], eos_token: str | None = None, finished: bool = True
) -> RewardBreakdown:
    """ReSearch reward: 0 (bad format), 0 (no EOS), 0 (no boxed answer), F1 if F1 > 0, else 0.1.

    Args:
        response: text after ``<|im_start|>assistant\\n`` (instruct) or ``Assistant:`` (base).
        golds: gold answers.
        eos_token: when given, the response must end with it (the seed's "over length" check) and it is
            stripped; when ``None`` the caller says whether generation ended with EOS through ``finished``.
        finished: used only when ``eos_token`` is ``None``.
    """
    check = research_protocol.validate(response)
    if not check.ok:
        return RewardBreakdown(0.0, {"format": 0.0}, "bad format: " + "; ".join(check.reasons))
    if eos_token is not None:
        if not response.endswith(eos_token):
            return RewardBreakdown(0.0, {"format": 1.0}, "over length")
        response = response[: -len(eos_token)]
    elif not finished:
        return RewardBreakdown(0.0, {"format": 1.0}, "over length")
    answer = research_answer(response)
    if answer is None:
        return RewardBreakdown(0.0, {"format": 1.0}, "cannot extract a boxed answer")
    f1 = f1_score(answer, as_golds(golds))
    if f1 > 0:
        return RewardBreakdown(f1, {"format": 1.0, "f1": f1}, f"correct answer, f1 {f1:.3f}")
    return RewardBreakdown(0.1, {"format": 1.0, "f1": 0.0}, f"wrong answer but good format: {answer!r}")


# ------------------------------------------------------------------------------------------------ R1-Searcher


def _verl_finished(info: Mapping[str, Any], options: dict[str, Any]) -> dict[str, float]:
    """verl decodes without special tokens, so the text never shows EOS: our agent loop reports ``finished``."""
    if "eos_token" in options or "finished" in options:
        return {}
    finished = info.get("finished")
    if finished is None:
        warn_once("verl gave no extra_info['finished'] for the research reward (is the agent loop ours?): "
                  "responses count as finished, so the over-length rule cannot apply")
        return {}
    options["finished"] = bool(finished)
    return {"finished": float(bool(finished))}


def _trl_finished(i: int, kwargs: Mapping[str, Any], options: dict[str, Any], eos_token_id: int | None) -> None:
    """TRL decodes without special tokens: a completion ended with EOS when its ids end with ``eos_token_id``,
    else a ``finished`` column says so (without either it counts as finished)."""
    ids, finished = kwargs.get("completion_ids"), kwargs.get("finished")
    if eos_token_id is not None and ids is not None:
        options["finished"] = bool(ids[i]) and ids[i][-1] == eos_token_id
    elif finished is not None:
        options["finished"] = bool(finished[i])


RESEARCH = Reward(research_reward, verl_options=_verl_finished, trl_options=_trl_finished)
"""The ``research`` reward (``training.rewards.registry``)."""
