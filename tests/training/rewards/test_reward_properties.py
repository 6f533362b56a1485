"""Property-based checks of the rewards on arbitrary tag soup, including huge outputs: every reward stays in the
set of values its seed can produce and never raises."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from training import rewards as R

PIECES = ["<think>", "</think>", "<search>", "</search>", "<result>", "</result>", "<answer>", "</answer>",
          "\\boxed{", "\\boxed ", "}", "{", "$", "Paris", "yes", " ", "\n\n", "result: ", "<information>",
          "</information>", "<|begin_of_query|>", "<|end_of_query|>", "<|begin_of_documents|>\n(1)",
          "<|end_of_documents|>\n\n", "</search<", "巴黎", "Assistant"]
SOUP = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
GOLDS = st.lists(st.sampled_from(["Paris", "yes", "no", "Paris France", ""]), min_size=1, max_size=3)


@settings(max_examples=150, deadline=None)
@given(SOUP, GOLDS)
def test_reward_ranges(text: str, golds: list[str]) -> None:
    research = R.research_reward(text, golds).score
    assert research in (0.0, 0.1) or 0.0 < research <= 1.0
    assert R.r1searcher_stage1_reward(text, golds).score in (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0)
    assert -2.0 <= R.r1searcher_stage2_reward(text, golds, "qwen").score <= 1.0
    assert -1.0 <= R.r1searcher_stage2_reward(text, golds, "llama").score <= 1.0
    assert R.searchr1_em_reward(text, golds).score in (0.0, 1.0)
    shaped = R.searchr1_format_reward(text, golds, retrieval_score=0.1).score
    assert min(abs(shaped - v) for v in (0.0, 0.1, 0.2, 0.3, 0.8, 1.0)) < 1e-9
    smart = R.smartsearch_reward(text, golds)
    assert 0.0 <= smart.score <= 1.1 + 1e-9
    assert smart.parts["good_rounds"] + smart.parts["bad_rounds"] == text.count("</result>")


def test_huge_output() -> None:
    block = "<search> q </search><result>\nresult: \ndoc A\n\ndoc B\n</result>\n"
    text = "plan</think>\n" + block * 2000 + "<think>x</think><answer> \\boxed{Paris} </answer>"  # ~120k chars
    r = R.smartsearch_reward(text, ["Paris"])
    # correct; 2000 rounds, all but the first repeat both docs -> 1999 bad -> max(1 - 199.9, 0.7) = 0.7 ; + 0.1
    assert abs(r.score - 0.8) < 1e-9 and r.parts["bad_rounds"] == 1999
    assert R.research_reward("<think>" + text, ["Paris"]).score == 1.0
