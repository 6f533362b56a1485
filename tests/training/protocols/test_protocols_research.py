"""ReSearch and SmartSearch parsing and validation on hand-written responses (the seeds' reward-side checks)."""

from __future__ import annotations

import pytest

from retrieval.types import Hit
from training.protocols import research, smartsearch

GOOD = (
    "<think> I need the director. </think> <search> Ed Wood director </search> <result>\nEd Wood was...\n</result>"
    "<think> It is Tim Burton. </think> <answer> The final answer is \\[ \\boxed{Tim Burton} \\] </answer><|im_end|>"
)


def test_valid_response_passes_and_answer_is_last_boxed() -> None:
    assert research.validate(GOOD).ok
    assert research.extract_answer(GOOD) == "Tim Burton"
    nested = "<answer> \\boxed{a} then \\boxed{\\text{b {c}}} </answer>"
    assert research.extract_answer(nested) == "\\text{b {c}}"


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("<think> a <answer> \\boxed{x} </answer>", "not paired"),
        ("<answer> \\boxed{x} </answer>", "not found"),
        ("<think> a </think> no answer", "<answer>"),
        ("<think> a </think> <answer> x </answer> <answer> y </answer>", "<answer>"),
        ("<think> a </think> <search> q </search> <answer> \\boxed{x} </answer>", "incomplete"),
        ("<think> a </think> <search> q <result> r </search> </result> <answer> \\boxed{x} </answer>", "order"),
        ("<think> a </think> <answer> Paris </answer>", "boxed"),
        ("<think> a </think> </answer> \\boxed{x} <answer>", "before"),
    ],
)
def test_malformed_responses_fail_with_the_seed_reason(response: str, reason: str) -> None:
    check = research.validate(response)
    assert not check.ok
    assert reason in check.reasons[0]


def test_query_is_last_search_pair_and_empty_query_inserts_nothing_to_search() -> None:
    assert research.extract_query("<search> a </search> x <search>  b c </search>") == "b c"
    assert research.extract_query("<search>  </search>") == ""
    assert research.extract_query("no tags") is None
    assert research.extract_query("</search> <search> open") is None
    proto = research.ReSearchProtocol()
    assert proto.result_text("", []) == " <result>\nnothing to search\n</result>"
    hits = [Hit(id="1", title="A", text="x", score=1.0), Hit(id="2", title="", text="y", score=0.5)]
    assert proto.result_text("q", hits) == ' <result>\n"A"\nx\n\ny\n</result>'


def test_base_and_instruct_prompts() -> None:
    base = research.ReSearchProtocol(template="base").build_prompt("Who?")
    assert base.endswith("User: Who?. Assistant:")
    assert "<search> search query here </search>" in base
    with pytest.raises(Exception, match="chat template"):
        research.ReSearchProtocol().build_prompt("Who?", tokenizer=None)


def test_smartsearch_counts_the_prompt_think_and_rejects_bad_search_tag(smol_tokenizer) -> None:
    response = " plan </think> <search> q </search><result>result: \nd\n\n</result>\n<think> ok </think>"
    response += " <answer> \\boxed{yes} </answer><|im_end|>"
    assert smartsearch.validate(response).ok
    assert not research.validate(response).ok  # without the prompt's <think> the counts differ
    bad = response.replace("</search>", "</search<", 1)
    assert "invalid search tag </search< found" in smartsearch.validate(bad).reasons
    assert smartsearch.extract_answer("x \\boxed{a} y \\boxed{b}") == "b"
    prompt = smartsearch.SmartSearchProtocol().build_prompt("Who?", smol_tokenizer)
    assert prompt.endswith("<|im_start|>assistant\n<think>")
    assert prompt.count("<think>") == 4  # the seed's reward cuts the response at the fourth <think>


def test_smartsearch_query_needs_paired_tags_and_result_format() -> None:
    assert smartsearch.extract_query("<search> a </search> <search> b </search>") == "b"
    assert smartsearch.extract_query("<search> a <search> b </search>") is None
    proto = smartsearch.SmartSearchProtocol()
    hits = [Hit(id="1", title="A", text="x", score=1.0), Hit(id="2", title="B", text="y", score=0.5)]
    # the seed: f"<result>{ret_str.strip()}\n</result>\n" with ret_str = f"result: \n{docs}\n": ONE newline
    assert proto.result_text("q", hits) == '<result>result: \n"A"\nx\n\n"B"\ny\n</result>\n'
    assert proto.result_text("q", []) == "<result>\n</result>\n"
    assert proto.max_turns == 5


def test_smartsearch_step_cap_is_min_4096_remaining() -> None:
    """The seed asks vLLM for min(4096, remaining) tokens per step; a 600-token step must not end as "length"."""
    from training.agent.rollout import RolloutConfig, step_cap

    proto = smartsearch.SmartSearchProtocol()
    assert proto.default_max_tokens_per_turn == 4096
    assert step_cap(RolloutConfig(max_tokens_per_turn=None, max_total_tokens=8192), proto) == 4096
