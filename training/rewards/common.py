"""What every seed's reward shares: the scored breakdown, gold-answer normalisation, and :class:`Reward` (a reward
function with its trainer-adapter specifics), which each reward module exports and ``training.rewards.registry``
names."""


from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RewardBreakdown:
    """A scalar reward with its parts (for logging) and a short human-readable reason."""

    score: float
    parts: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    def as_dict(self) -> dict[str, float | str]:
        """``{"score": ..., **parts, "reason": ...}`` for logs (the verl adapter returns the floats only)."""
        return {"score": float(self.score), **self.parts, "reason": self.reason}


def as_golds(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [str(g) for g in golds]


# --------------------------------------------------------------------------------------------------- ReSearch


VerlOptions = Callable[[Mapping[str, Any], dict[str, Any]], dict[str, float]]
TrlOptions = Callable[[int, Mapping[str, Any], dict[str, Any], "int | None"], None]


@dataclass(frozen=True)
class Reward:
    """One reward as the trainer adapters (``training.rewards.adapters``) see it.

    ``score(response, golds, **options)`` is the plain function. The two hooks fill options the trainer knows and
    the text cannot show, so the adapters never branch on a reward's name:

    - ``verl_options(extra_info, options) -> extra``: reads verl's ``extra_info`` of a sample, sets options in place
      (only those not already set) and returns extra floats to report next to the score;
    - ``trl_options(i, kwargs, options, eos_token_id)``: reads TRL's reward keyword columns for completion ``i``
      (``completion_ids``, dataset columns) and sets options in place.

    Example (a module ``training/rewards/mine.py`` plus the line ``"mine": "training.rewards.mine:MINE"`` in
    ``training.rewards.registry.REWARDS``)::

        def mine_reward(response, golds):
            return RewardBreakdown(float(any(g in response for g in golds)))

        MINE = Reward(mine_reward)
    """

    score: Callable[..., RewardBreakdown]
    verl_options: VerlOptions | None = None
    trl_options: TrlOptions | None = None


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time it is seen in this process (reward calls are per sample)."""
    if message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger("training.rewards").warning(message)
