"""Settings of the agent package read by the loop configs: rollout limits, held-out set, training-health alarms.

A leaf (pydantic and ``infra.config`` only), so ``training.em.config`` and ``training.rl.config`` can name them
without importing the rollout engine; the code that reads them is ``training.agent.rollout``,
``training.agent.heldout`` and ``training.agent.alarms``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from infra.config import StrictModel

AlarmName = Literal["search_collapse", "copied_answers", "answer_collapse"]
ALARMS: tuple[str, ...] = ("search_collapse", "copied_answers", "answer_collapse")


class AlarmConfig(StrictModel):
    """Thresholds of the training-health alarms (None disables one); ``stop_on`` picks the ones that stop a run."""

    search_collapse_ratio: float | None = Field(
        default=0.5, gt=0, le=1, description="search_collapse fires when mean searches per trajectory fall under "
        "this fraction of the start (training: mean over the window vs the first search_baseline_steps steps; "
        "held-out: final vs start policy).")
    search_baseline_steps: int = Field(
        default=2, ge=1, description="Training steps whose mean searches per trajectory are the start.")
    max_copied_share: float | None = Field(
        default=0.4, ge=0, le=1, description="copied_answers fires when more than this share of answers are copied "
        "from the question (recorded: Search-R1's collapsed run 106 of 210 held-out answers; every other "
        "committed run <= 0.27).")
    max_answer_share: float | None = Field(
        default=0.3, ge=0, le=1, description="answer_collapse fires when one answer string answers more than this "
        "share of the questions (the ReSearch replicate: 'Nicholas J. Belkin' for 84 of 210 = 0.40; the "
        "committed runs' most common answer <= 0.15, 'yes').")
    min_answer_questions: int = Field(
        default=10, ge=2, description="Distinct questions a training window needs before answer_collapse is judged.")
    stop_on: list[AlarmName] = Field(
        default_factory=list, description="Alarms that stop training at the step where they fire (a "
        "TrainingHealthError naming the alarm); the others only warn. E.g. [search_collapse, copied_answers].")


class RolloutConfig(StrictModel):
    """Rollout settings (protocol defaults apply where a field is None)."""

    n: int = Field(default=1, ge=1, description="Samples per question (GRPO group size / EM K).")
    temperature: float = Field(default=0.0, ge=0.0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int | None = Field(
        default=None, description="Base seed; step i samples with derive_seed(seed, i), and per-request engines "
        "give each prompt of the step its own seed from that (see training.generation.derive_seed).")
    best_of: int | None = Field(
        default=None, ge=1, description="Per-step best-of-n by likelihood when sampling (None = protocol default)."
    )
    top_k: int | None = Field(default=None, ge=1, description="Documents per search (None = protocol default).")
    max_turns: int | None = Field(default=None, ge=1, description="Turn limit (None = protocol default).")
    max_tokens_per_turn: int | None = Field(
        default=None, ge=1, description="New tokens per generation step (None = protocol default: 512, or the whole "
        "remaining budget for ReSearch, whose seed caps only the response).")
    max_total_tokens: int = Field(default=8192, ge=1, description="Generated tokens per trajectory in total.")
    max_passes: int = Field(default=40, ge=1, description="Hard cap on generation steps per trajectory.")
    chunk: int | None = Field(
        default=None, ge=1, description="Questions rolled out together through all their turns (None: every "
        "question at once). The transformers backend's prefix KV cache keeps a bounded number of tokens: when all "
        "of a large set's trajectories take their first turn before any takes its second, most rows' keys are "
        "evicted before their next turn and prefilled again; a chunk whose trajectories fit the cache continues "
        "every turn from its stored keys.")


class HeldoutSpec(StrictModel):
    """Which dev questions form the held-out set."""

    files: list[str] = Field(
        default_factory=lambda: ["hotpotqa_dev", "2wikimultihopqa_dev", "musique_dev"],
        description="Benchmarks (names or paths) whose paragraphs are in corpus/multihop_wiki.",
    )
    skip: int = Field(default=50, ge=0, description="Leading rows left out of each file (the *_mini sets).")
    per_file: int = Field(default=70, ge=1, description="Questions taken from each file after `skip`.")
    min_questions: int = Field(default=200, ge=1, description="Fewer questions than this is an error.")
