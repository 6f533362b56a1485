"""R1-Searcher protocol (RUCAIBox/R1-Searcher): ``<|begin_of_query|>...<|end_of_query|>`` searches,
``<|begin_of_documents|>`` numbered documents, ``<think>``-prefixed generation, at most 8 retrievals, top-3.

- Prompt: the seed's system prompt (paraphrased) through the chat template, or the base "User:...\\nAssistant:"
  text; both end with a literal ``<think>`` after the generation prompt.
- Each pass stops on ``<|end_of_query|>`` (and on ``</answer>``, as the seed's evaluation does). The query is the
  text after the last ``<|begin_of_query|>``, quotes removed and whitespace collapsed; an empty query ends the
  trajectory. Documents are inserted as ``\\n\\n<|begin_of_documents|>\\n(1)doc\\n(2)doc\\n<|end_of_documents|>\\n\\n``
  (``None`` when nothing was found). The 9th pass is final, so at most 8 retrievals.
- The seed corpus lines read ``Title: {title} Text: {text}``; documents are rendered that way.
- ``validate`` is the stage-2 Qwen reward's violation check; ``format_violations(response, style)`` gives the
  Qwen or Llama list; ``stage1_retrieve_ok`` / ``stage1_format_ok`` are the stage-1 bonus conditions.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from training.protocols.base import WARMUP_OPENING, AgentState, FormatCheck, Script, SearchProtocol, chat_prompt

if TYPE_CHECKING:
    from retrieval.types import Hit
    from training.generation.base import Completion

BEGIN_QUERY = "<|begin_of_query|>"
END_QUERY = "<|end_of_query|>"
BEGIN_DOCS = "<|begin_of_documents|>"
END_DOCS = "<|end_of_documents|>"

_FORMAT = (
    'The reasoning and the final answer go inside <think> </think> and <answer> </answer> tags, i.e., "<think> '
    'reasoning process here </think>\n\n<answer> final answer here </answer>".\n'
)
_SEARCH = (
    'format "<|begin_of_query|> search query (keywords only, e.g. **"keyword_1 keyword_2 ..."**)<|end_of_query|>". '
    "**Each query must cover a single triple**.\n"
)

SYSTEM_PROMPT = (
    "You are a helpful assistant.\nGiven a question, answer it by first reasoning in your mind and then giving "
    "the final answer.\n" + _FORMAT + "While reasoning, **you may search for knowledge you are unsure of** with the "
    + _SEARCH + 'The search system then gives you the retrieved information in the format "<|begin_of_documents|> '
    '...search results... <|end_of_documents|>".'
)

BASE_PROMPT = (
    "The User asks a question and the Assistant solves it.\nThe Assistant first reasons in its mind and then "
    "gives the User the final answer.\n" + _FORMAT + "While reasoning, **the Assistant may search** for knowledge "
    "it is unsure of with the " + _SEARCH + "The search system then gives the Assistant the retrieved information "
    'in the format "<|begin_of_documents|> ...search results... <|end_of_documents|>".\n\nUser:{question}\n'
    "Assistant: <think>"
)

_CJK = re.compile("[\u4e00-\u9fff]")
_DOC_BLOCK = re.compile(re.escape(BEGIN_DOCS) + ".*?" + re.escape(END_DOCS), re.DOTALL)


def extract_query(text: str) -> str | None:
    """Query after the last ``<|begin_of_query|>`` (quotes removed, whitespace collapsed); None without the tag."""
    if BEGIN_QUERY not in text:
        return None
    query = text.split(BEGIN_QUERY)[-1].split(END_QUERY)[0].replace('"', "")
    return " ".join(query.split())


def extract_answer(response: str) -> str | None:
    """``response.split('<answer>')[-1].split('</answer>')[0]`` (stripped) when both tags are present, else None."""
    if "<answer>" not in response or "</answer>" not in response:
        return None
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


def _tag_counts_equal(text: str, at_least_one: bool = False) -> bool:
    counts = {
        text.count(BEGIN_DOCS + "\n"),
        text.count(END_DOCS + "\n\n"),
        text.count(BEGIN_QUERY),
        text.count(END_QUERY),
        text.count(BEGIN_DOCS),
        text.count(END_DOCS),
        text.count(BEGIN_DOCS + "\n(1)"),
    }
    return len(counts) == 1 and (not at_least_one or counts.pop() >= 1)


def format_violations(response: str, style: Literal["qwen", "llama"] = "qwen") -> list[str]:
    """The stage-2 reward's format violations (any one costs -2 for Qwen, -1 for Llama).

    ``response`` is the text after the prompt's ``<think>``; the seed appends the EOS token first, which changes
    none of the counts.
    """
    out = []
    if not _tag_counts_equal(response):
        out.append("query/document tag counts differ")
    answer_ok = response.count("<answer>") == 1 and response.count("</answer>") == 1
    if style == "qwen":
        if "Assistant" in response or "assistant" in response:
            out.append("'Assistant' appears in the solution")
        if not (response.count("<think>") == 0 and response.count("</think>") == 1):
            out.append("think structure: need 0 <think> and 1 </think>")
        if not answer_ok:
            out.append("need exactly one <answer> and one </answer>")
        answer = response.split("<answer>")[-1].split("</answer>")[0].strip()
        if "begin_of_query" in answer or "begin_of_documents" in answer:
            out.append("answer contains a query or documents tag")
        if len(answer.split()) > 10:
            out.append("answer longer than 10 words")
    elif not (response.count("<think>") == 0 and response.count("</think>") == 1 and answer_ok):
        out.append("need 0 <think>, 1 </think>, 1 <answer> and 1 </answer>")
    if _CJK.search(_DOC_BLOCK.sub("", response)):
        out.append("CJK characters outside document blocks")
    return out


def validate(response: str) -> FormatCheck:
    """Stage-2 Qwen check: ok when :func:`format_violations` (qwen) is empty."""
    return FormatCheck.from_reasons(format_violations(response, "qwen"))


def stage1_retrieve_ok(response: str) -> bool:
    """Stage-1 retrieve bonus (+0.5): the seven query/document tag counts are equal and at least one."""
    return _tag_counts_equal(response, at_least_one=True)


def stage1_format_ok(response: str) -> bool:
    """Stage-1 format bonus (+0.5): no ``<think>`` and exactly one ``</think>``, ``<answer>`` and ``</answer>``."""
    return (
        response.count("<think>") == 0
        and response.count("</think>") == 1
        and response.count("<answer>") == 1
        and response.count("</answer>") == 1
    )


class R1SearcherProtocol(SearchProtocol):
    """R1-Searcher: query/document special-tag protocol, at most 8 retrievals (9 passes)."""

    name = "r1searcher"
    normalization = "r1searcher"  # the seed's own answer rule (evaluation.metrics)
    judge_prompt = "r1searcher"  # metric_calc_gpt_as_judge.py's True/False prompt (evaluation.judge)
    stop = (END_QUERY, "</answer>")
    results_marker = BEGIN_DOCS
    default_top_k = 3
    default_max_turns = 9

    def build_prompt(self, question: str, tokenizer: Any | None = None) -> str:
        """System prompt + question through the chat template + ``<think>`` (instruct) or the base text."""
        if self.template == "base":
            return BASE_PROMPT.format(question=question)
        return chat_prompt(tokenizer, SYSTEM_PROMPT, question) + "<think>"

    def on_completion(self, state: AgentState, completion: Completion) -> str | None:
        """Query stop with a non-empty query -> search (not on the final pass); anything else ends it."""
        final = self.last_pass(state)
        self._record(state, completion, completion.text)
        state.n_passes += 1
        if completion.finish_reason == "stop" and completion.stop == END_QUERY:
            query = extract_query(completion.text)
            if query and not final:
                return query
            state.finish("max_turns" if query else "eos")
            return None
        if completion.finish_reason == "length":
            state.finish("length")
        else:
            state.finish("answer" if extract_answer(state.response) is not None else "eos")
        return None

    def format_docs(self, hits: list[Hit]) -> str:
        """``(j)Title: {title} Text: {text}\\n`` per document; ``None`` when there are none."""
        if not hits:
            return "None"
        return "".join(f"({j})Title: {h.title} Text: {h.text}\n" for j, h in enumerate(hits, 1))

    def on_results(self, state: AgentState, query: str, hits: list[Hit]) -> None:
        """Insert the documents block after the generated ``<|end_of_query|>``."""
        state.n_searches += 1
        self._insert(state, f"\n\n{BEGIN_DOCS}\n{self.format_docs(hits)}{END_DOCS}\n\n", query, hits)

    # The module's pure functions are the protocol's parsers and validator (importable without an instance).
    extract_query = staticmethod(extract_query)
    extract_answer = staticmethod(extract_answer)
    validate = staticmethod(validate)

    def warmup_script(self, queries: list[str], facts: list[str], answer: str) -> Script:
        """The fact, then ``<|begin_of_query|> q<|end_of_query|>`` per step; ``</think>`` and the answer last."""
        out: Script = [(f"{facts[i - 1] if i else ' ' + WARMUP_OPENING} {BEGIN_QUERY} {q}{END_QUERY}", END_QUERY,
                        "stop") for i, q in enumerate(queries)]
        last = (facts[-1] if queries else " " + facts[-1]) if facts else " " + WARMUP_OPENING
        return [*out, (f"{last} </think>\n\n<answer> {answer} </answer>", "</answer>", "stop")]
