"""SmartSearch stage 3 on verl, the parts that run without verl: the reward adapter reading the agent loop's judge
verdicts, the group coordinator (leader election, prefix cycling, on-policy fill, cleanup) under plain asyncio, the
leader's refine-and-keep step, and the rendered agent-loop YAML (judge settings present, no secret).
The loop itself through verl's ``AgentLoopBase`` is in ``test_verl_env.py``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from training.rewards.adapters import compute_score_smartsearch
from training.rewards.smartsearch import smartsearch_reward
from training.smartsearch.groups import GroupCoordinator, group_key

RESPONSE = (" I should look it up. </think>\n<search> who directed ed wood </search>\n<result>\nEd Wood is a film."
            "\n\nTim Burton directed it.\n</result>\n<think> Check the year. </think>\n<search> ed wood year "
            "</search>\n<result>\nThe film came out in 1994.\n</result>\n<think> Done. </think>\n<answer> The "
            "director is \\boxed{Tim Burton} </answer>")


def _score(response: str, golds: list[str], **info: object) -> dict[str, float]:
    return compute_score_smartsearch("musique", response, {"target": golds}, extra_info=info)


def test_reward_counts_judge_verdicts_from_extra_info() -> None:
    right, wrong = ["Tim Burton"], ["Orson Welles"]
    plain = _score(RESPONSE, right)
    assert plain["bad_rounds"] == 0 and plain["good_rounds"] == 2  # redundancy rule only: no repeats
    assert plain["score"] == pytest.approx(smartsearch_reward(RESPONSE, right).score)
    one_bad = _score(RESPONSE, right, round_useful=[1, 0], max_redundancy=1)
    assert one_bad["bad_rounds"] == 1 and one_bad["judge_failed"] == 0
    assert one_bad["score"] == pytest.approx(plain["score"] - 0.1)  # correct: 1 - 0.1 * bad
    all_bad = _score(RESPONSE, right, round_useful=[0, 0])
    assert all_bad["score"] == pytest.approx(plain["score"] - 0.2)
    # wrong answer: min(0.1 * good, 0.3); a failed verdict (None) counts good, as the seed's failed PRM call
    assert _score(RESPONSE, wrong, round_useful=[1, 1])["process"] == pytest.approx(0.2)
    assert _score(RESPONSE, wrong, round_useful=[1, 0])["process"] == pytest.approx(0.1)
    failed = _score(RESPONSE, wrong, round_useful=[None, 0])
    assert failed["process"] == pytest.approx(0.1) and failed["judge_failed"] == 1
    # a verdict list that does not align with the rounds is ignored (redundancy only), as the seed does
    assert _score(RESPONSE, right, round_useful=[0])["score"] == pytest.approx(plain["score"])


def test_reward_redundancy_still_counts_with_verdicts() -> None:
    docs = "\nA.\n\nB.\n\nC.\n"
    text = (f" x </think>\n<search> a </search>\n<result>{docs}</result>\n<think> y </think>\n<search> b </search>"
            f"\n<result>{docs}</result>\n<think> z </think>\n<answer> \\boxed{{Tim Burton}} </answer>")
    assert _score(text, ["Tim Burton"], round_useful=[1, 1])["bad_rounds"] == 1  # 3 repeats > 1
    assert _score(text, ["Tim Burton"], round_useful=[1, 1], max_redundancy=3)["bad_rounds"] == 0


def test_coordinator_pairs_each_branch_with_its_own_leader_and_cleans_up() -> None:
    """The seed's group mix on verl: even ranks sample on-policy, rank 2k + 1 continues leader 2k's FIRST kept
    prefix, so n = 8 gives 4 on-policy samples and up to 4 branches, each from a different on-policy sample."""
    async def main() -> tuple[list[object], int, int]:
        coord = GroupCoordinator()
        members = [coord.join("g") for _ in range(8)]
        assert [m.leader for m in members] == [True, False] * 4
        assert all(coord.has_follower(m) for m in members[::2])
        waiting = [asyncio.create_task(coord.prefix_for(m)) for m in members[1::2]]
        await asyncio.sleep(0)
        assert not any(t.done() for t in waiting)  # followers wait for their leader
        for k, leader in enumerate(members[::2]):
            coord.publish(leader, [f"p{k}-first", f"p{k}-second"] if k != 2 else [])
        got = await asyncio.gather(*waiting)
        return got, len(coord), coord.join("g").rank

    got, left, rank_after = asyncio.run(main())
    assert got == ["p0-first", "p1-first", None, "p3-first"]  # leader 2 kept nothing: its follower is on-policy
    assert left == 0 and rank_after == 0  # the group is dropped; the same key later starts a new group


def test_coordinator_separates_groups_and_odd_sizes() -> None:
    async def main() -> tuple[list[object], list[object], int, bool]:
        coord = GroupCoordinator()
        a = [coord.join("a") for _ in range(3)]
        b = [coord.join("b") for _ in range(2)]
        tasks_a = [asyncio.create_task(coord.prefix_for(a[1]))]
        tasks_b = [asyncio.create_task(coord.prefix_for(b[1]))]
        lone = coord.has_follower(a[2])  # the last copy of an odd group has nobody to branch for it
        coord.publish(b[0], ["b-prefix"])
        coord.publish(a[0], [])  # nothing kept (or the leader failed): its follower samples on-policy
        coord.publish(a[0], ["late"])  # idempotent: a second publish changes nothing
        coord.publish(a[2], [])
        return await asyncio.gather(*tasks_a), await asyncio.gather(*tasks_b), len(coord), lone

    got_a, got_b, left, lone = asyncio.run(main())
    assert got_a == [None] and got_b == ["b-prefix"] and left == 0 and lone is False


def test_coordinator_single_copy_and_roles() -> None:
    async def main() -> int:
        coord = GroupCoordinator()
        solo = coord.join("s")
        coord.publish(solo, ["unused"])
        with pytest.raises(ValueError, match="leader"):
            await coord.prefix_for(solo)
        follower = coord.join("t")
        follower = coord.join("t")
        with pytest.raises(ValueError, match="leader"):
            coord.publish(follower, [])
        return len(coord)

    assert asyncio.run(main()) == 1  # "s" dropped at once; "t" waits for its leader


def test_group_key_prefers_uid() -> None:
    info = {"index": 3, "id": "q3"}
    assert group_key({"uid": "u-1", "extra_info": info}) == ("uid", "u-1")
    assert group_key({"extra_info": info}) == group_key({"extra_info": dict(info)}) != group_key(
        {"extra_info": {"index": 4, "id": "q3"}})


def test_keep_refined_skips_long_prefixes_and_failed_refinements() -> None:
    from types import SimpleNamespace

    from training.protocols.base import TurnState
    from training.smartsearch.config import RefinerSpec
    from training.smartsearch.endpoint import Reply
    from training.smartsearch.judge import RoundVerdict
    from training.smartsearch.refine import keep_refined

    class Tok:  # one token per whitespace-separated word
        def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
            return {"input_ids": list(range(len(text.split())))}

    class Refiner:
        def complete(self, prompts: list[str], *args: object, **kwargs: object) -> list[Reply]:
            return [Reply("<search> better query </search>"), Reply("no tag"),
                    Reply("<search> " + "very " * 80 + "long </search>")][: len(prompts)]

    def turn(q: str) -> TurnState:
        return TurnState(generated=f"<think> t </think>\n<search> {q} </search>", query=q, doc_ids=[], doc_texts=[],
                         scores=[], inserted="\n<result>\ndoc\n</result>\n", finish_reason="stop", stop="</search>",
                         tokens=5)

    traj = SimpleNamespace(question_id="q", question="Q?", golden_answers=["A"], dataset="d", sample=0, prompt="P",
                           turns=[turn("a"), turn("b"), turn("c")])
    verdicts = [RoundVerdict(question_id="q", round=i, verdict=0, low_quality=True) for i in range(3)]
    kept, counts, refinements = keep_refined(Refiner(), RefinerSpec(), traj, verdicts, Tok(), max_length_diff=50)
    assert counts == {"refined": 2, "refine_failed": 1, "skipped_length": 1, "kept": 1}
    assert [p.round for p in kept] == [0] and "better query" in kept[0].step and len(refinements) == 3


def test_stage3_agent_loop_yaml_carries_judge_settings_without_secrets(tmp_path, monkeypatch) -> None:
    from infra.config import load_config
    from training.rl.verl.config import parse_overrides
    from training.smartsearch.config import SmartSearchConfig
    from training.smartsearch.grpo import render_verl_command

    monkeypatch.setenv("JUDGE_TOKEN", "sekrit-token-123")
    cfg = load_config(SmartSearchConfig, "smartsearch_paper", [
        "stage3.questions=[{path: data/train/musique_train_mini.jsonl, limit: 4}]", "endpoint.api_key_env=JUDGE_TOKEN",
        "stage3.max_length_diff=40"])
    cmd = render_verl_command(cfg, "Qwen/Qwen2.5-3B-Instruct", tmp_path)
    overrides = parse_overrides(cmd[3:])
    loop_yaml = overrides["actor_rollout_ref.rollout.agent.agent_loop_config_path"]
    [entry] = yaml.safe_load(Path(loop_yaml).read_text())
    assert entry["name"] == overrides["actor_rollout_ref.rollout.agent.default_agent_loop"] == "searchloop_tags"
    assert entry["_target_"] == "training.smartsearch.verl_loop.make_smartsearch_agent_loop"
    ss = entry["smartsearch"]
    assert ss["endpoint"]["base_url"] == "http://127.0.0.1:9001/v1" and ss["endpoint"]["model"] == "Qwen/Qwen3-32B"
    assert ss["endpoint"]["api_key_env"] == "JUDGE_TOKEN" and ss["judge"]["max_tokens"] == 2048
    assert (ss["branch"], ss["judge_reward"], ss["max_length_diff"]) == (True, True, 40)
    assert ss["refiner"]["temperature"] == 0.6 and entry["max_turns"] == 5 and entry["top_k"] == 5
    for f in tmp_path.rglob("*"):
        if f.is_file() and f.suffix in {".yaml", ".txt", ".json"}:
            assert "sekrit-token-123" not in f.read_text(), f
    with pytest.raises(Exception, match="base_url"):
        render_verl_command(load_config(SmartSearchConfig, "smartsearch_paper", [
            "stage3.questions=[{path: data/train/musique_train_mini.jsonl, limit: 4}]", "endpoint.base_url=null",
            "endpoint.serve_model=smollm2"]), "m", tmp_path / "x")


def test_verl_loop_trains_on_the_sampled_ids_of_the_final_eos_step(smol_tokenizer) -> None:
    """verl's agent loop (shared by SmartSearch's stage 3) appended the EOS to the final step's text but not its id,
    so the step's sampled ids no longer decoded to its text and ``token_mask`` re-tokenized it from text: the policy
    was trained on ids it never sampled. Sampled ids that are not the canonical tokenization show it."""
    from evaluation.benchmarks import Question
    from training.agent.rollout import token_mask
    from training.protocols.base import load_protocol
    from training.rl.verl.agent_loop import step_completion

    tok = smol_tokenizer
    a, b = "<think> ok </think> <answer> \\boxed{Tim Bur", "ton} </answer>"
    sampled = tok(a, add_special_tokens=False)["input_ids"] + tok(b, add_special_tokens=False)["input_ids"]
    assert sampled != tok(a + b, add_special_tokens=False)["input_ids"]  # not what re-tokenizing gives
    protocol = load_protocol("smartsearch", top_k=1, max_turns=2, template="instruct")
    state = protocol.start(Question(id="q", question="Who directed Ed Wood?", golden_answers=["Tim Burton"]), tok)
    comp = step_completion([*sampled, tok.eos_token_id], tok, protocol.stop_strings(state), 64, protocol.keep_eos)
    assert comp.finish_reason == "eos" and comp.text == a + b + tok.eos_token
    protocol.on_completion(state, comp)
    ids, mask, retokenized = token_mask(tok, state.prompt, state.segments)
    assert retokenized == 0 and ids == [*sampled, tok.eos_token_id] and all(mask)
