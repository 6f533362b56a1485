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
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from infra.errors import ConfigError, DataError
from infra.lazy import table_name
from training import rewards as R

REWARDS: dict[str, Callable[..., R.RewardBreakdown]] = {
    "research": R.research_reward,
    "r1searcher_stage1": R.r1searcher_stage1_reward,
    "r1searcher_stage2": partial(R.r1searcher_stage2_reward, style="qwen"),
    "r1searcher_stage2_llama": partial(R.r1searcher_stage2_reward, style="llama"),
    "searchr1_em": R.searchr1_em_reward,
    "searchr1_format": R.searchr1_format_reward,
    "smartsearch": R.smartsearch_reward,
}


RewardName = table_name(REWARDS, "reward")
"""A config field naming a reward: checked when the config loads, with the other errors."""


def score_response(name: str, response: str, golds: Sequence[str], **options: Any) -> R.RewardBreakdown:
    """Score one response with the reward called ``name`` (a key of :data:`REWARDS`).

    Args:
        name: reward name.
        response: generated text.
        golds: gold answers.
        **options: keyword options of that reward; ``response_prefix`` is prepended to the response first.

    Raises:
        ConfigError: for an unknown name or option.
    """
    fn = REWARDS.get(name)
    if fn is None:
        raise ConfigError(f"unknown reward {name!r}; choose one of {', '.join(REWARDS)}")
    prefix = options.pop("response_prefix", "")
    try:
        return fn(prefix + response, list(golds), **options)
    except TypeError as exc:
        raise ConfigError(f"bad options {sorted(options)} for reward {name!r}: {exc}") from exc


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
    extra: dict[str, float] = {}
    if name == "research" and "eos_token" not in options and "finished" not in options:
        # verl decodes without special tokens, so the text never shows EOS; our agent loop reports it instead
        finished = info.get("finished")
        if finished is None:
            _warn_once("verl gave no extra_info['finished'] for the research reward (is the agent loop ours?): "
                       "responses count as finished, so the over-length rule cannot apply")
        else:
            options["finished"] = bool(finished)
            extra["finished"] = float(bool(finished))
    if name == "smartsearch" and "scorers" not in options:
        options["scorers"], judged = smartsearch_scorers(info)
        extra |= judged
    result = score_response(name, solution_str, golds_from_ground_truth(ground_truth), **options)
    return {"score": float(result.score), **{k: float(v) for k, v in result.parts.items()}, **extra}


def smartsearch_scorers(info: Mapping) -> tuple[tuple[Any, ...], dict[str, float]]:
    """SmartSearch's round scorers from a sample's ``extra_info``: the redundancy rule, plus the judge's verdicts
    when the agent loop reported ``round_useful``; and the extra floats to report (``judge_failed``, ``branch``)."""
    from training.rewards.smartsearch import JudgeVerdicts, RedundancyRule

    max_redundancy = info.get("max_redundancy")
    rule = RedundancyRule(1 if max_redundancy is None else int(max_redundancy))
    useful = info.get("round_useful")
    if useful is None:
        _warn_once("no extra_info['round_useful'] for the smartsearch reward (agent loop without `smartsearch` "
                   "judge settings?): bad rounds are counted by the redundancy rule only")
        return (rule,), {}
    if hasattr(useful, "tolist"):
        useful = useful.tolist()
    verdicts = tuple(None if v is None or v != v else int(v) for v in useful)  # v != v: NaN from a parquet round trip
    extra = {"judge_failed": float(sum(v is None for v in verdicts)),
             "branch": float(info.get("branch", 0) or 0)}
    return (rule, JudgeVerdicts(verdicts)), extra


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    import logging

    if message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger(__name__).warning(message)


def _verl_entry(name: str) -> Callable[..., dict[str, float]]:
    def entry(
        data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping | None = None, **_: Any
    ) -> dict[str, float]:
        return _verl(name, solution_str, ground_truth, extra_info or {})

    entry.__name__ = f"compute_score_{name}"
    entry.__doc__ = f"verl custom reward function fixed to the {name!r} reward."
    return entry


compute_score_research = _verl_entry("research")
compute_score_r1searcher_stage1 = _verl_entry("r1searcher_stage1")
compute_score_r1searcher_stage2 = _verl_entry("r1searcher_stage2")
compute_score_r1searcher_stage2_llama = _verl_entry("r1searcher_stage2_llama")
compute_score_searchr1_em = _verl_entry("searchr1_em")
compute_score_searchr1_format = _verl_entry("searchr1_format")
compute_score_smartsearch = _verl_entry("smartsearch")


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
        eos_token_id: for ``research``: a completion ends with EOS when its ``completion_ids`` end with this id
            (TRL decodes without special tokens, so the text cannot show it). Without it, completions count as
            finished unless a ``finished`` column says otherwise.
        **options: options of the reward (see :func:`score_response`).
    """
    if name not in REWARDS:
        raise ConfigError(f"unknown reward {name!r}; choose one of {', '.join(REWARDS)}")

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        golds = kwargs.get(gold_column)
        if golds is None:
            columns = sorted(k for k in kwargs if k not in ("trainer_state", "completion_ids"))
            raise DataError(f"reward {name!r} needs the dataset column {gold_column!r}; columns present: {columns}")
        ids = kwargs.get("completion_ids")
        finished = kwargs.get("finished")
        scores = []
        for i, completion in enumerate(completions):
            opts = dict(options)
            if name == "research":
                if eos_token_id is not None and ids is not None:
                    opts["finished"] = bool(ids[i]) and ids[i][-1] == eos_token_id
                elif finished is not None:
                    opts["finished"] = bool(finished[i])
            if name == "smartsearch" and "question" in kwargs:
                opts.setdefault("question", str(kwargs["question"][i]))
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
