"""The table of rewards: a name -> the dotted import string of its :class:`training.rewards.common.Reward`.

A leaf (``infra.lazy`` only), so config models check a reward name (:data:`RewardName`) without importing any
reward. A new reward is one module exporting a ``Reward`` plus one line here (``docs/extending.md``).
"""

from __future__ import annotations

from infra.lazy import table_name

REWARDS: dict[str, str] = {
    "research": "training.rewards.research:RESEARCH",
    "r1searcher_stage1": "training.rewards.r1searcher:STAGE1",
    "r1searcher_stage2": "training.rewards.r1searcher:STAGE2",
    "r1searcher_stage2_llama": "training.rewards.r1searcher:STAGE2_LLAMA",
    "searchr1_em": "training.rewards.searchr1:EM",
    "searchr1_format": "training.rewards.searchr1:FORMAT",
    "smartsearch": "training.rewards.smartsearch:SMARTSEARCH",
}

RewardName = table_name(REWARDS, "reward")
"""A config field naming a reward: checked when the config loads, with the other errors."""
