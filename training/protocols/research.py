"""ReSearch protocol (Agent-RL/ReSearch, branch ``re-search``): ``<think>``, ``<search>``, ``<result>``, ``<answer>``
with ``\\boxed{}``.

- Prompt: a base-model template ("User: {question}. Assistant:" framing) or the instruct system template sent
  through the tokenizer's chat template (the question is the user message). Both are paraphrased from the seed.
- Generation stops on ``</search>``; the query is the text between the last ``<search>`` and ``</search>`` of the
  step. Documents are the passages' ``contents`` joined by blank lines, inserted as `` <result>\\n{docs}\\n</result>``.
  An empty query gets the result text ``nothing to search`` (the seed's evaluation pipeline).
- No turn limit (only the token budget), as in the seed.
- ``validate`` is the seed reward's format check; ``extract_answer`` the content of the last ``\\boxed{}`` inside the
  first ``<answer>...</answer>``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from training.protocols.base import (
    WARMUP_OPENING,
    AgentState,
    FormatCheck,
    Script,
    SearchProtocol,
    boxed_answer,
    chat_prompt,
    last_between,
    last_boxed,
)

if TYPE_CHECKING:
    from retrieval.types import Hit
    from training.generation.base import Completion

SEARCH_STOP = "</search>"
EMPTY_QUERY_RESULT = "nothing to search"

_INSTRUCTIONS = (
    "The reasoning process and the answer go inside <think> </think> and <answer> </answer> tags, and a search "
    "query and its result go inside <search> </search> and <result> </result> tags. For example, <think> reasoning "
    "goes here. </think> <search> search query here </search> <result> search result here </result> <think> more "
    "reasoning goes here. </think> <answer> The final answer is \\[ \\boxed{answer here} \\] </answer>. "
    "At the end of the answer, put the exact final answer inside \\boxed{} in LaTeX format."
)

SYSTEM_TEMPLATE = (
    "You are a helpful assistant who solves the given question step by step, using a Wikipedia search tool when it "
    "helps. For a question, first reason about it in your mind and then give the answer. While reasoning you may "
    "call the Wikipedia search tool to look up facts about specific topics. " + _INSTRUCTIONS
)

BASE_TEMPLATE = (
    "This is a conversation between User and Assistant. The User asks a question and the Assistant solves it. "
    "The Assistant first reasons about the problem in its mind and then gives the User the answer. While "
    "reasoning, the Assistant may call a Wikipedia search tool to look up facts about specific topics. "
    + _INSTRUCTIONS + " User: {question}. Assistant:"
)


def extract_query(text: str) -> str | None:
    """The text between the last ``<search>`` and the last ``</search>`` (stripped); None when absent."""
    return last_between(text, "<search>", SEARCH_STOP)


def extract_answer(response: str) -> str | None:
    """Content of the last ``\\boxed{}`` inside the first ``<answer>...</answer>``; None when either is missing."""
    match = re.search(r"<answer>(.*?)</answer>", response.strip(), re.DOTALL)
    if not match:
        return None
    return last_boxed(match.group(1))


def validate(response: str) -> FormatCheck:
    """The ReSearch reward's format check (first failing rule is reported, as the seed does).

    Rules: ``<think>``/``</think>`` counts equal and at least one; exactly one ``<answer>`` and one ``</answer>``;
    every ``<search>`` followed in order by ``</search>``, ``<result>``, ``</result>``; ``\\boxed{`` and ``}`` in
    the answer. ``response`` is the text after the assistant marker (``Assistant:`` or the chat template's).
    """
    return FormatCheck.from_reasons(_research_reasons(response))


def _research_reasons(text: str) -> list[str]:
    if text.count("<think>") != text.count("</think>"):
        return ["<think> </think> not paired"]
    if text.count("<think>") == 0:
        return ["<think> or </think> not found"]
    if text.count("<answer>") != 1 or text.count("</answer>") != 1:
        return ["<answer> or </answer> not found (exactly one pair required)"]
    pos = 0
    while True:
        search_pos = text.find("<search>", pos)
        if search_pos == -1:
            break
        result_pos = text.find("<result>", search_pos)
        search_end = text.find("</search>", search_pos)
        result_end = text.find("</result>", result_pos) if result_pos != -1 else -1
        if -1 in (result_pos, search_end, result_end):
            return ["search/result tags are incomplete"]
        if not search_pos < search_end < result_pos < result_end:
            return ["search/result tags are nested in the wrong order"]
        pos = result_end
    start, end = text.find("<answer>"), text.find("</answer>")
    if start > end:
        return ["<answer> must be before </answer>"]
    content = text[start:end]
    if "\\boxed{" not in content or "}" not in content:
        return ["answer is missing \\boxed{} format"]
    return []


class ReSearchProtocol(SearchProtocol):
    """ReSearch: one growing completion, stop on ``</search>``, results inserted after it."""

    name = "research"
    stop = (SEARCH_STOP,)
    results_marker = "<result>"
    default_max_tokens_per_turn = None  # the seed has no per-step cap: one 8,192-token budget for the response
    default_top_k = 5
    default_max_turns = None
    system_template = SYSTEM_TEMPLATE
    base_template = BASE_TEMPLATE

    def build_prompt(self, question: str, tokenizer: Any | None = None) -> str:
        """Instruct: system template + question through the chat template; base: the plain template."""
        if self.template == "base":
            return self.base_template.replace("{question}", question)
        return chat_prompt(tokenizer, self.system_template, question)

    def on_completion(self, state: AgentState, completion: Completion) -> str | None:
        """Stop on ``</search>`` -> search (unless this was the last pass); EOS/other stop -> done; length -> done."""
        final = self.last_pass(state)
        self._record(state, completion, completion.text)
        state.n_passes += 1
        if completion.finish_reason == "stop" and completion.stop == SEARCH_STOP:
            if final:
                state.finish("max_turns")
                return None
            return extract_query(completion.text) or ""
        if completion.finish_reason == "length":
            state.finish("length")
        else:
            state.finish("answer" if self.extract_answer(state.response) is not None else "eos")
        return None

    def format_docs(self, hits: list[Hit]) -> str:
        """Passage contents joined by blank lines (the seed's ``batch_search``)."""
        return "\n\n".join(h.contents for h in hits).strip()

    def result_text(self, query: str, hits: list[Hit]) -> str:
        """The inserted text for one search."""
        docs = self.format_docs(hits) if query else EMPTY_QUERY_RESULT
        return f" <result>\n{docs}\n</result>"

    def on_results(self, state: AgentState, query: str, hits: list[Hit]) -> None:
        """Insert the result block; an empty query inserts ``nothing to search``."""
        state.n_searches += 1
        self._insert(state, self.result_text(query, hits), query, hits)

    def warmup_script(self, queries: list[str], facts: list[str], answer: str) -> Script:
        """``<think> fact </think>\n<search> q </search>`` per step, then the boxed answer (ends with EOS)."""
        out: Script = []
        for i, q in enumerate(queries):
            think = facts[i - 1] if i else WARMUP_OPENING
            out.append((f"{' ' if i else ''}<think> {think} </think>\n<search> {q} </search>", "</search>", "stop"))
        last = facts[-1] if facts else WARMUP_OPENING
        return [*out, (f"{' ' if queries else ''}<think> {last} </think>\n{boxed_answer(answer)}", None, "eos")]

    # The module's pure functions are the protocol's parsers and validator (importable without an instance).
    extract_query = staticmethod(extract_query)
    extract_answer = staticmethod(extract_answer)
    validate = staticmethod(validate)
