"""Search-value conditions insert exactly what they claim: a tiny random Llama model (real transformers generation
with the SmolLM2 tokenizer) continues after the scripted first search; a fake searcher records its calls."""

from __future__ import annotations

import pytest

from evaluation.benchmarks import Question
from infra.errors import ConfigError
from retrieval.types import Hit, Passage
from training.agent.rollout import RolloutConfig
from training.rl.search_value import (
    condition_rows,
    evaluate_condition,
    first_per_dataset,
    parse_condition,
    summarize,
    summary_table,
)

QUESTION = "Who directed the film Ed Wood?"
OPENING = "<think> I need to search for this. </think>\n<search> Who directed the film Ed Wood? </search>"


class FakeSearcher:
    """Returns k numbered documents per query and records every call."""

    name = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        self.calls.append((list(queries), k))
        return [[Hit(id=f"d{i}", title=f"T{i}", text=f"text {i} about {q[:6]}", score=1.0 / i)
                 for i in range(1, k + 1)] for q in queries]


@pytest.fixture(scope="module")
def tiny_generator(smol_tokenizer):
    import torch
    import transformers

    from training.generation.hf import TransformersGenerator

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                   max_position_embeddings=2048, eos_token_id=smol_tokenizer.eos_token_id,
                                   pad_token_id=smol_tokenizer.pad_token_id)
    model = transformers.LlamaForCausalLM(cfg).eval()
    return TransformersGenerator(model, smol_tokenizer, batch_size=4)


@pytest.fixture()
def question():
    return Question(id="q1", question=QUESTION, golden_answers=["Tim Burton"], dataset="hotpotqa",
                    supporting_doc_ids=["g2", "g1"])


PASSAGES = {"g1": Passage(id="g1", title="Ed Wood (film)", text="Ed Wood is a 1994 film directed by Tim Burton."),
            "g2": Passage(id="g2", title="Tim Burton", text="Tim Burton is an American director.")}
ROLLOUT = RolloutConfig(temperature=0.0, max_total_tokens=6)
KW = {"top_k": 1, "max_turns": 2, "template": "instruct"}


def _run(tiny_generator, smol_tokenizer, question, name, protocol="searchr1", searcher=None):
    searcher = searcher or FakeSearcher()
    traj = evaluate_condition([question], protocol, KW, tiny_generator, ROLLOUT, parse_condition(name),
                              {"bm25": searcher}, PASSAGES, smol_tokenizer)[0]
    return traj, searcher


def test_searchr1_conditions_insert_exactly_their_documents(tiny_generator, smol_tokenizer, question) -> None:
    traj, s = _run(tiny_generator, smol_tokenizer, question, "closed")
    assert traj.response.startswith(OPENING + "\n\n<information></information>\n\n")
    assert s.calls == [] and traj.turns[0].doc_ids == []

    traj, s = _run(tiny_generator, smol_tokenizer, question, "bm25@2")
    assert s.calls == [([QUESTION], 2)]  # the question itself is the only query, one batched call
    assert traj.response.startswith(
        OPENING + "\n\n<information>Doc 1(Title: \"T1\") text 1 about Who di\nDoc 2(Title: \"T2\") text 2 about Who di"
        "</information>\n\n")
    assert traj.turns[0].doc_ids == ["d1", "d2"]

    traj, s = _run(tiny_generator, smol_tokenizer, question, "gold")
    assert s.calls == []  # gold paragraphs come from the corpus by id, in the row's order
    assert traj.response.startswith(
        OPENING + "\n\n<information>Doc 1(Title: \"Tim Burton\") Tim Burton is an American director.\n"
        "Doc 2(Title: \"Ed Wood (film)\") Ed Wood is a 1994 film directed by Tim Burton.</information>\n\n")
    # after the scripted search exactly one generation pass follows, and it executes no search
    assert len(traj.turns) == 2 and traj.n_searches == 1
    assert traj.turns[0].generated == OPENING and traj.turns[1].query is None
    # the random model's continuation is generated (budget counts only its own tokens)
    assert traj.turns[1].tokens >= 1


def test_research_block_and_own_condition(tiny_generator, smol_tokenizer, question) -> None:
    traj, _ = _run(tiny_generator, smol_tokenizer, question, "bm25@1", protocol="research")
    assert traj.response.startswith(
        "<think> I need to search for this. </think>\n<search> Who directed the film Ed Wood? </search>"
        " <result>\n\"T1\"\ntext 1 about Who di\n</result>")
    traj, _ = _run(tiny_generator, smol_tokenizer, question, "closed", protocol="research")
    assert " <result>\n\n</result>" in traj.response
    # own: the plain rollout, nothing scripted (the random model never writes a search tag)
    traj, s = _run(tiny_generator, smol_tokenizer, question, "own")
    assert not traj.response.startswith(OPENING) and traj.turns[0].generated != OPENING


def test_rows_summary_and_parsing(tiny_generator, smol_tokenizer, question) -> None:
    rows = {}
    for name in ("closed", "bm25@1"):
        c = parse_condition(name)
        traj, _ = _run(tiny_generator, smol_tokenizer, question, name)
        base = {"id": traj.question_id, "f1": 0.0 if name == "closed" else 1.0, "em": 0.0, "cover_em": 0.0,
                "format_ok": traj.format_ok, "reward": 0.0}
        rows[name] = condition_rows(c, [traj], [base])
    assert rows["closed"][0]["n_searches"] == 0 and rows["bm25@1"][0]["n_searches"] == 1
    assert rows["bm25@1"][0]["docs"] == ["d1"] and rows["bm25@1"][0]["condition"] == "bm25@1"
    assert rows["bm25@1"][0]["continuation"] == traj.turns[-1].generated and len(traj.turns) == 2
    # a last step that asks for another search is marked (the random model's never does)
    assert rows["closed"][0]["extra_search"] is False
    last = traj.turns[-1].model_copy(update={"generated": "<think> more </think>\n<search> again </search>"})
    again = traj.model_copy(update={"turns": [*traj.turns[:-1], last]})
    assert condition_rows(parse_condition("bm25@1"), [again], [base])[0]["extra_search"] is True
    s = summarize(rows, n_resamples=100)
    assert s["conditions"]["bm25@1"]["paired_vs_baseline"]["f1"]["diff"] == 1.0
    assert "| bm25@1 | 1 |" in summary_table(s)
    with pytest.raises(ConfigError, match="unknown search-value condition"):
        parse_condition("bm25-3")
    with pytest.raises(ConfigError, match="no searcher 'dense'"):
        _run(tiny_generator, smol_tokenizer, question, "dense@1")
    qs = [Question(id=str(i), question="q", dataset=d) for i, d in enumerate("aabbb")]
    assert [q.id for q in first_per_dataset(qs, 1)] == ["0", "2"]


def test_cli_dry_run_and_bad_condition() -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    out = CliRunner().invoke(app, ["run", "search-value", "--preset", "searchr1_learn_cpu", "--per-dataset", "35",
                                   "--dry-run"], terminal_width=250)
    assert out.exit_code == 0, out.output
    assert "protocol searchr1" in out.output and "(35 each)" in out.output and "bm25@3" in out.output
    out = CliRunner().invoke(app, ["run", "search-value", "--conditions", "closed,bm25-3", "--dry-run"])
    assert isinstance(out.exception, ConfigError) and "bm25-3" in str(out.exception)


def test_run_search_value_end_to_end(smol_tokenizer, tmp_path) -> None:
    """The command's library entry point on a real preset (the demo's, repository data only) with a tiny saved
    checkpoint: every import and the files it writes (it once failed at an import no unit test reached)."""
    import json

    import torch
    import transformers

    from flows.specs import resolve
    from training.rl.search_value import run_search_value

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                   max_position_embeddings=2048, eos_token_id=smol_tokenizer.eos_token_id,
                                   pad_token_id=smol_tokenizer.pad_token_id)
    model_dir = tmp_path / "tiny"
    transformers.LlamaForCausalLM(cfg).save_pretrained(model_dir)
    smol_tokenizer.save_pretrained(model_dir)
    preset = resolve("rl-finetune", "searchr1_learn_demo", ["eval.max_new_tokens=8"])
    res = run_search_value(preset, ["closed", "bm25@1", "gold"], tmp_path / "sv", per_dataset=1, model=str(model_dir))
    assert res.n == 3 and set(res.seconds) == {"closed", "bm25@1", "gold"}
    summary = json.loads((tmp_path / "sv" / "summary.json").read_text())
    assert set(summary["conditions"]) == {"closed", "bm25@1", "gold"} and summary["n"] == 3
    rows = [json.loads(x) for x in (tmp_path / "sv" / "gold.jsonl").read_text().splitlines()]
    assert [r["condition"] for r in rows] == ["gold"] * 3 and all(r["n_searches"] == 1 for r in rows)
