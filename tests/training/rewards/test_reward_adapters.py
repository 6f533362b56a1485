"""verl and TRL adapters around the seed rewards."""

from __future__ import annotations

import numpy as np
import pytest

from infra.errors import ConfigError, DataError
from training.rewards import adapters as A

RS = "<think>t</think>\n<answer> so \\boxed{Paris} </answer>"
SR1 = "<think>t</think>\n<answer> Paris </answer>"


def test_verl_compute_score_routes_by_extra_info_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    out = A.compute_score("musique", RS, np.array(["Paris"]), {"reward": "research"})
    assert out["score"] == 1.0 and out["f1"] == 1.0
    assert all(isinstance(v, float) for v in out.values())
    # Search-R1 style ground truth {"target": [...]}
    assert A.compute_score("nq", SR1, {"target": ["paris"]}, {"reward": "searchr1_em"})["score"] == 1.0
    monkeypatch.setenv("SEARCHLOOP_REWARD", "searchr1_format")
    assert A.compute_score("nq", SR1, ["London"], None)["score"] == 0.2  # valid format, wrong answer
    monkeypatch.delenv("SEARCHLOOP_REWARD")
    with pytest.raises(ConfigError, match="SEARCHLOOP_REWARD"):
        A.compute_score("nq", SR1, ["x"], {})
    with pytest.raises(ConfigError, match="unknown reward"):
        A.compute_score("nq", SR1, ["x"], {"reward": "nope"})


def test_verl_options_and_fixed_entry_points() -> None:
    # EOS required and missing -> 0 (over length)
    info = {"reward_options": {"eos_token": "<|im_end|>"}}
    assert A.compute_score_research("musique", RS, ["Paris"], info)["score"] == 0.0
    assert A.compute_score_research("musique", RS + "<|im_end|>", ["Paris"], info)["score"] == 1.0
    # SmartSearch: the prompt ends with the <think> generation prefix, which the reward prepends (as the seed's
    # slice at the 4th <think> includes it): outcome 1 (no rounds: max(1, .7)) + format .1 = 1.1
    smart = "plan</think><answer>\\boxed{Paris}</answer>"
    assert A.compute_score_smartsearch("m", smart, ["Paris"])["score"] == pytest.approx(1.1)
    # told the text already holds the prefix, "plan</think>" has an unpaired </think>: format fails -> 1.0
    info = {"reward_options": {"prefixed": True}}
    assert A.compute_score_smartsearch("m", smart, ["Paris"], info)["score"] == pytest.approx(1.0)
    # response_prefix is prepended for any reward
    assert A.compute_score_research("m", "t</think><answer>\\boxed{Paris}</answer>", ["Paris"],
                                    {"reward_options": {"response_prefix": "<think>"}})["score"] == 1.0
    assert A.compute_score_r1searcher_stage2_llama.__name__ == "compute_score_r1searcher_stage2_llama"
    with pytest.raises(ConfigError, match="bad options"):
        A.compute_score_research("m", RS, ["Paris"], {"reward_options": {"bogus": 1}})


def test_golds_from_ground_truth_shapes() -> None:
    assert A.golds_from_ground_truth("a") == ["a"]
    assert A.golds_from_ground_truth(np.array(["a", "b"])) == ["a", "b"]
    assert A.golds_from_ground_truth({"golden_answers": ["x"]}) == ["x"]
    assert A.golds_from_ground_truth(None) == []
    with pytest.raises(DataError):
        A.golds_from_ground_truth({"other": 1})


def test_trl_reward_func_text_and_messages() -> None:
    fn = A.trl_reward_func("research")
    assert fn.__name__ == "research_reward"
    completions = [RS, [{"role": "assistant", "content": RS}], "no format"]
    golds = [["Paris"], ["London"], ["Paris"]]
    # 1.0 (F1 1) ; 0.1 (good format, wrong) ; 0 (bad format)
    assert fn(prompts=["q"] * 3, completions=completions, golden_answers=golds) == [1.0, 0.1, 0.0]


def test_trl_reward_func_eos_from_completion_ids() -> None:
    fn = A.trl_reward_func("research", eos_token_id=2)
    scores = fn(prompts=["q", "q"], completions=[RS, RS], golden_answers=[["Paris"], ["Paris"]],
                completion_ids=[[5, 6, 2], [5, 6, 7]])
    assert scores == [1.0, 0.0]  # second was truncated (no EOS id)


def test_trl_reward_func_missing_column_names_columns() -> None:
    fn = A.trl_reward_func("searchr1_em", gold_column="answers")
    with pytest.raises(DataError, match="answers.*golden_answers"):
        fn(prompts=["q"], completions=[SR1], golden_answers=[["Paris"]])
    assert A.trl_reward_func("searchr1_em", gold_column="answers")(["q"], [SR1], answers=["Paris"]) == [1.0]
    with pytest.raises(ConfigError):
        A.trl_reward_func("nope")


def test_reward_options_reach_the_trl_reward_and_typos_are_refused() -> None:
    """A stage's reward_options (here the seed's retrieval_score knob) change the score TRL trains with; an option
    the score function does not take fails before training, naming the ones it takes."""
    hit = ("<think>x</think><search>q</search><information>Paris is the capital</information>"
           "<think>y</think><answer>Lyon</answer>")
    plain = A.trl_reward_func("searchr1_format")([""], [hit], golden_answers=[["Paris"]])
    shaped = A.trl_reward_func("searchr1_format", retrieval_score=0.1)([""], [hit], golden_answers=[["Paris"]])
    assert plain == [pytest.approx(0.2)] and shaped == [pytest.approx(0.3)]
    A.check_reward_options("searchr1_format", {"retrieval_score": 0.1})
    with pytest.raises(ConfigError, match=r"no option\(s\) \['retreival_score'\].*retrieval_score"):
        A.check_reward_options("searchr1_format", {"retreival_score": 0.1})


def test_reward_options_are_refused_on_verl() -> None:
    from flows.specs import resolve

    with pytest.raises(ConfigError, match="reward_options, which only engine=trl"):
        resolve("rl-finetune", "searchr1_grpo", ["stages.grpo.reward_options={retrieval_score: 0.1}"])


def test_a_reward_option_typo_fails_when_the_config_loads() -> None:
    """Caught by flows.specs.resolve (CLI --dry-run included), before any task runs."""
    from flows.specs import resolve

    assert resolve("rl-finetune", "searchr1_learn_cpu", []).stages[0].reward_options == {"retrieval_score": 0.1}
    with pytest.raises(ConfigError, match=r"no option\(s\) \['retreival_score'\]"):
        resolve("rl-finetune", "searchr1_learn_cpu", ["stages.grpo.reward_options={retreival_score: 0.1}"])
