"""Search-R1 protocol (PeterGriffinJin/Search-R1): ``<think>``, ``<search>``, ``<information>``, ``<answer>``.

- Prompt: the seed's instruction + question (paraphrased) as the user message through the chat template, or
  plain text for base models.
- Each step stops at ``</search>`` or ``</answer>``. The action is the *first* ``<search>`` or ``<answer>`` pair of
  the step: an answer ends the trajectory, a search inserts
  ``\\n\\n<information>Doc 1(Title: ...) text\\nDoc 2(...) ...</information>\\n\\n``, anything else inserts the
  invalid-action feedback and generation continues.
- ``max_turns`` (default 4) action steps, then one final step in which searches are not executed.
- ``validate`` is ``qa_em_format.is_valid_sequence`` (the think -> search -> information -> ... -> answer state
  machine, applied to the response after the assistant marker); ``extract_answer`` the last ``<answer>`` content.
  The seed's reward requires two ``<answer>`` matches in prompt+response because its prompt holds one example;
  on the response alone one match is enough.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from training.protocols.base import WARMUP_OPENING, AgentState, FormatCheck, Script, SearchProtocol, chat_prompt

if TYPE_CHECKING:
    from retrieval.types import Hit
    from training.generation.base import Completion

INSTRUCTION = (
    "Answer the given question. Every time you get new information, first reason inside <think> and </think>. "
    "If after reasoning you find you are missing some knowledge, call the search engine with <search> query "
    "</search>; it returns the top results between <information> and </information>. You may search as often as "
    "you like. When no more outside knowledge is needed, give the answer directly inside <answer> and </answer>, "
    "without detailed explanations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

INVALID_ACTION_FEEDBACK = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)

_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_TAG = re.compile(r"(</?(?:think|search|information|answer)>)")

_TRANSITIONS = {
    ("<think>", "start"): "in_think",
    ("<think>", "information"): "in_think",
    ("</think>", "in_think"): "after_think",
    ("<search>", "after_think"): "in_search",
    ("</search>", "in_search"): "after_search",
    ("<information>", "after_search"): "in_information",
    ("</information>", "in_information"): "information",
    ("<answer>", "after_think"): "in_answer",
    ("</answer>", "in_answer"): "end",
}
_INSIDE = {"in_think", "in_search", "in_information", "in_answer"}
_BETWEEN = {"start", "after_think", "after_search", "information"}


def parse_action(text: str) -> tuple[str | None, str]:
    """The first ``<search>``/``<answer>`` pair of a step: (action, stripped content), or (None, "")."""
    match = _ACTION.search(text)
    if not match:
        return None, ""
    return match.group(1), match.group(2).strip()


def extract_query(text: str) -> str | None:
    """The query of a step whose first action is a search; None otherwise."""
    action, content = parse_action(text)
    return content if action == "search" else None


def extract_answer(response: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` (stripped); None when there is none."""
    matches = re.findall(r"<answer>(.*?)</answer>", response, re.DOTALL)
    return matches[-1].strip() if matches else None


def validate(response: str) -> FormatCheck:
    """Search-R1's ``is_valid_sequence`` on the response (text after the assistant marker)."""
    for tag in ("think", "search", "information", "answer"):
        opening, closing = response.count(f"<{tag}>"), response.count(f"</{tag}>")
        if opening != closing:
            return FormatCheck.from_reasons([f"Mismatch in {tag} tags: {opening} opening vs {closing} closing tags"])
    state = "start"
    for part in _TAG.split(response):
        if not part.strip():
            continue
        if _TAG.fullmatch(part):
            nxt = _TRANSITIONS.get((part, state))
            if nxt is None:
                return FormatCheck.from_reasons([f"Unexpected tag {part} in state {state}"])
            state = nxt
        elif state in _BETWEEN:
            return FormatCheck.from_reasons([f"Unexpected content {part.strip()[:80]!r} between tags (state: {state})"])
        elif state not in _INSIDE:
            return FormatCheck.from_reasons([f"Unexpected content in state {state}"])
    if state != "end":
        return FormatCheck.from_reasons([f"Incomplete sequence, ended in state {state}"])
    return FormatCheck(ok=True)


class SearchR1Protocol(SearchProtocol):
    """Search-R1: action steps with invalid-action feedback, then a final step without search."""

    name = "searchr1"
    stop = ("</search>", "</answer>")
    results_marker = "<information>"
    default_top_k = 3
    default_max_turns = 4
    keep_eos = False
    search_empty_queries = True

    def build_prompt(self, question: str, tokenizer: Any | None = None) -> str:
        """The instruction + question as the user message (instruct) or as plain text (base)."""
        text = INSTRUCTION.format(question=question.strip())
        if self.template == "base":
            return text
        return chat_prompt(tokenizer, None, text)

    def last_pass(self, state: AgentState) -> bool:
        """The step after ``max_turns`` action steps is the final one (searches not executed)."""
        return self.max_turns is not None and state.n_passes >= self.max_turns

    def on_completion(self, state: AgentState, completion: Completion) -> str | None:
        """Answer -> done; search -> query (unless final step); otherwise invalid-action feedback."""
        final = self.last_pass(state)
        self._record(state, completion, completion.text)
        state.n_passes += 1
        action, content = parse_action(completion.text)
        if action == "answer":
            state.finish("answer")
            return None
        if final:
            state.finish("max_turns")
            return None
        if action == "search":
            return content
        self._insert(state, INVALID_ACTION_FEEDBACK)
        return None

    def format_docs(self, hits: list[Hit]) -> str:
        """``Doc i(Title: {title}) {text}`` lines, title = first line of the passage contents."""
        lines = []
        for i, hit in enumerate(hits, 1):
            title, _, text = hit.contents.partition("\n")
            lines.append(f"Doc {i}(Title: {title}) {text}\n")
        return "".join(lines)

    def on_results(self, state: AgentState, query: str, hits: list[Hit]) -> None:
        """Insert the ``<information>`` block."""
        state.n_searches += 1
        self._insert(state, f"\n\n<information>{self.format_docs(hits).strip()}</information>\n\n", query, hits)

    # The module's pure functions are the protocol's parsers and validator (importable without an instance).
    extract_query = staticmethod(extract_query)
    extract_answer = staticmethod(extract_answer)
    validate = staticmethod(validate)

    def search_limit(self, max_turns: int) -> int:
        """Search-R1 counts actions: every turn may search (the answer comes after the last search's results)."""
        return max_turns

    def warmup_script(self, queries: list[str], facts: list[str], answer: str) -> Script:
        """``<think> fact </think>\n<search> q </search>`` per step, then ``<answer> a </answer>``."""
        out: Script = [(f"<think> {facts[i - 1] if i else WARMUP_OPENING} </think>\n<search> {q} </search>",
                        "</search>", "stop") for i, q in enumerate(queries)]
        last = facts[-1] if facts else WARMUP_OPENING
        return [*out, (f"<think> {last} </think>\n<answer> {answer} </answer>", "</answer>", "stop")]
