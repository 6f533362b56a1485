"""ExSearch parsing, message rendering and the message-structure validator."""

from __future__ import annotations

import pytest

from infra.errors import ConfigError
from training.protocols import exsearch

MESSAGES = [
    {"role": "user", "content": exsearch.PROMPT.format(task="Who?")},
    {"role": "assistant", "content": "<QUERY> Who directed Ed Wood?"},
    {"role": "user", "content": "<SEARCH> [0] Title: Ed Wood. Content: x"},
    {"role": "assistant", "content": "<FACT> Tim Burton\n<FINAL>"},
    {"role": "user", "content": exsearch.FINAL_SENTENCE.format(question="Who?")},
    {"role": "assistant", "content": "Tim Burton"},
]


def test_normalize_and_step_parsing() -> None:
    assert exsearch.normalize(" <FACT> 1> a <QUERY> ") == "a"
    assert exsearch.parse_step("<QUERY> q1 ", first=True) == (None, "q1")
    assert exsearch.parse_step("<FACT> f\n<QUERY> q2", first=False) == ("f", "q2")
    assert exsearch.parse_step("f line\nmore", first=False) == ("f line", None)  # needs a requery
    assert exsearch.extract_query("<FACT> f\n<QUERY> q<SEARCH>") == "q"
    assert exsearch.extract_query("none") is None


def test_message_structure_validator() -> None:
    assert exsearch.validate_messages(MESSAGES).ok
    bad = [dict(m) for m in MESSAGES]
    bad[1]["content"] = "Who directed?"
    bad[-1]["content"] = "<FACT> Tim"
    reasons = exsearch.validate_messages(bad).reasons
    assert any("step 1 must start with <QUERY>" in r for r in reasons)
    assert any("bare" in r for r in reasons)
    assert not exsearch.validate_messages(MESSAGES[:2]).ok


def test_rendered_segments_mark_assistant_contents(smol_tokenizer) -> None:
    prompt, segments = exsearch.render_segments(smol_tokenizer, MESSAGES)
    response = "".join(s.text for s in segments)
    full = smol_tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    assert prompt + response == full
    generated = [s.text for s in segments if s.generated]
    assert generated == ["<QUERY> Who directed Ed Wood?<|im_end|>", "<FACT> Tim Burton\n<FINAL><|im_end|>",
                         "Tim Burton<|im_end|>"]
    assert exsearch.validate(response).ok
    assert exsearch.extract_answer(response) == "Tim Burton"


def test_needs_a_chat_template() -> None:
    with pytest.raises(ConfigError, match="chat template"):
        exsearch.render_segments(None, MESSAGES)
