"""A verl agent loop that drives our tag protocols (``<search>``, ``<|begin_of_query|>``...) against our retriever.

Checked on CPU against verl 0.9.1's ``AgentLoopBase`` (``verl/experimental/agent_loop``) in ``.venv-verl``
(``tests/training/rl/test_verl_env.py``: the loop runs through verl's class with :class:`OpenAIServerManager` in
place of verl's Ray-managed vLLM replicas, which need GPUs); the GPU path itself is unverified. verl's built-in
``tool_agent`` speaks the chat template's function-calling format; the seeds use text tags, so this loop runs the same
``SearchProtocol`` objects as our rollout engine:

* each step generates token-in/token-out through verl's server manager with the per-turn budget, then cuts the text
  at the protocol's stop string client-side (the server may skip detokenization, so no server-side stop strings);
* the protocol parses the step; a query goes to our retriever service (``retrieval.client.RetrieverClient``);
  the protocol inserts the documents;
* the loop's ``extra_fields`` carry ``finished`` (EOS reached) and ``n_searches``: verl's reward loop merges them
  into ``extra_info``, so ReSearch's over-length rule (no EOS -> 0) holds on this path too;
* the finished response is tokenized once with span tracking (``training.agent.rollout.token_mask``): generated tokens
  get ``response_mask`` 1, inserted documents 0, so retrieved text is excluded from the policy loss.

verl instantiates it through ``agent_loop_config_path`` (see ``training.rl.verl.launch``): the YAML entry's extra
keys (protocol, top_k, max_turns, template, retriever_url, max_tokens_per_turn) arrive as keyword arguments of
:func:`make_tag_agent_loop`, which builds the subclass lazily so importing this module does not need verl.
SmartSearch's stage 3 subclasses it (``training.smartsearch.verl_loop``: judge verdicts, refinement branches).
"""

from __future__ import annotations

from typing import Any

AGENT_NAME = "searchloop_tags"
_CLASS: type | None = None


def agent_loop_entry(protocol: str, top_k: int, max_turns: int | None, template: str, retriever_url: str,
                     max_tokens_per_turn: int | None,
                     target: str = "training.rl.verl.agent_loop.make_tag_agent_loop") -> dict[str, Any]:
    """The ``agent_loop_config_path`` YAML entry registering this loop under :data:`AGENT_NAME` (``target``: the
    hydra ``_target_``, e.g. SmartSearch's subclass in ``training.smartsearch.verl_loop``)."""
    return {"name": AGENT_NAME, "_target_": target, "protocol": protocol,
            "top_k": top_k, "max_turns": max_turns, "template": template, "retriever_url": retriever_url,
            "max_tokens_per_turn": max_tokens_per_turn}


def _completion(token_ids: list[int], tokenizer: Any, stops: tuple[str, ...], budget: int) -> Any:
    """Our ``Completion`` from raw generated ids: EOS ends it, the first stop string cuts it (tokens trimmed)."""
    from training.generation.base import Completion, cut_at_stop

    eos = tokenizer.eos_token_id
    end = token_ids.index(eos) if eos in token_ids else len(token_ids)
    ids = token_ids[:end]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    cut, stop = cut_at_stop(text, list(stops))
    if stop is not None:
        n = len(ids)
        while n > 1 and stop in tokenizer.decode(ids[: n - 1], skip_special_tokens=False):
            n -= 1
        return Completion(text=cut, token_ids=ids[:n], finish_reason="stop", stop=stop)
    reason = "eos" if end < len(token_ids) else ("length" if len(ids) >= budget else "eos")
    return Completion(text=text, token_ids=ids, finish_reason=reason)


def step_completion(token_ids: list[int], tokenizer: Any, stops: tuple[str, ...], budget: int,
                    keep_eos: bool) -> Any:
    """One generation step's ``Completion`` as the protocol receives it: :func:`_completion`, then, for protocols
    that keep the EOS (``keep_eos``), the EOS appended to the text *and* its sampled id to the ids (as the rollout
    engine does), so ``token_mask`` trains on the sampled ids of the final step instead of re-tokenizing its text
    (the ids would no longer decode to the text with the EOS text added but not its id)."""
    comp = _completion(token_ids, tokenizer, stops, budget)
    if comp.finish_reason == "eos" and keep_eos and tokenizer.eos_token:
        comp.text += tokenizer.eos_token
        if tokenizer.eos_token_id is not None:
            comp.token_ids = [*comp.token_ids, tokenizer.eos_token_id]
    return comp


class OpenAIServerManager:
    """verl's ``server_manager.generate`` (token ids in, ``TokenOutput``-shaped ids out) over any OpenAI-compatible
    ``/v1/completions`` server: ours or ``vllm serve``. On a GPU cluster verl supplies its own manager; this one lets
    the agent loop run through verl's interface where no Ray-managed replica can start (CPU)."""

    def __init__(self, base_url: str, model: str, tokenizer: Any, api_key: str | None = None) -> None:
        from training.generation.openai_client import OpenAICompatibleGenerator

        self.tokenizer = tokenizer
        self.client = OpenAICompatibleGenerator(base_url, model, api_key=api_key, tokenizer=tokenizer)

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **_: Any) -> Any:
        """Generate for one prompt; returns an object with ``token_ids`` and ``log_probs`` (EOS kept, as verl)."""
        import asyncio
        from types import SimpleNamespace

        from training.generation.base import SamplingParams

        sp = SamplingParams(temperature=float(sampling_params.get("temperature", 1.0)),
                            top_p=float(sampling_params.get("top_p", 1.0)),
                            max_tokens=int(sampling_params["max_tokens"]), logprobs=True)
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        comp = (await asyncio.to_thread(self.client.generate, [text], sp))[0]
        ids = list(comp.token_ids)
        if comp.finish_reason == "eos" and self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)  # verl's servers return the EOS id; _completion cuts it
        return SimpleNamespace(token_ids=ids, log_probs=comp.token_logprobs, stop_reason="completed")


def loop_extra_fields(state: Any, truncated: bool) -> dict[str, Any]:
    """What the reward needs beyond the decoded text (verl decodes without special tokens, so EOS is invisible):
    ``finished`` (the last step ended on EOS and nothing was cut: ReSearch's over-length rule) and ``n_searches``.
    verl's reward loop merges these ``extra_fields`` into the reward function's ``extra_info``."""
    last = state.turns[-1].finish_reason if state.turns else None
    return {"finished": bool(last == "eos" and not truncated), "n_searches": int(state.n_searches)}


def _make_class() -> type:
    import asyncio
    from uuid import uuid4

    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

    from evaluation.benchmarks import Question
    from retrieval.client import RetrieverClient
    from training.agent.rollout import prompt_token_ids, token_mask
    from training.protocols.base import load_protocol
    from training.rewards.adapters import golds_from_ground_truth

    class TagSearchAgentLoop(AgentLoopBase):
        """Multi-turn tag-protocol search loop (see the module docstring)."""

        def __init__(self, *args: Any, protocol: str, top_k: int, max_turns: int | None, template: str,
                     retriever_url: str, max_tokens_per_turn: int | None, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            super().__init__(*args, **kwargs)
            self.protocol = load_protocol(protocol, top_k=top_k, max_turns=max_turns, template=template)
            self.searcher = RetrieverClient(retriever_url)
            self.response_length = self.config.actor_rollout_ref.rollout.response_length
            self.per_turn = (max_tokens_per_turn or self.protocol.default_max_tokens_per_turn
                             or self.response_length)

        def question(self, kwargs: dict[str, Any]) -> Any:
            """Our ``Question`` from verl's dataset fields (``extra_info`` and ``reward_model.ground_truth``)."""
            info = dict(kwargs.get("extra_info") or {})
            golds = golds_from_ground_truth((kwargs.get("reward_model") or {}).get("ground_truth", []))
            return Question(id=str(info.get("id", info.get("index", ""))), question=str(info.get("question", "")),
                            golden_answers=golds)

        async def _step(self, state: Any, sampling_params: dict[str, Any], used: int) -> int:
            text = self.protocol.generation_prompt(state)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            budget = max(1, min(self.per_turn, self.response_length - used))
            out = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=ids,
                                                     sampling_params={**sampling_params, "max_tokens": budget})
            comp = step_completion(list(out.token_ids), self.tokenizer, self.protocol.stop_strings(state), budget,
                                   self.protocol.keep_eos)
            await self._apply(state, comp)
            return used + len(comp.token_ids)

        async def _apply(self, state: Any, comp: Any) -> None:
            """Hand a completion to the protocol; run its query against the retriever and insert the documents."""
            query = self.protocol.on_completion(state, comp)
            if query is not None:
                loop = asyncio.get_running_loop()
                hits = await loop.run_in_executor(None, self.searcher.search, [query], self.protocol.top_k)
                self.protocol.on_results(state, query, hits[0] if hits else [])

        async def _generate(self, state: Any, sampling_params: dict[str, Any], used: int = 0) -> None:
            while not state.finished and used < self.response_length:
                used = await self._step(state, sampling_params, used)

        def _output(self, state: Any, extra: dict[str, Any] | None = None) -> Any:
            """verl's output: response ids and loss mask rebuilt from the state's segments (``token_mask``)."""
            resp_ids, mask, _ = token_mask(self.tokenizer, state.prompt, state.segments)
            prompt_ids = prompt_token_ids(self.tokenizer, state.prompt)
            n = self.response_length
            return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=resp_ids[:n], response_mask=mask[:n],
                                   num_turns=len(state.turns) * 2, metrics={},
                                   extra_fields={**loop_extra_fields(state, len(resp_ids) > n), **(extra or {})})

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            state = self.protocol.start(self.question(kwargs), self.tokenizer)
            await self._generate(state, sampling_params)
            return self._output(state)

    return TagSearchAgentLoop


def tag_agent_loop_class() -> type:
    """The verl agent loop class (built once; needs verl): subclass it to change ``run``."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_class()
    return _CLASS


def make_tag_agent_loop(*args: Any, **kwargs: Any) -> Any:
    """hydra ``_target_``: build (once) and instantiate the verl agent loop class."""
    return tag_agent_loop_class()(*args, **kwargs)
