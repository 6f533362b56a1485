"""SmartSearch stage 3 on verl: the tag agent loop with the usefulness judge and refinement branches in the group.

A subclass of ``training.rl.verl.agent_loop``'s loop (verl 0.9.1 ``AgentLoopBase``), registered under the same agent
name through the YAML entry of :func:`smartsearch_loop_entry` (its ``smartsearch`` key: a :class:`LoopSpec`, the
judge/refiner endpoint settings, never a token: ``endpoint.api_key_env`` names the variable the workers read).

Per sample (verl runs every sample of a worker's chunk as its own task in one event loop, see
``training.smartsearch.groups``):

1. the copy joins its group (key: verl's per-prompt ``uid``, else ``extra_info`` index + id); even ranks are
   on-policy *leaders*; copy 2k + 1 waits for leader 2k and continues from its first kept prefix (the seed's group
   mix: about n/2 on-policy samples and up to n/2 branches, each from a different on-policy sample): the refined
   step (turns before the round kept, the query replaced, its result cut) is applied as the first
   "generation", its query runs against our retriever, then the policy continues through verl's server manager;
   with no kept prefix the copy samples on-policy;
2. when the trajectory ends it is judged (``UsefulnessJudge.judge_trajectories`` in a thread, off the event loop;
   verdicts cached per process by (question, prefix), so branches re-use their prefix's verdicts);
3. a leader with a follower refines its low-quality rounds (verdict 0 or redundancy > ``max_redundancy``), keeps
   the prefixes whose token length differs by less than ``max_length_diff`` from the original (the seed: 50) and
   publishes them (its follower takes the first); it publishes an empty list on any failure, so nobody hangs;
4. the response mask is rebuilt from the segments by ``token_mask`` (the refined step counts as generated, inserted
   documents are masked), as on the TRL path.

``extra_fields`` (merged by verl's reward loop into ``extra_info``): ``round_useful`` (1/0/None per round, when
``judge_reward``), ``judge_failed``, ``max_redundancy``, ``branch`` (1 = continued from a refined prefix),
``branch_round``, ``group_size``, and the leader's ``refined`` / ``refine_failed`` / ``skipped_length`` /
``kept_prefixes`` (0 on the other copies); ``training.rewards.adapters.compute_score_smartsearch`` scores with them.

Degradations (documented, not hidden):

* copies of one prompt that verl's ``AgentLoopManager`` chunks onto different workers (a chunk boundary inside a
  group: batch size * n not a multiple of the worker count times n) form one group per worker, each with its own
  leader/branch pairs; groups stay of size n for GRPO;
* a leader without a kept prefix leaves its follower to sample on-policy (the seed starts another round with a new
  on-policy sample that may branch in turn);
* ``judge.kind: rule`` on verl knows no supporting paragraphs (the workers get no gold document ids): only its
  gold-answer rule applies; ``refiner.kind: rule`` then falls back to the question as the refined query;
* validation rows (``extra_info.split`` other than ``train``) never branch: validation measures the policy;
* the judge sees the whole trajectory; verl truncates the response to ``response_length``: when that cuts rounds,
  the verdict list no longer aligns with the text and the reward ignores it (redundancy only), as the seed ignores a
  misaligned list.

Unverified on GPUs (verl's Ray workers with vLLM/SGLang replicas); checked on CPU through verl's ``AgentLoopBase``
with ``training.rl.verl.agent_loop.OpenAIServerManager`` (``tests/training/rl/test_verl_env.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

from training.rl.verl.agent_loop import agent_loop_entry, tag_agent_loop_class
from training.smartsearch.config import LoopSpec
from training.smartsearch.groups import GroupCoordinator, group_key

log = logging.getLogger(__name__)

TARGET = "training.smartsearch.verl_loop.make_smartsearch_agent_loop"
COORDINATOR = GroupCoordinator()
"""The process's groups (one verl ``AgentLoopWorker`` per process, one event loop)."""

_CLASS: type | None = None
_JUDGES: dict[str, tuple[Any, tuple[Any, Any]]] = {}
_JUDGES_LOCK = threading.Lock()


def smartsearch_loop_entry(protocol: str, top_k: int, max_turns: int | None, template: str, retriever_url: str,
                           max_tokens_per_turn: int | None, spec: LoopSpec) -> dict[str, Any]:
    """The agent-loop YAML entry: the tag loop's keys plus ``smartsearch`` (the :class:`LoopSpec`, no secrets)."""
    entry = agent_loop_entry(protocol, top_k, max_turns, template, retriever_url, max_tokens_per_turn, target=TARGET)
    return {**entry, "smartsearch": spec.model_dump(mode="json")}


def _plain(obj: Any) -> Any:
    """hydra hands nested YAML as ``DictConfig``/``ListConfig``: plain dicts and lists for pydantic."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or type(obj).__name__ == "ListConfig":
        return [_plain(v) for v in obj]
    return obj


def judge_pair(spec: LoopSpec) -> tuple[Any, tuple[Any, Any]]:
    """(judge, (client, refiner spec)), one per process and settings, so the verdict cache spans the samples."""
    key = spec.model_dump_json()
    with _JUDGES_LOCK:
        if key not in _JUDGES:
            from training.smartsearch.endpoint import EndpointClient
            from training.smartsearch.judge import make_judge

            client = EndpointClient(spec.endpoint) if spec.endpoint.base_url else None  # rule judge + refiner
            _JUDGES[key] = (make_judge(spec.judge, client), (client, spec.refiner))
        return _JUDGES[key]


def _make_class() -> type:
    from training.agent.rollout import to_record
    from training.generation.base import Completion
    from training.smartsearch.refine import PrefixedProtocol, keep_refined

    base = tag_agent_loop_class()

    class SmartSearchAgentLoop(base):  # type: ignore[misc, valid-type]
        """The tag loop with the judge and refinement branches (see the module docstring)."""

        def __init__(self, *args: Any, smartsearch: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.spec = LoopSpec.model_validate(_plain(smartsearch))
            self.judge, (self.client, self.refiner) = judge_pair(self.spec)

        async def _start_branch(self, state: Any, prefix: Any) -> int:
            """Apply a refined prefix's step (forced, counted as generated); returns the tokens it 'generated'."""
            ids = list(self.tokenizer(prefix.step, add_special_tokens=False)["input_ids"])
            await self._apply(state, Completion(text=prefix.step, token_ids=ids, finish_reason="stop",
                                                stop="</search>"))
            return prefix.generated_tokens + len(ids)

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            q = self.question(kwargs)
            split = str((kwargs.get("extra_info") or {}).get("split", "train"))
            member = COORDINATOR.join(group_key(kwargs)) if self.spec.branch and split == "train" else None
            extra: dict[str, Any] = {"branch": 0, "branch_round": -1, "group_size": 1, "refined": 0,
                                     "refine_failed": 0, "skipped_length": 0, "kept_prefixes": 0}
            published = False
            try:
                prefix = None
                if member is not None and not member.leader:
                    prefix = await COORDINATOR.prefix_for(member)
                rank = member.rank if member is not None else 0
                protocol = PrefixedProtocol(self.protocol, {(q.id, rank): prefix}) if prefix else self.protocol
                state = protocol.start(q, self.tokenizer, rank)
                used = 0
                if prefix is not None:
                    used = await self._start_branch(state, prefix)
                    extra |= {"branch": 1, "branch_round": prefix.round}
                await self._generate(state, sampling_params, used)
                traj = to_record(state, self.protocol, None, {})
                leader = member is not None and member.leader
                verdicts = []
                if self.spec.judge_reward or leader:
                    verdicts = (await asyncio.to_thread(self.judge.judge_trajectories, [traj]))[0]
                if leader:
                    extra["group_size"] = COORDINATOR.size(member)
                    if COORDINATOR.has_follower(member):
                        kept, counts, _ = await asyncio.to_thread(
                            keep_refined, self.client, self.refiner, traj, verdicts, self.tokenizer,
                            self.spec.max_length_diff, self.spec.judge.max_redundancy)
                        extra |= {"refined": counts["refined"], "refine_failed": counts["refine_failed"],
                                  "skipped_length": counts["skipped_length"], "kept_prefixes": len(kept)}
                        COORDINATOR.publish(member, kept)
                        published = True
                if self.spec.judge_reward:
                    extra |= {"round_useful": [v.verdict for v in verdicts],
                              "judge_failed": sum(v.verdict is None for v in verdicts),
                              "max_redundancy": self.spec.judge.max_redundancy}
            finally:
                if member is not None and member.leader and not published:
                    COORDINATOR.publish(member, [])
            return self._output(state, extra)

    return SmartSearchAgentLoop


def make_smartsearch_agent_loop(*args: Any, **kwargs: Any) -> Any:
    """hydra ``_target_``: build (once) and instantiate the SmartSearch verl agent loop."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_class()
    return _CLASS(*args, **kwargs)

