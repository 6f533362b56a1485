"""ExSearch protocol (mangopy/SearchLM): a multi-turn chat of ``<QUERY>``, ``<SEARCH>``, ``<FACT>`` and ``<FINAL>``.

- Turn 1 (user): the agent instruction (paraphrased) ending with ``<USER QUERY> {question}\\nYour Output:``.
- Each step the assistant generates until ``<SEARCH>``; best-of-n by likelihood per step (the seed's vLLM
  ``best_of=8``) is the protocol default. Step 1's output is the query; later outputs are parsed as
  ``fact <QUERY> query``; when that fails the fact is the first line and the query is regenerated with a forced
  ``<FACT> {fact}\\n<QUERY>`` user turn (not kept in the trajectory). Texts are cleaned as the seed does.
- The assistant message is rebuilt as ``<QUERY> q`` / ``<FACT> f\\n<QUERY> q`` and the user turn is
  ``<SEARCH> [0] Title: t. Content: x\\n[1] ...`` (the newer seed shows the top 3 documents).
- An output with ``<FINAL>`` is kept as is and followed by the user turn ``<FINAL>\\n<SEARCH> end search. please
  give the final answer to the input question: {question}``; after ``max_turns`` searches that sentence is appended
  to the last user turn. The last assistant turn is the bare (cleaned) answer.
- Loss mask: assistant contents (and the template's end-of-turn token) are generated; user turns and chat-template
  headers are inserted. Spans come from rendering the messages with the tokenizer's chat template.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infra.errors import ConfigError
from training.protocols.base import AgentState, FormatCheck, Script, SearchProtocol, Segment

if TYPE_CHECKING:
    from retrieval.types import Hit
    from training.generation.base import Completion

QUERY_TOKEN, SEARCH_TOKEN, FACT_TOKEN, FINAL_TOKEN = "<QUERY>", "<SEARCH>", "<FACT>", "<FINAL>"
FINAL_SENTENCE = (
    FINAL_TOKEN + "\n" + SEARCH_TOKEN + " end search. please give the final answer to the input question: {question}"
)

PROMPT = (
    "You are an intelligent search agent that answers a question by simulating a question-answering process in "
    "which you actively look up information on Wikipedia.\n\nGiven an open-domain question, repeat these steps: "
    "(1) write a sub-query to search Wikipedia for; (2) pick the useful documents among the search results; "
    "(3) extract the supporting facts from the picked documents.\nYour output uses three special actions for these "
    f"steps:\n(1) {QUERY_TOKEN}: write a sub-query.\n(2) {SEARCH_TOKEN}: retrieve the documents for the sub-query "
    f"and read them carefully.\n(3) {FACT_TOKEN}: extract the answer to the sub-query from the documents.\n\n"
    f"The question is multi-hop, so interleave {QUERY_TOKEN}, {SEARCH_TOKEN} and {FACT_TOKEN} actions until you "
    f"reach the final answer, and finish your output with the special token {FINAL_TOKEN} followed by the final "
    "answer.\n\nThe task to complete:\n\n<USER QUERY> {task}\nYour Output:"
)

_NORMALIZE_DROP = [f"{i}>" for i in range(10)] + ["<Search", "<Reference", "<Keyword"]
_NORMALIZE_DROP += [QUERY_TOKEN, SEARCH_TOKEN, FACT_TOKEN, FINAL_TOKEN]


def normalize(text: str | None) -> str | None:
    """The seed's ``TextNormalization.normalize``: drop ``d>`` markers, annotation prefixes and action tokens."""
    if text is None:
        return None
    for token in _NORMALIZE_DROP:
        text = text.replace(token, "")
    return text.strip()


def parse_step(response: str, first: bool) -> tuple[str | None, str | None]:
    """(fact, query) of a step's output; query None when ``fact <QUERY> query`` does not parse (needs a requery)."""
    if first:
        return None, normalize(response)
    parts = response.split(QUERY_TOKEN)
    if len(parts) == 2:
        return normalize(parts[0]), normalize(parts[1])
    return normalize(response.split("\n")[0]), None


def extract_query(text: str) -> str | None:
    """The sub-query of an assistant step (text after the last ``<QUERY>``, cleaned); None without ``<QUERY>``."""
    if QUERY_TOKEN not in text:
        return None
    return normalize(text.split(QUERY_TOKEN)[-1].split(SEARCH_TOKEN)[0])


def split_chatml(text: str) -> list[dict[str, str]]:
    """Split ChatML text (``<|im_start|>role\\ncontent<|im_end|>``) into messages; an open last turn is kept."""
    messages = []
    for block in text.split("<|im_start|>")[1:]:
        role, _, content = block.partition("\n")
        messages.append({"role": role.strip(), "content": content.split("<|im_end|>")[0]})
    return messages


def validate_messages(messages: list[dict[str, str]]) -> FormatCheck:
    """ExSearch message structure: user prompt; assistant ``<QUERY>`` steps (later ``<FACT> ...\\n<QUERY>``);
    user ``<SEARCH>`` turns; an assistant ``<FINAL>`` step or the end-search sentence; the bare answer last."""
    reasons = []
    if len(messages) < 3 or messages[0]["role"] != "user":
        return FormatCheck.from_reasons(["need at least the user prompt, one step and an answer"])
    roles = [m["role"] for m in messages]
    if any(r != ("user" if i % 2 == 0 else "assistant") for i, r in enumerate(roles)):
        reasons.append(f"roles must alternate user/assistant starting with user, got {roles}")
    steps, users = messages[1:-1:2], messages[2::2]
    for i, step in enumerate(steps):
        c = step["content"].strip()
        if not (c.startswith(QUERY_TOKEN) if i == 0 else c.startswith(FACT_TOKEN)):
            reasons.append(f"assistant step {i + 1} must start with {QUERY_TOKEN if i == 0 else FACT_TOKEN}")
        if QUERY_TOKEN not in c and FINAL_TOKEN not in c:
            reasons.append(f"assistant step {i + 1} has neither {QUERY_TOKEN} nor {FINAL_TOKEN}")
    for i, user in enumerate(users):
        if not user["content"].lstrip().startswith((SEARCH_TOKEN, FINAL_TOKEN)):
            reasons.append(f"user turn {i + 2} must start with {SEARCH_TOKEN}")
    if not users or "end search. please give the final answer" not in users[-1]["content"]:
        reasons.append("the last user turn must carry the end-search sentence")
    answer = messages[-1]["content"]
    if messages[-1]["role"] != "assistant" or not answer.strip():
        reasons.append("the last turn must be the assistant's non-empty answer")
    elif any(t in answer for t in (QUERY_TOKEN, SEARCH_TOKEN, FACT_TOKEN, FINAL_TOKEN)):
        reasons.append("the answer must be bare (no action tokens)")
    return FormatCheck.from_reasons(reasons)


def validate(response: str) -> FormatCheck:
    """Validate a ChatML-rendered ExSearch conversation (prompt included or not) by its message structure."""
    messages = [m for m in split_chatml(response) if m["role"] != "system"]
    head = response.split("<|im_start|>")[0]
    if head.strip():
        messages.insert(0, {"role": "assistant", "content": head.split("<|im_end|>")[0]})
    if messages and messages[0]["role"] == "assistant":
        messages.insert(0, {"role": "user", "content": "<prompt>"})
    return validate_messages(messages)


def extract_answer(response: str) -> str | None:
    """The last assistant message of a ChatML-rendered conversation, cleaned; None without an end-search turn."""
    messages = split_chatml(response)
    if "<|im_start|>" not in response and response.strip():
        messages = [{"role": "assistant", "content": response.split("<|im_end|>")[0]}]
    if not messages or "end search." not in response or messages[-1]["role"] != "assistant":
        return None
    return normalize(messages[-1]["content"])


def render_segments(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, list[Segment]]:
    """Render ``messages`` with the chat template: (prompt text, response segments).

    The prompt is the first user turn plus the first generation header; each later assistant content (and the
    end-of-turn token that follows it) is a generated segment, everything else inserted. A trailing user turn gets
    the next generation header.

    Raises:
        ConfigError: when the tokenizer has no chat template or its rendering is not prefix-stable.
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ConfigError("the exsearch protocol needs a tokenizer with a chat template (it is a chat protocol)")

    def render(msgs: list[dict[str, str]], gen: bool) -> str:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    eos = getattr(tokenizer, "eos_token", None) or ""
    prompt = render(messages[:1], True)
    segments: list[Segment] = []
    done = render(messages[:1], False)
    for i in range(1, len(messages)):
        full = render(messages[: i + 1], False)
        if messages[i]["role"] == "assistant":
            head = render(messages[:i], True)
            content = messages[i]["content"]
            if not (head.startswith(done) and full.startswith(head + content)):
                raise ConfigError("chat template is not prefix-stable; exsearch masks need a ChatML-like template")
            tail = full[len(head) + len(content):]
            end = len(eos) if eos and tail.startswith(eos) else 0
            segments += [Segment(head[len(done):], False), Segment(content + tail[:end], True)]
            segments.append(Segment(tail[end:], False))
        else:
            if not full.startswith(done):
                raise ConfigError("chat template is not prefix-stable; exsearch masks need a ChatML-like template")
            segments.append(Segment(full[len(done):], False))
        done = full
    if messages[-1]["role"] == "user":
        segments.append(Segment(render(messages, True)[len(done):], False))
    first = render(messages[:1], False)
    header = prompt[len(first):]
    if not prompt.startswith(first) or not "".join(s.text for s in segments).startswith(header):
        raise ConfigError("chat template generation header is not a prefix of the assistant turn")
    return prompt, _drop_prefix([s for s in segments if s.text], len(header))


def _drop_prefix(segments: list[Segment], n: int) -> list[Segment]:
    out = []
    for s in segments:
        if n >= len(s.text):
            n -= len(s.text)
            continue
        out.append(Segment(s.text[n:], s.generated))
        n = 0
    return out


class ExSearchProtocol(SearchProtocol):
    """ExSearch chat protocol with per-step best-of-n by likelihood."""

    name = "exsearch"
    stop = (SEARCH_TOKEN,)
    results_marker = f"<|im_start|>user\n{SEARCH_TOKEN}"  # documents come back as a user turn

    def count_searches(self, response: str) -> int:
        """User turns that carry documents (the assistant's own ``<SEARCH>`` stop is not a search result)."""
        return sum(m["role"] == "user" and m["content"].lstrip().startswith(SEARCH_TOKEN)
                   for m in split_chatml(response))
    default_top_k = 3
    default_max_turns = 8
    default_best_of = 8
    keep_eos = False

    def build_prompt(self, question: str, tokenizer: Any | None = None) -> str:
        """The first user turn through the chat template, with the generation header."""
        return render_segments(tokenizer, [{"role": "user", "content": PROMPT.format(task=question)}])[0]

    def start(self, question: Any, tokenizer: Any | None = None, sample: int = 0) -> AgentState:
        """New state holding the chat messages and the tokenizer used to render them."""
        state = super().start(question, tokenizer, sample)
        state.extra.update(
            tokenizer=tokenizer, phase="step", fact=None,
            messages=[{"role": "user", "content": PROMPT.format(task=question.question)}],
        )
        return state

    def _sync(self, state: AgentState) -> None:
        state.prompt, state.segments = render_segments(state.extra["tokenizer"], state.extra["messages"])

    def generation_prompt(self, state: AgentState) -> str:
        """The rendered chat; in the requery phase with the forced ``<FACT> {fact}\\n<QUERY>`` user turn."""
        messages = state.extra["messages"]
        if state.extra["phase"] == "requery":
            messages = messages + [{"role": "user", "content": f"{FACT_TOKEN} {state.extra['fact']}\n{QUERY_TOKEN}"}]
        prompt, segments = render_segments(state.extra["tokenizer"], messages)
        return prompt + "".join(s.text for s in segments)

    def stop_strings(self, state: AgentState) -> tuple[str, ...]:
        """``<SEARCH>`` for steps; no stop string for the final answer."""
        return () if state.extra["phase"] == "answer" else self.stop

    def last_pass(self, state: AgentState) -> bool:
        """ExSearch counts searches, not passes: the answer follows the ``max_turns``-th search."""
        return False

    def on_completion(self, state: AgentState, completion: Completion) -> str | None:
        """Advance the step/requery/answer phases; return the sub-query to search."""
        text = completion.text
        for stop in self.stop:
            if completion.stop == stop and text.endswith(stop):
                text = text[: -len(stop)]
        state.n_passes += 1
        messages, phase = state.extra["messages"], state.extra["phase"]
        state.turns.append(self._turn(completion, text))
        if phase == "answer":
            state.extra["answer"] = normalize(text)
            messages.append({"role": "assistant", "content": state.extra["answer"]})
            state.finish("answer" if completion.finish_reason != "length" else "length")
        elif FINAL_TOKEN in text and phase == "step":
            messages.append({"role": "assistant", "content": text})
            messages.append({"role": "user", "content": FINAL_SENTENCE.format(question=state.question.question)})
            state.extra["phase"] = "answer"
        else:
            if phase == "requery":
                fact, query = state.extra["fact"], normalize(text)
            else:
                fact, query = parse_step(text, first=state.n_searches == 0)
            if query is None:
                state.extra.update(phase="requery", fact=fact)
            else:
                step = f"{FACT_TOKEN} {fact}\n{QUERY_TOKEN} {query}" if fact is not None else f"{QUERY_TOKEN} {query}"
                messages.append({"role": "assistant", "content": step})
                state.extra.update(phase="search", fact=None)
                self._sync(state)
                return query
        self._sync(state)
        return None

    def _turn(self, completion: Completion, text: str) -> Any:
        from training.protocols.base import TurnState

        return TurnState(generated=text, finish_reason=completion.finish_reason, stop=completion.stop,
                         tokens=len(completion.token_ids), logprob=completion.cumulative_logprob)

    def format_docs(self, hits: list[Hit]) -> str:
        """``[i] Title: {title}. Content: {text}`` lines (0-based labels, as the seed's data shows)."""
        return "\n".join(f"[{i}] Title: {h.title}. Content: {h.text}" for i, h in enumerate(hits))

    def on_results(self, state: AgentState, query: str, hits: list[Hit]) -> None:
        """Add the ``<SEARCH>`` user turn; after ``max_turns`` searches append the end-search sentence."""
        state.n_searches += 1
        content = f"{SEARCH_TOKEN} {self.format_docs(hits)}"
        if self.max_turns is not None and state.n_searches >= self.max_turns:
            content += "\n" + FINAL_SENTENCE.format(question=state.question.question)
            state.extra["phase"] = "answer"
        else:
            state.extra["phase"] = "step"
        state.extra["messages"].append({"role": "user", "content": content})
        turn = state.turns[-1]
        turn.query, turn.inserted = query, content
        turn.doc_ids, turn.doc_texts = [h.id for h in hits], [h.contents for h in hits]
        turn.scores = [h.score for h in hits]
        self._sync(state)

    def final_answer(self, state: AgentState) -> str | None:
        """The cleaned last assistant message."""
        return state.extra.get("answer")

    def warmup_script(self, queries: list[str], facts: list[str], answer: str) -> Script:
        """``<Fact> f`` / ``<Query> q<Search>`` per step, the final-answer token, then the answer turn."""
        out: Script = []
        for i, q in enumerate(queries):
            head = f"{FACT_TOKEN} {facts[i - 1]}\n" if i else ""
            out.append((f"{head}{QUERY_TOKEN} {q}{SEARCH_TOKEN}", SEARCH_TOKEN, "stop"))
        final = f"{FACT_TOKEN} {facts[-1]}\n{FINAL_TOKEN}" if facts else FINAL_TOKEN
        return [*out, (final, None, "eos"), (answer, None, "eos")]

    # The module's pure functions are the protocol's parsers and validator (importable without an instance).
    extract_query = staticmethod(extract_query)
    extract_answer = staticmethod(extract_answer)
    validate = staticmethod(validate)
