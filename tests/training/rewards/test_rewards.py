"""Each seed's reward on hand-made trajectories; expected values worked out by following the seed's code.

The trace of the seed's code for each case is in the comments (file names as in shared/notes/seeds.md).
"""

from __future__ import annotations

import pytest

from training.protocols.base import last_boxed
from training.protocols.r1searcher import format_violations as r1searcher_format_violations
from training.protocols.research import validate as research_format
from training.rewards import (
    AnswerInResult,
    RedundancyRule,
    r1searcher_stage1_reward,
    r1searcher_stage2_reward,
    research_reward,
    searchr1_answer,
    searchr1_em_reward,
    searchr1_format_reward,
    searchr1_sequence,
    smartsearch_redundancy,
    smartsearch_reward,
    smartsearch_round_prefixes,
    smartsearch_split,
)
from training.rewards.adapters import check_reward_options

EOS = "<|im_end|>"

# ------------------------------------------------------------------------------------------------ ReSearch
RS_GOOD = (
    "<think>I need the capital.</think>\n<search> capital of France </search> <result>\nParis is the capital"
    "\n</result>\n<think>It is Paris.</think>\n<answer> The final answer is \\[ \\boxed{Paris} \\] </answer>"
)


def test_research_correct_answer_scores_f1() -> None:
    # format ok; ends with EOS; answer "Paris" vs gold "Paris": F1 = 1.0
    assert research_reward(RS_GOOD + EOS, ["Paris"], eos_token=EOS).score == 1.0
    # gold "Paris France": pred tokens [paris], gold [paris, france]: P=1, R=1/2, F1=2/3 (>0 so reward = F1)
    assert research_reward(RS_GOOD + EOS, ["Paris France"], eos_token=EOS).score == pytest.approx(2 / 3)


def test_research_wrong_answer_good_format_gets_0_1() -> None:
    r = research_reward(RS_GOOD + EOS, ["London"], eos_token=EOS)
    assert r.score == 0.1 and "wrong answer" in r.reason
    # yes/no rule: pred "yes" vs gold "yes indeed" differ -> F1 0 -> 0.1
    yes = RS_GOOD.replace("\\boxed{Paris}", "\\boxed{yes}")
    assert research_reward(yes + EOS, ["yes indeed"], eos_token=EOS).score == 0.1


def test_research_no_eos_is_over_length() -> None:
    assert research_reward(RS_GOOD, ["Paris"], eos_token=EOS).reason == "over length"
    assert research_reward(RS_GOOD, ["Paris"], eos_token=EOS).score == 0.0
    assert research_reward(RS_GOOD, ["Paris"], finished=False).score == 0.0
    assert research_reward(RS_GOOD, ["Paris"]).score == 1.0  # caller vouches for EOS


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (RS_GOOD.replace("</think>\n<answer>", "\n<answer>"), "not paired"),  # 2 <think>, 1 </think>
        ("<answer>\\boxed{Paris}</answer>", "not found"),  # no think at all
        (RS_GOOD + "<answer>again</answer>", "exactly one pair"),  # two answers
        (RS_GOOD.replace("<result>", "<resul>"), "incomplete"),  # search without result
        (RS_GOOD.replace("</search> <result>", "<result> </search>"), "wrong order"),  # result inside search
        (RS_GOOD.replace("\\boxed{Paris}", "Paris"), "boxed"),  # no \boxed{
        ("<think>x</think></answer> \\boxed{a} <answer>", "before"),  # closing tag first
    ],
)
def test_research_bad_format_scores_zero(text: str, reason: str) -> None:
    r = research_reward(text + EOS, ["Paris"], eos_token=EOS)
    assert r.score == 0.0 and reason in r.reason
    assert not research_format(text).ok


def test_research_box_extraction_follows_seed() -> None:
    assert last_boxed("\\boxed{a {b} c}") == "a {b} c"  # brace-matched
    assert last_boxed("\\boxed{a} then \\boxed{b}") == "b"  # last box
    assert last_boxed("\\boxed{unclosed") is None
    assert last_boxed("\\fbox{a}") is None  # seed's remove_boxed rejects \fbox
    assert last_boxed("\\boxed x$ y") == "x"  # "\boxed " form, cut at "$"
    # format passes ('\boxed{' and '}' present) but the box is unclosed -> extraction fails -> 0
    text = "<think>t</think><answer>\\boxed{Paris} and \\boxed{x</answer>"
    assert research_format(text).ok
    assert research_reward(text, ["Paris"]).score == 0.0


# --------------------------------------------------------------------------------------------- R1-Searcher
R1_GOOD = (
    "I should search.</think> <|begin_of_query|> capital France <|end_of_query|>\n\n<|begin_of_documents|>\n"
    "(1)Paris is the capital of France.\n<|end_of_documents|>\n\n<think>Paris.</think><answer> Paris </answer>"
)


def test_r1searcher_stage1_components() -> None:
    # R1_GOOD has 2 "</think>"? No: the second segment opens <think> again -> <think> count 1 -> format fails.
    r = r1searcher_stage1_reward(R1_GOOD, "Paris")
    # answer: tags present, CEM("Paris","Paris")=1 -> +1; retrieve: all seven counts == 1 -> +0.5;
    # format: <think> count is 1 (must be 0) -> +0 ; total 1.5
    assert r.parts == {"answer": 1.0, "retrieve": 0.5, "format": 0.0} and r.score == 1.5
    clean = R1_GOOD.replace("<think>Paris.</think>", "")
    # now 0 <think>, one </think>, one <answer>, one </answer> -> +0.5 ; total 2.0
    assert r1searcher_stage1_reward(clean, ["Paris"]).score == 2.0
    # wrong answer: CEM("Paris", "London")=0 -> -1 ; +0.5 +0.5 -> 0.0
    assert r1searcher_stage1_reward(clean, ["London"]).score == 0.0
    # no retrieval at all: counts all 0 -> not >= 1 -> no +0.5 ; answer +1, format +0.5 -> 1.5
    assert r1searcher_stage1_reward("x</think><answer>Paris</answer>", ["Paris"]).score == 1.5
    # missing </answer>: answer -1; retrieve 0; format 0 (no </answer>) -> -1
    assert r1searcher_stage1_reward("x</think><answer>Paris", ["Paris"]).score == -1.0
    # CEM is token-set cover: gold "France Paris" tokens all in "paris capital of france" -> hit
    cover = clean.replace("<answer> Paris </answer>", "<answer> Paris, capital of France </answer>")
    assert r1searcher_stage1_reward(cover, ["France Paris"]).parts["answer"] == 1.0
    # True/False map to yes/no
    tf = clean.replace("<answer> Paris </answer>", "<answer>True</answer>")
    assert r1searcher_stage1_reward(tf, ["yes"]).parts["answer"] == 1.0


def test_r1searcher_stage1_unbalanced_retrieval() -> None:
    # a query without documents: begin/end query counts 1, document counts 0 -> no retrieve reward
    text = "q</think><|begin_of_query|> x <|end_of_query|><answer>Paris</answer>"
    assert r1searcher_stage1_reward(text, ["Paris"]).parts["retrieve"] == 0.0


def test_r1searcher_stage2_qwen_and_llama() -> None:
    clean = R1_GOOD.replace("<think>Paris.</think>", "")
    # F1("Paris","Paris")=1, no violations -> 1.0
    assert r1searcher_stage2_reward(clean, ["Paris"]).score == 1.0
    # pred "Paris" vs gold "Paris France": P=1 R=.5 F1=2/3, no violations
    assert r1searcher_stage2_reward(clean, ["Paris France"]).score == pytest.approx(2 / 3)
    # R1_GOOD has a <think> -> violation: qwen 1 - 2 = -1, llama 1 - 1 = 0
    assert r1searcher_stage2_reward(R1_GOOD, ["Paris"], "qwen").score == -1.0
    assert r1searcher_stage2_reward(R1_GOOD, ["Paris"], "llama").score == 0.0
    # no answer tags: F1 forced 0; also answer-tag count violation -> qwen -2, llama -1
    assert r1searcher_stage2_reward("x</think> Paris", ["Paris"], "qwen").score == -2.0
    assert r1searcher_stage2_reward("x</think> Paris", ["Paris"], "llama").score == -1.0


@pytest.mark.parametrize(
    ("answer", "qwen_violates", "llama_violates"),
    [
        ("Paris", False, False),
        ("one two three four five six seven eight nine ten eleven", True, False),  # 11 words > 10 (qwen only)
        ("the assistant says Paris", True, False),  # 'assistant' (qwen only)
        ("巴黎", True, True),  # CJK outside documents (both)
        ("<|begin_of_query|>", True, True),  # tag in answer (qwen) and unequal tag counts (both)
    ],
)
def test_r1searcher_violations(answer: str, qwen_violates: bool, llama_violates: bool) -> None:
    text = f"t</think><answer>{answer}</answer>"
    assert bool(r1searcher_format_violations(text, "qwen")) is qwen_violates
    assert bool(r1searcher_format_violations(text, "llama")) is llama_violates


def test_r1searcher_cjk_inside_documents_is_fine() -> None:
    text = ("t</think><|begin_of_query|>q<|end_of_query|>\n\n<|begin_of_documents|>\n(1)巴黎\n<|end_of_documents|>"
            "\n\n<answer>Paris</answer>")
    assert r1searcher_format_violations(text, "qwen") == []


# ------------------------------------------------------------------------------------------------ Search-R1
SR1_GOOD = (
    "<think>need search</think>\n<search> capital of France </search>\n\n<information>Doc 1(Title: Paris) "
    "Paris is the capital of France.</information>\n\n<think>done</think>\n<answer> Paris </answer>"
)
PROMPT = "<|im_start|>user\nAnswer ... For example, <answer> Beijing </answer>.<|im_end|>\n<|im_start|>assistant\n"


def test_searchr1_em_and_two_match_rule() -> None:
    assert searchr1_em_reward(SR1_GOOD, ["paris"]).score == 1.0
    assert searchr1_em_reward(SR1_GOOD, ["London"]).score == 0.0
    # the seed scores prompt+response and needs >= 2 matches (prompt example + answer) -> same result
    assert searchr1_em_reward(PROMPT + SR1_GOOD, ["paris"], min_answer_matches=2).score == 1.0
    # response alone with the seed's threshold 2: only one match -> None -> 0
    assert searchr1_answer(SR1_GOOD, 2) is None
    assert searchr1_em_reward(SR1_GOOD, ["paris"], min_answer_matches=2).score == 0.0
    # last answer wins
    assert searchr1_answer("<answer>a</answer><answer> b </answer>") == "b"


def test_searchr1_format_variant() -> None:
    # valid + correct -> 1.0
    assert searchr1_format_reward(SR1_GOOD, ["Paris"]).score == 1.0
    # valid + wrong -> 0.2; with retrieval_score 0.1 and "france" in the information block -> 0.3
    assert searchr1_format_reward(SR1_GOOD, ["Lyon"]).score == 0.2
    assert searchr1_format_reward(SR1_GOOD, ["France"], retrieval_score=0.1).score == pytest.approx(0.3)
    # invalid (text between tags) + correct -> 1 - 0.2 = 0.8
    bad = SR1_GOOD.replace("<answer>", "junk <answer>")
    assert searchr1_format_reward(bad, ["Paris"]).score == pytest.approx(0.8)
    # invalid + wrong -> final_format_score 0.1 ; invalid + no answer -> 0
    assert searchr1_format_reward(bad, ["Lyon"]).score == 0.1
    assert searchr1_format_reward("<think>x</think> no answer", ["Lyon"]).score == 0.0
    # valid but no answer is impossible (must end in answer); "<think>a</think>" ends in after_think -> invalid
    assert not searchr1_sequence("<think>a</think>").ok
    # with the prompt: validated after the assistant marker, like the seed
    assert searchr1_sequence(PROMPT + SR1_GOOD, require_assistant_marker=True).ok
    assert not searchr1_sequence(SR1_GOOD, require_assistant_marker=True).ok


@pytest.mark.parametrize(
    "text",
    [
        "<think>a</think><search>q</search><answer>x</answer>",  # answer right after search
        "<think>a</think><search>q</search><information>d</information><answer>x</answer>",  # no think after info
        "<think>a<think>b</think></think><answer>x</answer>",  # nested think
        "<think>a</think><answer>x</answer> trailing",  # content after the end
        "<answer>x</answer>",  # answer first
    ],
)
def test_searchr1_invalid_sequences(text: str) -> None:
    assert not searchr1_sequence(text).ok


# ---------------------------------------------------------------------------------------------- SmartSearch
DOC_A, DOC_B, DOC_C = '"Paris"\nParis is the capital.', '"France"\nFrance is a country.', '"Lyon"\nLyon is a city.'


def _round(query: str, docs: list[str]) -> str:
    return f"<search> {query} </search><result>result: \n" + "\n\n".join(docs) + "\n</result>\n"


def _smart(rounds: list[list[str]], answer: str) -> str:
    body = "".join(_round(f"q{i}", d) for i, d in enumerate(rounds))
    # the generated response: the prompt ends with the <think> generation prefix, so the text starts inside it
    return f"plan</think>\n{body}<think>done</think>\n<answer> \\boxed{{{answer}}} </answer>"


def test_smartsearch_redundancy_counts() -> None:
    text = _smart([[DOC_A, DOC_B], [DOC_A, DOC_C], [DOC_A, DOC_B, DOC_C]], "Paris")
    # round 0: nothing seen -> 0 ; round 1: A seen -> 1 ; round 2: A, B, C all seen -> 3
    assert smartsearch_redundancy(text) == [0, 1, 3]
    assert RedundancyRule()("", text, []) == [True, True, False]
    assert len(smartsearch_round_prefixes(text)) == 3


def test_smartsearch_correct_answer_process_penalty() -> None:
    # correct (F1 1 >= 0.8): 1.0 ; one bad round (round 2) -> 1 - 0.1 = 0.9 ; max(0.9, 0.7)=0.9 ; format +0.1 = 1.0
    text = _smart([[DOC_A, DOC_B], [DOC_A, DOC_C], [DOC_A, DOC_B, DOC_C]], "Paris")
    r = smartsearch_reward(text, ["Paris"])
    assert r.score == pytest.approx(1.0) and r.parts["bad_rounds"] == 1.0
    # four bad rounds from a scorer saying all bad: 1 - 0.4 = 0.6 -> max(.., 0.7) = 0.7 ; + 0.1 = 0.8
    def all_bad(q, resp, golds):
        return [False] * resp.count("</result>")
    four = _smart([[DOC_A]] * 4, "Paris")
    assert smartsearch_reward(four, ["Paris"], scorers=[all_bad]).score == pytest.approx(0.8)


def test_smartsearch_wrong_answer_process_bonus() -> None:
    # wrong: 0 + 0.1 * good rounds, capped at 0.3 ; 2 good rounds (no repeats) -> 0.2 ; format +0.1 -> 0.3
    text = _smart([[DOC_A], [DOC_B]], "Lyon")
    assert smartsearch_reward(text, ["Paris"]).score == pytest.approx(0.3)
    # 5 good rounds -> min(0.5, 0.3) = 0.3 ; + 0.1 = 0.4
    five = _smart([[DOC_A], [DOC_B], [DOC_C], ["d4"], ["d5"]], "Lyon")
    assert smartsearch_reward(five, ["Paris"]).score == pytest.approx(0.4)
    # F1 threshold 0.8: pred "Paris France" vs gold "Paris": P=.5 R=1 F1=2/3 < 0.8 -> counts as wrong
    near = _smart([[DOC_A]], "Paris France")
    assert smartsearch_reward(near, ["Paris"]).parts["outcome"] == 0.0


def test_smartsearch_format_and_malformed_tag() -> None:
    # no \boxed -> answer "" -> F1 0 -> wrong; 1 good round -> 0.1 ; format fails (no \boxed{) -> 0.1 total
    text = _smart([[DOC_A]], "Paris").replace("\\boxed{Paris}", "Paris")
    assert smartsearch_reward(text, ["Paris"]).score == pytest.approx(0.1)
    # '</search<' anywhere -> 0
    broken = _smart([[DOC_A]], "Paris").replace("</search>", "</search<", 1)
    assert smartsearch_reward(broken, ["Paris"]).score == 0.0
    # PRM-style scorer returning None (failed call) counts as good, as the seed treats '' from the PRM
    def unknown(q, resp, golds):
        return [None] * resp.count("</result>")
    assert smartsearch_reward(_smart([[DOC_A]], "Lyon"), ["Paris"], scorers=[unknown]).score == pytest.approx(0.2)
    # a scorer list of the wrong length is ignored (seed ignores a misaligned redundancy list)
    def short(q, resp, golds):
        return [False]
    two = _smart([[DOC_A], [DOC_B]], "Lyon")
    assert smartsearch_reward(two, ["Paris"], scorers=[short]).score == pytest.approx(0.3)


def test_smartsearch_answer_judge_rewards_rounds_that_found_the_answer() -> None:
    # AnswerInResult: a round is good when its result block holds a gold answer (whole words, normalised)
    assert AnswerInResult()("", _smart([[DOC_B], [DOC_A]], "x"), ["paris"]) == [False, True]
    assert AnswerInResult()("", _smart([[DOC_A]], "x"), ["yes"]) == [False]  # yes/no never match a document
    # wrong answer: the redundancy rule alone counts the round good (0.1); the answer judge only when it found Paris
    found, missed = _smart([[DOC_A]], "Lyon"), _smart([[DOC_B]], "Lyon")
    assert smartsearch_reward(found, ["Paris"], answer_judge=True).score == pytest.approx(0.2)
    assert smartsearch_reward(missed, ["Paris"], answer_judge=True).score == pytest.approx(0.1)
    assert smartsearch_reward(missed, ["Paris"]).score == pytest.approx(0.2)
    # correct answer from a round that missed it (answered from memory): 1 - 0.1 + 0.1 format
    lucky = _smart([[DOC_B]], "Paris")
    r = smartsearch_reward(lucky, ["Paris"], answer_judge=True)
    assert r.score == pytest.approx(1.0) and r.parts["bad_rounds"] == 1.0
    assert smartsearch_reward(_smart([[DOC_A]], "Paris"), ["Paris"], answer_judge=True).score == pytest.approx(1.1)
    check_reward_options("smartsearch", {"answer_judge": True})


def test_smartsearch_split_full_sequence() -> None:
    system = "<|im_start|>system\nUse <think> </think>, <think> and <think> tags.<|im_end|>\n"
    seq = system + "<|im_start|>user\nWhat is the capital?<|im_end|>\n<|im_start|>assistant\n<think>plan</think>"
    assert smartsearch_split(seq) == ("What is the capital?", "<think>plan</think>")
    assert smartsearch_split("<think>only</think>") is None


def test_r1searcher_appended_eos_keeps_trailing_newlines() -> None:
    # the seed appends EOS before stripping, so a trailing "<|end_of_documents|>\n\n" keeps its newlines:
    # counts all 1 -> retrieve +0.5; no answer tags -> -1 ; format 0 -> -0.5
    text = "t</think> <|begin_of_query|> q <|end_of_query|>\n\n<|begin_of_documents|>\n(1)d\n<|end_of_documents|>\n\n"
    assert r1searcher_stage1_reward(text, "no", eos_token="<|endoftext|>").score == -0.5
    # an unclosed last answer: pred = "London<|endoftext|>" -> r1 normalization "london endoftext";
    # F1 vs "London": P=1/2 R=1 F1=2/3 ; violations (2 <answer>) -> qwen 2/3 - 2
    bad = "t</think><answer>x</answer><answer>London"
    assert r1searcher_stage2_reward(bad, "London", "qwen", eos_token="<|endoftext|>").score == pytest.approx(2 / 3 - 2)
