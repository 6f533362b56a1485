"""SmartSearch protocol (RUC-NLPIR/SmartSearch): the ReSearch instruct template with a ``<think>`` generation prefix,
results inserted as ``<result>result: \\n{docs}\\n</result>\\n``, at most 5 turns, each step capped at
min(4096, remaining budget).

The seed's rollout builds ``ret_str = f"result: \\n{result}\\n"``, returns ``ret_str.strip()`` and inserts
``f"<result>{response}\\n</result>\\n"``: one newline before ``</result>``; an empty result gives
``<result>\\n</result>\\n``. Its generation steps ask vLLM for ``min(4096, remaining)`` tokens.

- Prompt: the ReSearch system prompt (the seed's ``re_call_template_sys`` is essentially the same text; it keeps
  exactly three ``<think>`` so the seed's reward finds the response at the fourth) through the chat template, and
  the generation prefix ``<think>`` appended after the assistant header.
- Stop on ``</search>``; only the last well-formed ``<search>...</search>`` of the step is executed, and only when
  the step's ``<search>``/``</search>`` tags pair up in order (otherwise the trajectory ends, as in the seed).
- ``validate`` is the ReSearch-style check applied to the response *including* the prompt's opening ``<think>``
  (the seed's reward slices the text at the fourth ``<think>``), plus the ``</search<`` rule (score forced to 0).
- ``extract_answer``: the content of the last ``\\boxed{}`` anywhere in the response.
- On the last allowed pass a requested search is not executed (the seed executes it but never continues).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from training.protocols.base import WARMUP_OPENING, AgentState, FormatCheck, Script, boxed_answer, last_boxed
from training.protocols.research import SYSTEM_TEMPLATE, ReSearchProtocol, _research_reasons

if TYPE_CHECKING:
    from retrieval.types import Hit
    from training.generation.base import Completion

GENERATION_PREFIX = "<think>"
BAD_SEARCH_TAG = "</search<"


def tags_pair_in_order(text: str) -> bool:
    """The seed's tool-call validity: equal ``<search>``/``</search>`` counts, each opening before its closing."""
    starts = [m.start() for m in re.finditer("<search>", text)]
    ends = [m.start() for m in re.finditer("</search>", text)]
    return len(starts) == len(ends) and all(s < e for s, e in zip(starts, ends, strict=True))


def extract_query(text: str) -> str | None:
    """The last ``<search>...</search>`` of a step (stripped) when the step's tags pair up; else None."""
    if not tags_pair_in_order(text):
        return None
    matches = re.findall(r"<search>((?:(?!</search>).)*)</search>", text, re.DOTALL)
    return matches[-1].strip() if matches else None


def extract_answer(response: str) -> str | None:
    """Content of the last ``\\boxed{}`` in the response; None when absent."""
    return last_boxed(response)


def validate(response: str, prefixed: bool = False) -> FormatCheck:
    """SmartSearch's format check: the ReSearch rules plus the ``</search<`` rule.

    Args:
        response: the generated response after the prompt.
        prefixed: True when ``response`` already starts with the prompt's ``<think>`` (the seed's slice).
    """
    text = response if prefixed else GENERATION_PREFIX + response
    reasons = _research_reasons(text)
    if BAD_SEARCH_TAG in text:
        reasons.append("invalid search tag </search< found")
    return FormatCheck.from_reasons(reasons)


class SmartSearchProtocol(ReSearchProtocol):
    """SmartSearch: ReSearch tags, ``result:`` blocks, five turns."""

    name = "smartsearch"
    default_top_k = 5
    default_max_turns = 5
    default_max_tokens_per_turn = 4096  # the seed: max_tokens = min(4096, remaining response budget)
    system_template = SYSTEM_TEMPLATE

    def build_prompt(self, question: str, tokenizer: Any | None = None) -> str:
        """ReSearch prompt (instruct or base) followed by the ``<think>`` generation prefix."""
        return super().build_prompt(question, tokenizer) + GENERATION_PREFIX

    def on_completion(self, state: AgentState, completion: Completion) -> str | None:
        """Search when the step stopped on ``</search>`` with well-paired tags; otherwise the trajectory ends."""
        final = self.last_pass(state)
        self._record(state, completion, completion.text)
        state.n_passes += 1
        if completion.finish_reason == "stop" and completion.stop == "</search>":
            query = extract_query(completion.text)
            if query is not None and not final:
                return query
            state.finish("max_turns" if query is not None else "eos")
            return None
        if completion.finish_reason == "length":
            state.finish("length")
        else:
            state.finish("answer" if self.extract_answer(state.response) is not None else "eos")
        return None

    def result_text(self, query: str, hits: list[Hit]) -> str:
        """``<result>result: \\n{docs}\\n</result>\\n``; an empty result gives ``<result>\\n</result>\\n``."""
        docs = self.format_docs(hits).strip()
        body = f"result: \n{docs}" if docs else ""
        return f"<result>{body}\n</result>\n"

    # The module's pure functions are the protocol's parsers and validator (importable without an instance).
    extract_query = staticmethod(extract_query)
    extract_answer = staticmethod(extract_answer)
    validate = staticmethod(validate)

    def warmup_script(self, queries: list[str], facts: list[str], answer: str) -> Script:
        """As ReSearch's, but the prompt already opens ``<think>``: the first step continues it."""
        out: Script = []
        for i, q in enumerate(queries):
            head = f"<think> {facts[i - 1]} </think>" if i else f" {WARMUP_OPENING} </think>"
            out.append((f"{head}\n<search> {q} </search>", "</search>", "stop"))
        head = f"<think> {facts[-1]} </think>" if queries else f" {facts[-1] if facts else WARMUP_OPENING} </think>"
        return [*out, (f"{head}\n{boxed_answer(answer)}", None, "eos")]
