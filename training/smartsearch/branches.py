"""Stage-3 query-aware GRPO pieces: group rollouts with refinement branches, and the reward with the judge.

:func:`branch_rollout_fn` is a ``training.rl.trl_engine.RolloutFn`` that fills each GRPO group the way the seed's
``vLLMRolloutWithSearch.generate_sequences`` does. Until every question of the batch (TRL repeats a prompt
``num_generations`` times) has its ``n`` samples, one *round*:

1. samples ONE on-policy trajectory per unfinished question with the live policy (all questions batched);
2. judges its rounds (usefulness judge + redundancy rule) and refines its low-quality queries;
3. takes its FIRST refined prefix (round order) whose token length differs from the original prefix by less than
   ``max_length_diff`` (the seed: 50; the seed keeps ``input_ids_list[0]`` only) and continues it once with the
   live policy.

So a group of n = 8 holds about n/2 on-policy samples and up to n/2 branches, each branched from a *different*
on-policy sample (the seed's mix), in the order on-policy, its branch, on-policy, ...; a round without a usable
prefix adds its on-policy sample alone, and the group is cut at n.

The engine rebuilds every branch's token mask from its segments (refined step generated, results inserted), so
the trainer's loss mask is right for branched samples too. All group trajectories are judged at the end in one
batch, so the reward's judge calls hit the verdict cache. Counts go to :class:`BranchStats`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from training.rewards.smartsearch import RedundancyRule, smartsearch_reward
from training.smartsearch.refine import continue_from_prefixes, length_ok, refine_rounds, refined_prefix

log = logging.getLogger(__name__)


@dataclass
class BranchStats:
    """What the branching rollouts did (summed over the training run)."""

    groups: int = 0
    on_policy: int = 0
    low_quality_rounds: int = 0
    refined: int = 0
    refine_failed: int = 0
    skipped_length: int = 0
    branches: int = 0
    trajectories: list[Any] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    refinements: list[dict[str, Any]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """The counters (no records)."""
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}


def _groups(rows: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        out.setdefault(str(r["question_id"]), []).append(i)
    return out


def _question(row: dict[str, Any]) -> Any:
    from evaluation.benchmarks import Question

    return Question(id=str(row["question_id"]), question=row["question"],
                    golden_answers=list(row["golden_answers"]), dataset=row.get("data_source", ""))


def first_kept(refinements: Sequence[Any], originals: Sequence[Any], tokenizer: Any, max_length_diff: int,
               stats: BranchStats) -> dict[str, Any]:
    """Per question, the first refined prefix (round order) of its on-policy sample that passes the seed's length
    check (the seed keeps only ``input_ids_list[0]``); counts refined / failed / skipped in ``stats``."""
    by_id = {t.question_id: t for t in originals}
    kept: dict[str, Any] = {}
    for r in sorted(refinements, key=lambda r: (r.question_id, r.round)):
        if r.refined_query is None:
            stats.refine_failed += 1
            continue
        stats.refined += 1
        if r.question_id in kept:
            continue
        prefix = refined_prefix(by_id[r.question_id], r.round, r.refined_query)
        if length_ok(tokenizer, by_id[r.question_id], prefix, max_length_diff):
            kept[r.question_id] = prefix
        else:
            stats.skipped_length += 1
    return kept


def fill_groups(sizes: dict[str, int], sample: Any, branch: Any) -> dict[str, list[Any]]:
    """The seed's group loop: while a question has fewer than ``sizes[q]`` samples, ``sample(qids)`` gives one
    on-policy trajectory per unfinished question; those that still need samples go to ``branch(originals)``, which
    returns at most one branch per original (its first kept refined prefix, continued). On-policy samples get
    sample indices 0, 1, ... in arrival order, branches 1000 + their position; groups are cut at their size."""
    pool: dict[str, list[Any]] = {q: [] for q in sizes}
    while active := [q for q in sizes if len(pool[q]) < sizes[q]]:
        originals = sample(active)
        for o in originals:
            pool[o.question_id].append(o.model_copy(update={"sample": len(pool[o.question_id])}))
        need = [pool[o.question_id][-1] for o in originals if len(pool[o.question_id]) < sizes[o.question_id]]
        for b in branch(need) if need else []:
            pool[b.question_id].append(b.model_copy(update={"sample": 1000 + len(pool[b.question_id])}))
    return {q: items[: sizes[q]] for q, items in pool.items()}


def branch_rollout_fn(protocol: Any, searcher: Any, rollout_cfg: Any, judge: Any, refiner: Any,
                      max_length_diff: int = 50, stats: BranchStats | None = None, batch_size: int = 16) -> Any:
    """A TRL ``RolloutFn`` with refinement branches (module docstring); ``refiner`` = (client, RefinerSpec[,
    GoldSupport])."""
    from training.agent.rollout import run_rollouts
    from training.generation.hf import TransformersGenerator
    from training.rl.trl_engine import to_sample
    from training.smartsearch.refine import unpack_refiner

    stats = stats if stats is not None else BranchStats()
    base_cfg = rollout_cfg.model_copy(update={"n": 1})
    client, spec, support = unpack_refiner(refiner)

    def rollout(rows: list[dict[str, Any]], model: Any, tokenizer: Any, seed: int | None = None) -> list[Any]:
        # The trainer passes a per-step, per-call seed (training.rl.trl_engine.RolloutSeeds); each round of the
        # group loop gets its own seed offset so the on-policy samples of one question differ.
        gen = TransformersGenerator(model, tokenizer, batch_size=batch_size)
        groups = _groups(rows)
        questions = {qid: _question(rows[idx[0]]) for qid, idx in groups.items()}
        sizes = {q: len(i) for q, i in groups.items()}
        stats.groups += len(groups)
        step = [0]

        def sample(qids: list[str]) -> list[Any]:
            cfg = base_cfg.model_copy(update={"seed": (seed if seed is not None else base_cfg.seed or 0) + step[0]})
            step[0] += 1
            originals = run_rollouts([questions[q] for q in qids], protocol, gen, searcher, cfg, tokenizer)
            stats.on_policy += len(originals)
            return originals

        def branch(originals: list[Any]) -> list[Any]:
            verdicts = judge.judge_trajectories(originals)
            stats.low_quality_rounds += sum(v.low_quality for vs in verdicts for v in vs)
            refinements = refine_rounds(client, spec, originals, verdicts, judge.spec.max_redundancy, support)
            stats.refinements += [r.model_dump() for r in refinements]
            kept = first_kept(refinements, originals, tokenizer, max_length_diff, stats)
            todo = [kept[o.question_id] for o in originals if o.question_id in kept]
            branches = continue_from_prefixes(todo, protocol, gen, searcher, base_cfg, tokenizer)
            stats.branches += len(branches)
            return branches

        pool = fill_groups(sizes, sample, branch)
        ordered: list[Any] = [None] * len(rows)
        for qid, idx in groups.items():
            for slot, traj in zip(idx, pool[qid][: sizes[qid]], strict=True):
                ordered[slot] = traj
        judged = judge.judge_trajectories(ordered)
        stats.verdicts += [v.model_dump() for vs in judged for v in vs]
        stats.trajectories += ordered
        return [to_sample(t, tokenizer) for t in ordered]

    return rollout


def smartsearch_trl_reward(judge: Any | None, max_redundancy: int = 1) -> Any:
    """TRL reward function: SmartSearch's reward with the redundancy rule and (when given) the judge."""
    scorers = (RedundancyRule(max_redundancy),) + ((judge,) if judge is not None else ())

    def smartsearch(prompts: list[Any], completions: list[str], golden_answers: list[list[str]],
                    question: list[str], **kwargs: Any) -> list[float]:
        return [smartsearch_reward(c, g, q, scorers).score
                for c, g, q in zip(completions, golden_answers, question, strict=True)]

    return smartsearch
