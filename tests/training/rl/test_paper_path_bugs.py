"""Paper-path bugs found by reading the never-run GPU code (bug 1, seeds, is in test_seeds.py):
2. ReSearch's over-length rule (no EOS -> 0) must hold on the verl path, where the text never shows EOS;
3. ReSearch's per-step cap is the whole response budget (the seed has no per-step cap), others keep 512;
4. verl rollout dumps count searches the protocol's way, not as ``<tool_response>``."""

from __future__ import annotations

import types

import orjson
import pytest

from training.agent.rollout import RolloutConfig, run_rollouts, step_cap
from training.protocols.base import load_protocol
from training.rewards import adapters as A

RS = "<think>t</think>\n<answer> so \\boxed{Paris} </answer>"


def test_verl_research_entry_reads_finished_from_extra_info() -> None:
    unfinished = A.compute_score_research("musique", RS, ["Paris"], {"finished": False})
    assert unfinished["score"] == 0.0 and unfinished["finished"] == 0.0  # over length
    finished = A.compute_score_research("musique", RS, ["Paris"], {"finished": True})
    assert finished["score"] == 1.0 and finished["finished"] == 1.0
    # the generic entry point too; other rewards ignore the flag
    assert A.compute_score("m", RS, ["Paris"], {"reward": "research", "finished": False})["score"] == 0.0
    sr1 = "<think>t</think>\n<answer> Paris </answer>"
    assert A.compute_score_searchr1_em("nq", sr1, ["Paris"], {"finished": False})["score"] == 1.0


def test_tag_agent_loop_reports_finished_and_searches() -> None:
    from training.rl.verl.agent_loop import loop_extra_fields

    def state(reason: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(turns=[types.SimpleNamespace(finish_reason=reason)], n_searches=2)

    assert loop_extra_fields(state("eos"), truncated=False) == {"finished": True, "n_searches": 2}
    assert loop_extra_fields(state("length"), truncated=False)["finished"] is False
    assert loop_extra_fields(state("eos"), truncated=True)["finished"] is False  # cut to response_length


@pytest.mark.parametrize(("protocol", "cap"), [("research", 8192), ("searchr1", 512), ("r1searcher", 512),
                                               ("smartsearch", 4096), ("exsearch", 512)])
def test_per_step_cap_defaults(protocol: str, cap: int) -> None:
    assert step_cap(RolloutConfig(max_total_tokens=8192), load_protocol(protocol)) == cap
    assert step_cap(RolloutConfig(max_total_tokens=8192, max_tokens_per_turn=64), load_protocol(protocol)) == 64


def test_research_rollout_asks_for_the_whole_budget_in_one_step(scripted, bm25, questions) -> None:
    gen = scripted("research")
    run_rollouts(questions[:1], "research", gen, bm25, RolloutConfig(max_total_tokens=8192))
    assert gen.samplings[0].max_tokens == 8192  # one 512-token step used to end the trajectory


def test_verl_config_leaves_the_step_cap_to_the_protocol() -> None:
    from training.rl.verl.config import VerlConfig

    assert VerlConfig().max_tokens_per_turn is None
    from training.rl.verl.agent_loop import agent_loop_entry

    assert agent_loop_entry("research", 5, None, "instruct", "http://127.0.0.1:8000", None)["max_tokens_per_turn"] \
        is None


DUMPS = {
    "research": "<think>a</think> <search> q1 </search> <result>\nd\n</result> <search> q2 </search> <result>\nd\n"
                "</result> <answer> \\boxed{x} </answer>",
    "searchr1": "<think>a</think>\n<search> q </search>\n\n<information>Doc 1</information>\n\n<answer> x </answer>",
    "r1searcher": "a <|begin_of_query|> q<|end_of_query|>\n\n<|begin_of_documents|>\n(1)d\n<|end_of_documents|>\n\n"
                  "<answer> x </answer>",
    "exsearch": "<QUERY> q1 <SEARCH><|im_end|>\n<|im_start|>user\n<SEARCH> [0] d<|im_end|>\n<|im_start|>assistant\n"
                "<FACT> f\n<QUERY> q2 <SEARCH><|im_end|>\n<|im_start|>user\n<SEARCH> [0] d<|im_end|>\n"
                "<|im_start|>assistant\n<FINAL> x<|im_end|>",
}
EXPECTED = {"research": 2, "searchr1": 1, "r1searcher": 1, "exsearch": 2}


@pytest.mark.parametrize("protocol", sorted(DUMPS))
def test_rollout_dump_counts_searches_per_protocol(tmp_path, protocol: str) -> None:
    from training.rl.verl.launch import convert_rollout_dumps

    rows = [{"input": "q", "output": DUMPS[protocol], "gts": ["x"], "score": 1.0, "step": 3, "finished": 0.0}]
    (tmp_path / "3.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows))
    (traj,) = convert_rollout_dumps(tmp_path, protocol)
    assert traj.n_searches == EXPECTED[protocol]
    assert traj.finish_reason == "length"  # the reward's finished column says no EOS
    tool = {"input": "q", "output": "<tool_call>{}</tool_call><tool_response>d</tool_response>", "step": 1}
    (tmp_path / "3.jsonl").write_bytes(orjson.dumps(tool))
    (traj,) = convert_rollout_dumps(tmp_path, protocol, agent_loop="tool_agent")
    assert traj.n_searches == 1 and traj.finish_reason == "eos"


def test_trl_per_step_cap_can_be_turned_off() -> None:
    """ReSearch's seed has no per-step cap; ``stage.trl.max_tokens_per_turn: null`` leaves the protocol's (none for
    ReSearch: the whole remaining budget per step)."""
    from training.rl.trl_engine import TRLSearchConfig

    tcfg = TRLSearchConfig(max_tokens_per_turn=None, max_completion_length=256)
    rollout = RolloutConfig(max_tokens_per_turn=tcfg.max_tokens_per_turn, max_total_tokens=tcfg.max_completion_length)
    assert step_cap(rollout, load_protocol("research")) == 256
