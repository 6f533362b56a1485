"""Trainer adapters for the seed rewards: verl's ``compute_score`` and TRL's ``reward_funcs``.

verl: point ``custom_reward_function.path`` at this file and ``.name`` at ``compute_score`` (reward chosen by
``extra_info["reward"]`` or the ``SEARCHLOOP_REWARD`` environment variable) or at a fixed entry point such as
``compute_score_research``. ReSearch's over-length rule (no EOS -> 0) reads ``extra_info["finished"]``, which our
verl agent loop reports (verl decodes responses without special tokens, so the text cannot show EOS). Options
travel in ``extra_info["reward_options"]`` (e.g. ``{"eos_token": ...}`` for ReSearch's EOS check, ``{"prefixed":
True}`` for SmartSearch when the text already starts with the prompt's ``<think>``, ``{"response_prefix": ...}`` to
prepend text before any reward). SmartSearch's process reward reads the judge's per-round verdicts from
``extra_info["round_useful"]`` (1/0/None per round; our agent loop judges when its YAML entry has ``smartsearch``
settings) and ``extra_info["max_redundancy"]``: a round is bad when the judge said 0 or more than ``max_redundancy``
documents repeat. Without verdicts the redundancy rule alone counts (logged once).

TRL: ``GRPOTrainer(reward_funcs=[trl_reward_func("research")], ...)``; golds come from a dataset column.

What a reward needs from a trainer (EOS, judge verdicts, the question) is the reward module's own
(:class:`training.rewards.common.Reward` hooks): nothing here branches on a reward's name.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from infra.errors import ConfigError, DataError
from infra.lazy import pick
from training.rewards.common import Reward, RewardBreakdown
from training.rewards.registry import REWARDS, RewardName

__all__ = ["REWARDS", "RewardName", "check_reward_options", "compute_score", "reward_of", "score_response",
           "seed_reward_fn", "trl_reward_func"]


def reward_of(name: str) -> Reward:
    """The :class:`Reward` named ``name`` in :data:`~training.rewards.registry.REWARDS` (imported now).

    Raises:
        ConfigError: for an unknown name (listing the valid ones).
    """
    return pick(REWARDS, name, "reward")


def score_response(name: str, response: str, golds: Sequence[str], **options: Any) -> RewardBreakdown:
    """Score one response with the reward called ``name`` (a key of :data:`REWARDS`).

    Args:
        name: reward name.
        response: generated text.
        golds: gold answers.
        **options: keyword options of that reward; ``response_prefix`` is prepended to the response first.

    Raises:
        ConfigError: for an unknown name or option.
    """
    fn = reward_of(name).score
    prefix = options.pop("response_prefix", "")
    try:
        return fn(prefix + response, list(golds), **options)
    except TypeError as exc:
        raise ConfigError(f"bad options {sorted(options)} for reward {name!r}: {exc}") from exc


def check_reward_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse options the reward ``name``'s score function does not take (before a run spends time on them).

    Raises:
        ConfigError: an unknown option, naming the ones the function takes.
    """
    params = inspect.signature(reward_of(name).score).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    takes = [p for i, p in enumerate(params) if i >= 2]  # (response, golds, *options)
    unknown = sorted(set(options) - set(takes) - {"response_prefix"})
    if unknown:
        raise ConfigError(f"reward {name!r} takes no option(s) {unknown}; its options: {', '.join(takes) or 'none'} "
                          f"(set them under the stage's reward_options)")


def golds_from_ground_truth(ground_truth: Any) -> list[str]:
    """Gold answers from verl/TRL data: a string, a list/array, or a dict with ``target``/``golden_answers``."""
    if isinstance(ground_truth, Mapping):
        for key in ("target", "golden_answers", "ground_truth", "answer"):
            if key in ground_truth:
                return golds_from_ground_truth(ground_truth[key])
        raise DataError(
            f"ground truth dict has none of target/golden_answers/ground_truth/answer: {ground_truth!r:.120}"
        )
    if isinstance(ground_truth, str):
        return [ground_truth]
    if hasattr(ground_truth, "tolist"):  # numpy arrays from parquet
        ground_truth = ground_truth.tolist()
    if isinstance(ground_truth, (list, tuple)):
        return [str(g) for g in ground_truth]
    if ground_truth is None:
        return []
    return [str(ground_truth)]


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping | None = None, **_: Any
) -> dict[str, float]:
    """verl custom reward function; returns ``{"score": ..., **parts}`` (floats only, as verl aggregates them).

    The reward is ``extra_info["reward"]`` or ``$SEARCHLOOP_REWARD``; options from ``extra_info["reward_options"]``.
    """
    info = dict(extra_info or {})
    name = info.get("reward") or os.environ.get("SEARCHLOOP_REWARD")
    if not name:
        raise ConfigError(
            f"no reward chosen for data source {data_source!r}: set extra_info['reward'] or SEARCHLOOP_REWARD "
            f"to one of {', '.join(REWARDS)}"
        )
    return _verl(name, solution_str, ground_truth, info)


def _verl(name: str, solution_str: str, ground_truth: Any, info: Mapping) -> dict[str, float]:
    options = dict(info.get("reward_options") or {})
    hook = reward_of(name).verl_options
    extra = hook(info, options) if hook else {}
    result = score_response(name, solution_str, golds_from_ground_truth(ground_truth), **options)
    return {"score": float(result.score), **{k: float(v) for k, v in result.parts.items()}, **extra}


def _verl_entry(name: str) -> Callable[..., dict[str, float]]:
    def entry(
        data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping | None = None, **_: Any
    ) -> dict[str, float]:
        return _verl(name, solution_str, ground_truth, extra_info or {})

    entry.__name__ = f"compute_score_{name}"
    entry.__doc__ = f"verl custom reward function fixed to the {name!r} reward."
    return entry


def __getattr__(attr: str) -> Callable[..., dict[str, float]]:
    """``compute_score_<reward>``: a verl entry point fixed to that reward, for every name in the table (PEP 562)."""
    name = attr.removeprefix("compute_score_")
    if attr.startswith("compute_score_") and name in REWARDS:
        return _verl_entry(name)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def completion_text(completion: Any) -> str:
    """Text of a TRL completion: a string, or the concatenated contents of a list of chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, Mapping))
    raise DataError(f"unsupported completion type {type(completion).__name__}; expected str or list of messages")


def trl_reward_func(
    name: str, gold_column: str = "golden_answers", eos_token_id: int | None = None, **options: Any
) -> Callable[..., list[float]]:
    """A TRL ``reward_funcs`` callable ``(prompts, completions, **kwargs) -> list[float]`` for one seed reward.

    Args:
        name: reward name (a key of :data:`REWARDS`).
        gold_column: dataset column holding the gold answers (TRL passes columns as keyword lists).
        eos_token_id: passed to the reward's ``trl_options`` hook (``research``: a completion ends with EOS when its
            ``completion_ids`` end with this id, as TRL decodes without special tokens).
        **options: options of the reward (see :func:`score_response`).
    """
    hook = reward_of(name).trl_options

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        golds = kwargs.get(gold_column)
        if golds is None:
            columns = sorted(k for k in kwargs if k not in ("trainer_state", "completion_ids"))
            raise DataError(f"reward {name!r} needs the dataset column {gold_column!r}; columns present: {columns}")
        scores = []
        for i, completion in enumerate(completions):
            opts = dict(options)
            if hook:
                hook(i, kwargs, opts, eos_token_id)
            result = score_response(name, completion_text(completion), golds_from_ground_truth(golds[i]), **opts)
            scores.append(float(result.score))
        return scores

    reward.__name__ = f"{name}_reward"
    return reward


def seed_reward_fn(name: str, **options: Any) -> Callable[[list[Any]], list[float]]:
    """A held-out ``RewardFn`` (``training.agent.heldout``): the seed reward ``name`` (a key of :data:`REWARDS`) of
    each trajectory's response."""

    def fn(trajs: list[Any]) -> list[float]:
        return [score_response(name, t.response, t.golden_answers, **dict(options)).score for t in trajs]

    return fn
