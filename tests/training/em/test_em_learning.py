"""The EM recipe's held-out signal: the chat scored after the model's own trajectory (finished or cut), and the
learning-curve point of an iteration."""

from __future__ import annotations

import math

from training.agent.records import Trajectory
from training.em.learning import answer_messages, curve_row

PROMPT = "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"


def _traj(response: str, answer: str | None) -> Trajectory:
    return Trajectory(question_id="q", question="Who directed Ed Wood?", golden_answers=["Tim Burton"],
                      protocol="exsearch", prompt=PROMPT, response=response, final_answer=answer,
                      finish_reason="answer" if answer is not None else "length")


def test_finished_trajectory_keeps_its_answer_turn_for_the_gold() -> None:
    resp = ("<QUERY> director<|im_end|>\n<|im_start|>user\n<SEARCH> [0] Title: Ed Wood<|im_end|>\n"
            "<|im_start|>assistant\n<FACT> x\n<FINAL><|im_end|>\n<|im_start|>user\n<FINAL>\n<SEARCH> end search. "
            "please give the final answer to the input question: Who directed Ed Wood?<|im_end|>\n"
            "<|im_start|>assistant\nLyon<|im_end|>\n")
    msgs = answer_messages(_traj(resp, "lyon"))
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert msgs[-1]["content"] == "Lyon"  # the scorer swaps in the gold answer


def test_cut_trajectory_gets_the_forced_end_search_turn() -> None:
    resp = "<QUERY> director<|im_end|>\n<|im_start|>user\n<SEARCH> [0] Title: Ed Wood<|im_end|>\n<|im_start|>assistant\n"  # noqa: E501
    msgs = answer_messages(_traj(resp, None))
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "user", "assistant"]
    assert "end search." in msgs[-2]["content"] and "Who directed Ed Wood?" in msgs[-2]["content"]


def test_curve_row_reads_stage_records() -> None:
    from training.em.records import HeldoutRef, SampleRef, SelectRef
    from training.em.selection import SelectionStats

    held = HeldoutRef(step="heldout", path="h", rows="h/heldout.jsonl", n=2, model="m",
                      means={"reward": -2.0, "f1": 0.1, "em": 0.0, "format_ok": 0.5, "n_searches": 1.0})
    sample = SampleRef(step="sample", path="s", trajectories="s/t", n=8, finished=6, format_ok=4, questions=4)
    stats = SelectionStats(method="importance", n_trajectories=8, n_questions=4, n_groups_kept=3, n_selected=5,
                           dropped={}, dropped_members=0, mean_ess=1.5)
    row = curve_row(1, held, sample, SelectRef(step="select", path="x", train="x/train.jsonl", n_train=5,
                                               stats=stats), loss=float("nan"))
    assert row == {"iteration": 1, "heldout_reward": -2.0, "heldout_f1": 0.1, "heldout_em": 0.0,
                   "heldout_format_ok": 0.5, "heldout_searches": 1.0, "sample_format_ok": 0.5,
                   "sample_finished": 0.75, "select_mean_ess": 1.5, "n_train": 5.0}
    assert curve_row(0, None) == {"iteration": 0} and not math.isnan(row["heldout_reward"])
