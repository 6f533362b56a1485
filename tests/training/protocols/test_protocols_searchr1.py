"""Search-R1 parsing and the ``qa_em_format`` state machine on hand-written responses."""

from __future__ import annotations

import pytest

from retrieval.types import Hit
from training.protocols import searchr1

GOOD = (
    "<think> need info </think>\n<search> Ed Wood </search>\n\n<information>Doc 1(Title: \"Ed Wood\") x\n"
    "</information>\n\n<think> got it </think>\n<answer> Tim Burton </answer>"
)


def test_valid_sequence_and_last_answer() -> None:
    assert searchr1.validate(GOOD).ok
    assert searchr1.validate("<think> a </think> <answer> b </answer>").ok
    assert searchr1.extract_answer(GOOD) == "Tim Burton"
    assert searchr1.extract_answer("<answer> a </answer> <answer> b </answer>") == "b"
    assert searchr1.extract_answer("none") is None


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("<think> a </think> <answer> b", "Mismatch in answer"),
        ("<answer> b </answer>", "Unexpected tag <answer> in state start"),
        ("<think> a </think> stray <answer> b </answer>", "Unexpected content"),
        ("<think> a </think> <search> q </search> <answer> b </answer>", "Unexpected tag <answer>"),
        ("<think> a </think> <search> q </search>", "Incomplete sequence"),
        ("<think> a </think> <answer> b </answer> after", "Unexpected content in state end"),
        ("<think> a <think> b </think> </think>", "Unexpected tag <think> in state in_think"),
    ],
)
def test_invalid_sequences(response: str, reason: str) -> None:
    check = searchr1.validate(response)
    assert not check.ok
    assert reason in check.reasons[0]


def test_first_action_wins_and_feedback_on_invalid() -> None:
    assert searchr1.parse_action("<search> q1 </search> <answer> a </answer>") == ("search", "q1")
    assert searchr1.parse_action("<answer> a </answer> <search> q </search>") == ("answer", "a")
    assert searchr1.parse_action("<search> unclosed") == (None, "")
    assert searchr1.extract_query("<search>  </search>") == ""
    assert "My previous action is invalid" in searchr1.INVALID_ACTION_FEEDBACK


def test_docs_format_uses_first_line_as_title() -> None:
    hits = [Hit(id="1", title="Ed Wood", text="x y", score=2.0), Hit(id="2", title="", text="z", score=1.0)]
    assert searchr1.SearchR1Protocol().format_docs(hits) == 'Doc 1(Title: "Ed Wood") x y\nDoc 2(Title: z) \n'


def test_final_pass_after_max_turns() -> None:
    proto = searchr1.SearchR1Protocol(max_turns=2)
    assert proto.max_turns == 2 and proto.top_k == 3
