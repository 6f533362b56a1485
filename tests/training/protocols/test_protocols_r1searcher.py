"""R1-Searcher parsing, stage-2 violation checks (Qwen and Llama) and the stage-1 bonus conditions."""

from __future__ import annotations

from retrieval.types import Hit
from training.protocols import r1searcher

DOCS = "\n\n<|begin_of_documents|>\n(1)Title: A Text: x\n<|end_of_documents|>\n\n"
GOOD = " find <|begin_of_query|> Ed Wood director<|end_of_query|>" + DOCS
GOOD += "Burton. </think>\n\n<answer> Tim Burton </answer>"


def test_good_response_has_no_violations_and_earns_stage1_bonuses() -> None:
    assert r1searcher.validate(GOOD).ok
    assert r1searcher.format_violations(GOOD, "llama") == []
    assert r1searcher.stage1_retrieve_ok(GOOD)
    assert r1searcher.stage1_format_ok(GOOD)
    assert r1searcher.extract_answer(GOOD) == "Tim Burton"


def test_each_qwen_violation() -> None:
    cases = {
        "query/document tag counts differ": GOOD.replace("<|end_of_documents|>\n\n", "<|end_of_documents|>"),
        "'Assistant' appears": GOOD.replace("Burton.", "assistant says Burton."),
        "think structure": "<think> " + GOOD,
        "exactly one <answer>": GOOD + " <answer> again </answer>",
        "answer contains a query": GOOD.replace("Tim Burton", "<|begin_of_query|> x"),
        "longer than 10 words": GOOD.replace("Tim Burton", "one two three four five six seven eight nine ten eleven"),
        "CJK characters": GOOD.replace("find", "找"),
    }
    for reason, response in cases.items():
        reasons = r1searcher.format_violations(response, "qwen")
        assert any(reason in r for r in reasons), (reason, reasons)


def test_llama_checks_are_a_subset_and_cjk_inside_docs_is_allowed() -> None:
    wordy = GOOD.replace("Tim Burton", "one two three four five six seven eight nine ten eleven")
    assert r1searcher.format_violations(wordy, "llama") == []
    in_docs = GOOD.replace("Title: A", "Title: 中文")
    assert r1searcher.validate(in_docs).ok


def test_stage1_retrieve_needs_at_least_one_retrieval() -> None:
    no_search = " ok </think>\n\n<answer> x </answer>"
    assert not r1searcher.stage1_retrieve_ok(no_search)
    assert r1searcher.stage1_format_ok(no_search)
    assert r1searcher.validate(no_search).ok  # stage 2 only needs equal counts (zero is fine)


def test_query_cleaning_and_docs_format() -> None:
    assert r1searcher.extract_query('a <|begin_of_query|> "Ed   Wood"\n film<|end_of_query|>') == "Ed Wood film"
    assert r1searcher.extract_query("no query") is None
    proto = r1searcher.R1SearcherProtocol()
    assert proto.top_k == 3 and proto.max_turns == 9
    assert proto.format_docs([]) == "None"
    hits = [Hit(id="1", title="A", text="x", score=1.0), Hit(id="2", title="B", text="y", score=0.5)]
    assert proto.format_docs(hits) == "(1)Title: A Text: x\n(2)Title: B Text: y\n"
    assert r1searcher.R1SearcherProtocol(template="base").build_prompt("Q?").endswith("User:Q?\nAssistant: <think>")
