"""Reward functions of the seeds as plain functions, callable outside any trainer; one module per seed.

Each function scores one *response* (the generated text after the prompt, documents included) against the gold
answers and returns a :class:`~training.rewards.common.RewardBreakdown` (see ``shared/notes/seeds.md``):

- ``research``: ReSearch ``re_search.py``.
- ``r1searcher``: R1-Searcher's stage-1 / stage-2 reward servers.
- ``searchr1``: Search-R1 ``qa_em.py`` / ``qa_em_format.py``.
- ``smartsearch``: SmartSearch ``compute_score_with_format`` with pluggable per-round scorers (option
  ``answer_judge``: the rule judge's answer test on each round's result).
- ``adapters``: the same functions behind the TRL and verl reward interfaces.

The format checks are the protocol modules' validators (``training.protocols.<name>``). This package re-exports
every seed's functions so ``from training import rewards as R; R.research_reward(...)`` reads like the notes.
"""

from training.rewards.common import RewardBreakdown, as_golds
from training.rewards.r1searcher import (
    r1searcher_answer,
    r1searcher_solution,
    r1searcher_stage1_reward,
    r1searcher_stage2_reward,
)
from training.rewards.research import research_answer, research_reward
from training.rewards.searchr1 import (
    searchr1_answer,
    searchr1_em_reward,
    searchr1_format_reward,
    searchr1_retrieval_hit,
    searchr1_sequence,
)
from training.rewards.smartsearch import (
    AnswerInResult,
    RedundancyRule,
    RoundScorer,
    smartsearch_process,
    smartsearch_redundancy,
    smartsearch_reward,
    smartsearch_round_prefixes,
    smartsearch_split,
)

__all__ = [
    "RewardBreakdown", "as_golds", "research_answer", "research_reward", "r1searcher_answer", "r1searcher_solution",
    "r1searcher_stage1_reward", "r1searcher_stage2_reward", "searchr1_answer", "searchr1_em_reward",
    "searchr1_format_reward", "searchr1_retrieval_hit", "searchr1_sequence", "AnswerInResult", "RedundancyRule",
    "RoundScorer",
    "smartsearch_process", "smartsearch_redundancy", "smartsearch_reward", "smartsearch_round_prefixes",
    "smartsearch_split",
]
