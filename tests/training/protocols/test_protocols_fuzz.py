"""Property-based tests: on arbitrary text built from each protocol's tags (nested, unclosed, empty, huge),
parsers never crash and validators always return a FormatCheck."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training.protocols import exsearch, r1searcher, research, searchr1, smartsearch
from training.protocols.base import FormatCheck, last_boxed

TAGS = [
    "<think>", "</think>", "<search>", "</search>", "<result>", "</result>", "<answer>", "</answer>",
    "<information>", "</information>", "\\boxed{", "}", "{", "\\boxed ", "</search<", "<|begin_of_query|>",
    "<|end_of_query|>", "<|begin_of_documents|>\n", "<|end_of_documents|>\n\n", "(1)", "<QUERY>", "<SEARCH>",
    "<FACT>", "<FINAL>", "<|im_start|>assistant\n", "<|im_start|>user\n", "<|im_end|>", "\n", " ", "Assistant",
    "中", "end search.",
]
pieces = st.lists(st.one_of(st.sampled_from(TAGS), st.text(max_size=8)), max_size=60).map("".join)
MODULES = [research, searchr1, r1searcher, exsearch, smartsearch]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pieces)
def test_parsers_and_validators_never_crash(text: str) -> None:
    for module in MODULES:
        check = module.validate(text)
        assert isinstance(check, FormatCheck)
        assert check.ok == (not check.reasons)
        answer = module.extract_answer(text)
        assert answer is None or isinstance(answer, str)
        query = module.extract_query(text)
        assert query is None or isinstance(query, str)
    assert isinstance(r1searcher.format_violations(text, "llama"), list)
    assert isinstance(r1searcher.stage1_retrieve_ok(text), bool)
    last_boxed(text)


@settings(max_examples=10, deadline=None)
@given(st.integers(min_value=1, max_value=3), st.sampled_from(TAGS))
def test_huge_outputs(repeat_k: int, tag: str) -> None:
    text = (tag + "x" * 1000) * (40 * repeat_k)
    for module in MODULES:
        assert isinstance(module.validate(text), FormatCheck)
        module.extract_answer(text)
        module.extract_query(text)


@given(st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=40))
def test_well_formed_research_roundtrip(answer: str) -> None:
    inner = answer.replace("{", "").replace("}", "").replace("\\", "")
    response = f"<think> t </think> <answer> \\boxed{{{inner}}} </answer>"
    assert research.validate(response).ok
    assert research.extract_answer(response) == inner
