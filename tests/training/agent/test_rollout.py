"""The batched rollout engine: one generate batch and one retriever call per step, turn limits, budgets,
empty queries, n samples, records; and live rollouts with the real SmolLM2 model against a real retriever."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from training_fakes import CountingSearcher

from infra import artifacts
from training.agent.records import read_trajectories, write_trajectories
from training.agent.rollout import RolloutConfig, run_rollouts
from training.protocols.research import EMPTY_QUERY_RESULT


def test_batched_generation_and_one_search_call_per_step(questions, scripted, bm25) -> None:
    gen, searcher = scripted("research"), CountingSearcher(bm25)
    trajs = run_rollouts(questions, "research", gen, searcher, RolloutConfig())
    assert gen.batches == [2, 2]
    assert searcher.calls == [(["Ed Wood film director"], 5)]  # both questions' identical query, deduplicated
    for t in trajs:
        assert t.finish_reason == "answer" and t.final_answer == "Tim Burton" and t.format_ok
        assert t.turns[0].query == "Ed Wood film director" and len(t.turns[0].doc_ids) == 5
        assert t.response.endswith("</answer><|im_end|>")
        assert "ignored tail" not in t.response
        assert t.timings["total"] >= t.timings["generate"] >= 0


def test_distinct_queries_share_one_call(questions, scripted, smol_tokenizer, bm25) -> None:
    from training_fakes import ScriptedGenerator

    gen = ScriptedGenerator(
        {questions[0].question: ["<search> Ed Wood </search>", "<answer> \\boxed{a} </answer><EOS>"],
         questions[1].question: ["<search> Scott Derrickson </search>", "<answer> \\boxed{b} </answer><EOS>"]},
        smol_tokenizer,
    )
    searcher = CountingSearcher(bm25)
    run_rollouts(questions, "research", gen, searcher, RolloutConfig(top_k=2))
    assert searcher.calls == [(["Ed Wood", "Scott Derrickson"], 2)]


def test_empty_query_gets_nothing_to_search_without_retriever(questions, scripted, bm25) -> None:
    searcher = CountingSearcher(bm25)
    gen = scripted("research", ["<think> a </think> <search>   </search>", "<answer> \\boxed{x} </answer><EOS>"])
    trajs = run_rollouts(questions, "research", gen, searcher, RolloutConfig())
    assert searcher.calls == []
    assert f"<result>\n{EMPTY_QUERY_RESULT}\n</result>" in trajs[0].response


def test_searchr1_feedback_and_final_turn_without_search(questions, scripted, bm25) -> None:
    searcher = CountingSearcher(bm25)
    gen = scripted("searchr1", ["<think> a </think><search> Ed Wood </search>", "oops"] * 5)
    trajs = run_rollouts(questions[:1], "searchr1", gen, searcher, RolloutConfig(max_turns=3))
    t = trajs[0]
    assert t.finish_reason == "max_turns" and len(t.turns) == 4 and t.n_searches == 2
    assert "My previous action is invalid" in t.response
    assert len(searcher.calls) == 2


def test_r1searcher_stops_after_eight_retrievals(questions, scripted, bm25) -> None:
    gen = scripted("r1searcher", [" <|begin_of_query|> Ed Wood<|end_of_query|>"])
    t = run_rollouts(questions[:1], "r1searcher", gen, bm25, RolloutConfig())[0]
    assert t.n_searches == 8 and len(t.turns) == 9 and t.finish_reason == "max_turns"
    assert t.response.count("<|begin_of_documents|>\n(1)") == 8


def test_token_budget_and_hard_pass_cap(questions, scripted, bm25) -> None:
    gen = scripted("research", ["<think> " + "x " * 40 + "</think> <search> Ed Wood </search>"])
    t = run_rollouts(questions[:1], "research", gen, bm25, RolloutConfig(max_total_tokens=60))[0]
    assert t.finish_reason == "length" and t.n_searches >= 1
    t = run_rollouts(questions[:1], "research", scripted("research", ["<search> a </search>"]), bm25,
                     RolloutConfig(max_passes=3))[0]
    assert t.finish_reason == "max_turns" and len(t.turns) == 3


def test_n_samples_and_exsearch_best_of_default(questions, scripted, bm25) -> None:
    trajs = run_rollouts(questions, "research", scripted("research"), bm25, RolloutConfig(n=3))
    assert [(t.question_id, t.sample) for t in trajs] == [("q1", 0), ("q1", 1), ("q1", 2), ("q2", 0), ("q2", 1),
                                                          ("q2", 2)]
    gen = scripted("exsearch")
    trajs = run_rollouts(questions[:1], "exsearch", gen, bm25, RolloutConfig(temperature=0.8, seed=1))
    assert {s.best_of for s in gen.samplings} == {8}  # the seed's per-step best-of-8 by likelihood
    assert gen.samplings[-1].stop == []  # the final answer turn has no stop string
    assert trajs[0].final_answer == "Tim Burton" and trajs[0].n_searches == 2 and trajs[0].format_ok
    greedy = scripted("exsearch")
    run_rollouts(questions[:1], "exsearch", greedy, bm25, RolloutConfig())
    assert {s.best_of for s in greedy.samplings} == {None}  # identical greedy candidates: no best-of


def test_write_and_read_trajectories(tmp_path, questions, scripted, bm25) -> None:
    trajs = run_rollouts(questions, "searchr1", scripted("searchr1"), bm25, RolloutConfig())
    ref = write_trajectories(trajs, tmp_path / "traj", config_hash="abc")
    assert ref.count == 2 and ref.protocols == ["searchr1"]
    manifest = artifacts.read_manifest(ref.uri)
    assert manifest["config_hash"] == "abc"
    assert manifest["count"] == 2 and manifest["files"] == ["trajectories.jsonl", "trajectories.parquet"]
    assert read_trajectories(ref) == trajs == read_trajectories(ref.uri)
    table = pq.read_table(tmp_path / "traj" / "trajectories.parquet")
    assert table.num_rows == 2 and table.column("loss_mask").to_pylist() == [t.loss_mask for t in trajs]


class _FirstStepScripted:
    """Real generator, except that step one is a fixed search call (a 135M model rarely emits the tags itself)."""

    def __init__(self, real, first: str) -> None:
        self.real, self.first, self.steps = real, first, 0
        self.eos_token, self.tokenizer = real.eos_token, real.tokenizer

    def generate(self, prompts, sampling, max_tokens=None):
        from training.generation.base import Completion

        self.steps += 1
        if self.steps == 1:
            return [Completion(text=self.first, token_ids=[0] * 8, finish_reason="stop", stop=sampling.stop[0])
                    for _ in prompts]
        return self.real.generate(prompts, sampling, max_tokens)


@pytest.mark.slow
def test_live_rollout_real_model_over_http(smol_generator, live_retriever, questions) -> None:
    gen = _FirstStepScripted(smol_generator, "<think> Let me search. </think> <search> Ed Wood film director </search>")
    cfg = RolloutConfig(max_tokens_per_turn=12, max_total_tokens=40)
    trajs = run_rollouts(questions, "research", gen, live_retriever, cfg)
    assert len(trajs) == 2
    for t in trajs:
        assert t.n_searches == 1 and t.turns[0].doc_ids and "Ed Wood" in t.turns[0].doc_texts[0]
        assert len(t.turns) >= 2 and t.turns[1].tokens > 0  # the real model continued after the documents
        assert t.finish_reason in {"answer", "eos", "length", "max_turns"}
        assert len(t.token_ids) == len(t.loss_mask) and 0 in t.loss_mask and 1 in t.loss_mask


@pytest.mark.slow
def test_live_rollout_real_model_unscripted(smol_generator, live_retriever, questions) -> None:
    cfg = RolloutConfig(max_tokens_per_turn=16, max_total_tokens=16)
    trajs = run_rollouts(questions, "r1searcher", smol_generator, live_retriever, cfg)
    for t in trajs:
        assert t.turns[0].generated and t.turns[0].tokens <= 16
        assert t.loss_mask and set(t.loss_mask) <= {0, 1}


def test_rollouts_report_token_progress(questions, scripted, bm25) -> None:
    from infra import progress

    events: list[progress.ProgressEvent] = []
    progress.register_sink(events.append, 0.0)
    try:
        run_rollouts(questions, "research", scripted("research"), bm25, RolloutConfig(max_total_tokens=100))
    finally:
        progress.unregister_sink(events.append)
    assert events[0].name == "rollouts research (2 trajectories)" and events[0].total == 200
    done = [e.done for e in events]
    assert done == sorted(done) and any(0 < d < 200 for d in done) and done[-1] == 200 and events[-1].finished
