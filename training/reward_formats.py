"""Reward-side format checks of the seeds (what each seed's reward code validates before scoring an answer).

Each returns a :class:`FormatCheck` (``ok`` plus every reason found) or a list of violations, and reproduces the
seed's own check exactly, including its blind spots (e.g. ReSearch only checks that ``\\boxed{`` and ``}`` occur
inside the answer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class FormatCheck:
    """Outcome of a format validation: ``ok`` and the reasons it failed (empty when ok)."""

    ok: bool
    reasons: list[str] = field(default_factory=list)


def _search_result_order(text: str) -> str | None:
    pos = 0
    while (search := text.find("<search>", pos)) != -1:
        result = text.find("<result>", search)
        search_end = text.find("</search>", search)
        result_end = text.find("</result>", result)
        if -1 in (result, search_end, result_end):
            return "search/result tags are incomplete"
        if not search < search_end < result < result_end:
            return "search/result tags are in the wrong order"
        pos = result_end
    return None


def research_format(text: str) -> FormatCheck:
    """ReSearch ``validate_format`` (also SmartSearch's ``validate_template_format``); first failure only.

    Checks, in order: ``<think>``/``</think>`` counts equal and >= 1; exactly one ``<answer>`` and ``</answer>``;
    every ``<search>`` followed in order by ``</search>``, ``<result>``, ``</result>``; ``<answer>`` before
    ``</answer>``; the answer contains ``\\boxed{`` and ``}``.
    """
    if text.count("<think>") != text.count("</think>"):
        return FormatCheck(False, ["<think> </think> not paired"])
    if text.count("<think>") == 0:
        return FormatCheck(False, ["<think> or </think> not found"])
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return FormatCheck(False, ["<answer> or </answer> not found exactly once"])
    problem = _search_result_order(text)
    if problem:
        return FormatCheck(False, [problem])
    start, end = text.find("<answer>"), text.find("</answer>")
    if start > end:
        return FormatCheck(False, ["<answer> must be before </answer>"])
    content = text[start:end]
    if "\\boxed{" not in content or "}" not in content:
        return FormatCheck(False, ["answer is missing \\boxed{} format"])
    return FormatCheck(True)


R1_TAGS = (
    "<|begin_of_documents|>\n",
    "<|end_of_documents|>\n\n",
    "<|begin_of_query|>",
    "<|end_of_query|>",
    "<|begin_of_documents|>",
    "<|end_of_documents|>",
    "<|begin_of_documents|>\n(1)",
)


def r1searcher_tag_counts(text: str) -> dict[str, int]:
    """The seven query/document tag counts R1-Searcher compares."""
    return {tag: text.count(tag) for tag in R1_TAGS}


def r1searcher_think_answer_ok(text: str) -> bool:
    """No ``<think>`` (the prompt opened it) and exactly one ``</think>``, ``<answer>`` and ``</answer>``."""
    closing = text.count("</think>")
    return text.count("<think>") == 0 and closing == text.count("<answer>") == text.count("</answer>") == 1


def _has_cjk_outside_documents(text: str) -> bool:
    outside = re.sub(r"<\|begin_of_documents\|>.*?<\|end_of_documents\|>", "", text, flags=re.DOTALL)
    return any("\u4e00" <= ch <= "\u9fff" for ch in outside)


def r1searcher_format_violations(text: str, style: Literal["qwen", "llama"] = "qwen") -> list[str]:
    """R1-Searcher stage-2 format violations (empty list = none).

    Qwen (``reward_server_qwen_zero.py``): unequal query/document tag counts; "Assistant"/"assistant" in the
    text; not (0 ``<think>`` and 1 ``</think>``); not exactly one ``<answer>`` and ``</answer>``; a query or
    documents tag inside the answer; an answer longer than 10 words; a CJK character outside document blocks.
    Llama (``reward_server_llama_stage2.py``): tag counts; the think/answer counts together; CJK.
    """
    out = []
    if len(set(r1searcher_tag_counts(text).values())) != 1:
        out.append("query/document tag counts differ")
    if style == "qwen":
        if "Assistant" in text or "assistant" in text:
            out.append("'Assistant' appears in the response")
        if not (text.count("<think>") == 0 and text.count("</think>") == 1):
            out.append("expected no <think> and one </think>")
        if not (text.count("<answer>") == text.count("</answer>") == 1):
            out.append("expected exactly one <answer> and one </answer>")
        answer = text.split("<answer>")[-1].split("</answer>")[0].strip()
        if "begin_of_query" in answer or "begin_of_documents" in answer:
            out.append("query or documents tag inside the answer")
        if len(answer.split()) > 10:
            out.append("answer longer than 10 words")
    elif not r1searcher_think_answer_ok(text):
        out.append("expected no <think> and one </think>, <answer>, </answer>")
    if _has_cjk_outside_documents(text):
        out.append("CJK character outside the documents")
    return out


_SR1_TAG = re.compile(r"(</?(?:think|search|information|answer)>)")
_SR1_NEXT = {
    ("start", "<think>"): "in_think",
    ("information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}


def searchr1_sequence(text: str, require_assistant_marker: bool = False) -> FormatCheck:
    """Search-R1 ``is_valid_sequence``: balanced tags and the order think -> (search -> information -> think)* ->
    answer, with only whitespace between tags.

    The seed scores prompt + response and validates what follows ``<|im_start|>assistant``; when that marker is
    present here the same happens, otherwise the whole text is taken as the response (unless
    ``require_assistant_marker``).
    """
    marker = re.search(r"<\|im_start\|>assistant\s*", text)
    if marker:
        text = text[marker.end() :]
    elif require_assistant_marker:
        return FormatCheck(False, ["missing assistant marker"])
    for tag in ("think", "search", "information", "answer"):
        opened, closed = len(re.findall(f"<{tag}>", text)), len(re.findall(f"</{tag}>", text))
        if opened != closed:
            return FormatCheck(False, [f"mismatch in {tag} tags: {opened} opening vs {closed} closing"])
    state = "start"
    for part in _SR1_TAG.split(text):
        if not part.strip():
            continue
        if _SR1_TAG.fullmatch(part):
            nxt = _SR1_NEXT.get((state, part))
            if nxt is None:
                return FormatCheck(False, [f"unexpected tag {part} in state {state}"])
            state = nxt
        elif state in ("start", "after_think", "after_search", "information", "end"):
            return FormatCheck(False, [f"unexpected content {part.strip()[:40]!r} between tags (state {state})"])
    if state != "end":
        return FormatCheck(False, [f"incomplete sequence, ended in state {state}"])
    return FormatCheck(True)
