"""``searchloop ask``: one question through a protocol, printed turn by turn (scripted model, real BM25)."""

from __future__ import annotations

from typer.testing import CliRunner

from flows.cli import app


def test_ask_shows_turns_documents_and_answer(monkeypatch, scripted, mini_corpus_path) -> None:
    from training.generation import hf as generation

    gen = scripted("research")
    gen.scripts = {"Who directed the film Ed Wood?": gen.scripts["Who directed the film Ed Wood?"]}
    monkeypatch.setattr(generation.TransformersGenerator, "from_model", classmethod(lambda cls, *a, **k: gen))
    result = CliRunner().invoke(app, ["ask", "Who directed the film Ed Wood?", "protocol=research",
                                      f"retrieval.corpus={mini_corpus_path}"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "turn 1: model" in result.output and "turn 2: model" in result.output
    assert "query: Ed Wood film director" in result.output
    assert "answer: Tim Burton" in result.output and "format: ok" in result.output


def test_ask_needs_exactly_one_retriever() -> None:
    result = CliRunner().invoke(app, ["ask", "Q?", "retrieval.url=http://127.0.0.1:9",
                                      "retrieval.corpus=data/corpus/mini.jsonl"])
    assert result.exit_code != 0
    assert "exactly one" in str(result.exception)


def test_ask_defaults_to_a_protocol_smollm2_follows_and_takes_eval_presets() -> None:
    result = CliRunner().invoke(app, ["ask", "Q?", "--dry-run"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "protocol: exsearch" in result.output and "model: smollm2" in result.output
    result = CliRunner().invoke(app, ["ask", "Q?", "--preset", "eval_mini", "protocol=reseach", "--dry-run"])
    assert result.exit_code != 0 and "protocol" in str(result.exception)
