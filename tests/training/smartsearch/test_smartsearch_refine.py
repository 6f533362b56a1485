"""SmartSearch refinement: prefix surgery (query replaced, result and the rest cut), continuation through the real
rollout engine with rebuilt masks, the refiner's reply parsing, the branch-length skip and branch planning."""

from __future__ import annotations

import json

import httpx
import pytest
from training_fakes import ScriptedGenerator

from evaluation.benchmarks import Question
from retrieval.types import Hit
from training.agent.rollout import RolloutConfig, run_rollouts
from training.protocols.base import load_protocol
from training.smartsearch.branches import fill_groups
from training.smartsearch.config import EndpointSpec, RefinerSpec
from training.smartsearch.endpoint import EndpointClient
from training.smartsearch.judge import RoundVerdict
from training.smartsearch.refine import (
    continue_from_prefixes,
    length_ok,
    parse_refined_query,
    prefix_text,
    refine_rounds,
    refined_prefix,
)

DOCS = {"who directed ed wood": "Ed Wood (film) by Tim Burton.", "bad query": "Unrelated text about trains.",
        "director of Ed Wood film": "Ed Wood is a 1994 film directed by Tim Burton."}


class DictSearcher:
    name = "dict"

    def __init__(self) -> None:
        self.queries: list[str] = []

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.queries += queries
        return [[Hit(id=q, title=q.split()[0], text=DOCS.get(q, "nothing"), score=1.0)] for q in queries]


Q = Question(id="q1", question="Who directed the film Ed Wood?", golden_answers=["Tim Burton"], dataset="t")
ORIGINAL = [" Let me search. </think>\n<search> who directed ed wood </search>",
            "<think> Need more. </think>\n<search> bad query </search>",
            "<think> Done. </think>\n<answer> \\boxed{Tim Burton} </answer><EOS>"]


@pytest.fixture
def original(smol_tokenizer):
    protocol = load_protocol("smartsearch", top_k=1, max_turns=4)
    gen = ScriptedGenerator({"Ed Wood": ORIGINAL}, tokenizer=smol_tokenizer)
    [traj] = run_rollouts([Q], protocol, gen, DictSearcher(), RolloutConfig(), smol_tokenizer)
    assert traj.n_searches == 2 and traj.response.count("</result>") == 2
    return traj


def test_refined_prefix_replaces_the_query_and_cuts_its_result(original) -> None:
    p = refined_prefix(original, 1, "director of Ed Wood film")
    text = prefix_text(p)
    assert text.endswith("<search> director of Ed Wood film </search>")
    assert "bad query" not in text and "Unrelated text" not in text     # the round's query and result are gone
    assert "who directed ed wood" in text and "Tim Burton" in text      # round 0 kept with its result
    assert len(p.turns) == 1 and p.step.startswith("<think> Need more. </think>")
    p0 = refined_prefix(original, 0, "new first query")
    assert prefix_text(p0) == " Let me search. </think>\n<search> new first query </search>"


def test_continuation_runs_the_new_query_and_rebuilds_masks(original, smol_tokenizer) -> None:
    protocol = load_protocol("smartsearch", top_k=1, max_turns=4)
    searcher = DictSearcher()
    gen = ScriptedGenerator({"Ed Wood": ["<think> Found. </think>\n<answer> \\boxed{Tim Burton} </answer><EOS>"]},
                            tokenizer=smol_tokenizer)
    p = refined_prefix(original, 1, "director of Ed Wood film")
    [branch] = continue_from_prefixes([p], protocol, gen, searcher, RolloutConfig(), smol_tokenizer)
    assert searcher.queries == ["director of Ed Wood film"]          # the engine ran the refined query itself
    assert branch.question_id == "q1" and branch.sample == 1000 and branch.n_searches == 2
    assert branch.response.startswith(prefix_text(p))
    assert "1994 film directed by Tim Burton" in branch.response and branch.final_answer == "Tim Burton"
    assert branch.format_ok, branch.format_reasons
    # masks rebuilt from the segments: document tokens 0, the refined query and the continuation 1
    text = smol_tokenizer.decode([t for t, m in zip(branch.token_ids, branch.loss_mask, strict=True) if m])
    masked = smol_tokenizer.decode([t for t, m in zip(branch.token_ids, branch.loss_mask, strict=True) if not m])
    assert "director of Ed Wood film" in text and "Found." in text
    assert "1994 film" in masked and "1994 film" not in text and "Tim Burton." in masked
    assert len(branch.token_ids) == len(branch.loss_mask)


def test_branch_length_skip(original, smol_tokenizer) -> None:
    assert length_ok(smol_tokenizer, original, refined_prefix(original, 1, "director of Ed Wood film"), 50)
    long_query = " ".join(["very long refined query words"] * 20)
    assert not length_ok(smol_tokenizer, original, refined_prefix(original, 1, long_query), 50)
    assert length_ok(smol_tokenizer, original, refined_prefix(original, 1, long_query), 10_000)


def test_refiner_reply_parsing_and_batched_refinement(original) -> None:
    assert parse_refined_query("<search>  a   b </search><explanation>x</explanation>") == "a b"
    assert parse_refined_query("<search> </search>") is None and parse_refined_query("no tags") is None
    # the seed reads <search>(.*?)</search> with DOTALL: a query over several lines is one query
    assert parse_refined_query("<search>\nEd Wood\ndirector\n</search>") == "Ed Wood director"
    assert parse_refined_query("<search> Ed Wood director") == "Ed Wood director"  # cut by the </search> stop
    seen = []

    def server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body["messages"][0]["content"])
        assert body["stop"] == ["</search>"] and body["max_tokens"] == 2048  # the seed's refiner request
        return httpx.Response(200, json={"choices": [{"message": {"content": "<search> director of Ed Wood film "
                                                                              "</search>"}}]})

    client = EndpointClient(EndpointSpec(base_url="http://r.test/v1", model="m"), transport=httpx.MockTransport(server))
    verdicts = [[RoundVerdict(question_id="q1", round=0, verdict=1, low_quality=False),
                 RoundVerdict(question_id="q1", round=1, verdict=0, explanation="trains are unrelated",
                              redundancy=2, low_quality=True)]]
    [r] = refine_rounds(client, RefinerSpec(), [original], verdicts, max_redundancy=1)
    assert (r.round, r.original_query, r.refined_query) == (1, "bad query", "director of Ed Wood film")
    assert "trains are unrelated" in r.issues and "repeats documents" in r.issues
    # the seed's refiner sees the round's result (the judged prefix) and is told not to rely on it
    assert "<search> bad query </search>" in seen[0] and "Unrelated text about trains." in seen[0]
    assert seen[0].rstrip().split("Issues found")[0].rstrip().endswith("</result>")


def test_fill_groups_mixes_like_the_seed() -> None:
    """n = 8 with a kept prefix every round: 4 on-policy samples and 4 branches, each branch continuing a DIFFERENT
    on-policy sample (the seed's generate_sequences loop), in the order on-policy, its branch, ...; a question with
    no usable prefix is filled on-policy; an odd size is cut at n."""
    from pydantic import BaseModel

    class T(BaseModel):
        question_id: str
        sample: int = 0
        parent: int | None = None

    def sample(qids: list[str]) -> list[T]:
        return [T(question_id=q) for q in qids]

    def branch(originals: list[T]) -> list[T]:
        return [T(question_id=o.question_id, parent=o.sample) for o in originals if o.question_id != "none"]

    pool = fill_groups({"a": 8, "none": 3, "odd": 5}, sample, branch)
    a = pool["a"]
    assert [t.parent is None for t in a] == [True, False] * 4
    assert [t.parent for t in a if t.parent is not None] == [0, 2, 4, 6]  # each from a different on-policy sample
    assert [t.sample for t in a if t.parent is None] == [0, 2, 4, 6]
    assert all(t.sample >= 1000 for t in a if t.parent is not None)
    assert [t.parent for t in pool["none"]] == [None, None, None]
    assert len(pool["odd"]) == 5 and sum(t.parent is None for t in pool["odd"]) == 3


def test_a_copied_format_example_or_unchanged_query_is_a_failed_refinement(original) -> None:
    """Session 9's demo: 3 of 7 SmolLM2 refinements were "the new query" (the old template's format line) and 2
    repeated the round's query; regenerating from them refines nothing."""
    from training.smartsearch.refine import REFINE_TEMPLATE, refinement_error, template_placeholders

    marks = template_placeholders(REFINE_TEMPLATE)
    old = template_placeholders("<search> the new query </search><explanation> why </explanation>")
    assert refinement_error("The new query", "bad query", marks | old) is not None
    assert refinement_error("the new query", "bad query", marks) is not None  # known copies, whatever the template
    assert refinement_error("...", "bad query", marks) == "refined query has no words"
    assert "unchanged" in (refinement_error("Bad  Query!", "bad query", marks) or "")
    assert refinement_error("director of Ed Wood film", "bad query", marks) is None
    for example in marks:  # whatever the default template shows between the tags is rejected
        assert refinement_error(example or "...", "bad query", marks) is not None
    replies = iter(["<search> the new query </search>", "<search> bad query </search>"])

    def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"message": {"content": next(replies)}}]})

    client = EndpointClient(EndpointSpec(base_url="http://r.test/v1", model="m", concurrency=1),
                            transport=httpx.MockTransport(server))
    low = [[RoundVerdict(question_id="q1", round=1, verdict=0, low_quality=True)]]
    for reason in ("copies the template's format example", "unchanged"):
        [r] = refine_rounds(client, RefinerSpec(), [original], low)
        assert r.refined_query is None and reason in (r.error or "")


def test_forced_first_step_forwards_the_multi_turn_bracket() -> None:
    """run_rollouts' set_multi_turn reaches the wrapped engine (its prefix-cache rule reads it); an inner engine
    without one gets its cache reset instead."""
    from training.smartsearch.refine import ForcedFirstStep

    calls: list[object] = []

    class WithBracket:
        def set_multi_turn(self, on: bool) -> None:
            calls.append(on)

    class ResetOnly:
        def reset_prefix_cache(self) -> None:
            calls.append("reset")

    ForcedFirstStep(WithBracket(), {}).set_multi_turn(True)
    ForcedFirstStep(ResetOnly(), {}).set_multi_turn(False)
    ForcedFirstStep(object(), {}).set_multi_turn(True)  # neither: nothing to do
    assert calls == [True, "reset"]
