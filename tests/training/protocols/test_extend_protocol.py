"""Adding a protocol is one module plus one table line: a toy protocol registered from this test.

``ToyProtocol`` owns everything protocol-specific: its tags and prompt, parsing and format check, its warm-up script
and search limit, its answer normalization and judge prompt. Registering it (``monkeypatch.setitem`` on
``training.protocols.registry.PROTOCOLS``, the one line a real protocol adds) is enough for the config checks, the
rollout engine, warm-up rendering, agent evaluation (with the protocol's own normalization) and the RL config's
evaluation settings. No library file names it (docs/extending.md walks through it).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from training_fakes import ScriptedGenerator

from evaluation.benchmarks import Question
from infra.config import build_config, load_config
from infra.errors import ConfigError
from retrieval.types import Hit
from training.agent.config import RolloutConfig
from training.agent.evaluate import AgentEvalConfig, evaluate_dataset
from training.agent.rollout import run_rollouts
from training.protocols.base import WARMUP_OPENING, AgentState, FormatCheck, Script, SearchProtocol
from training.protocols.registry import PROTOCOLS
from training.rl.config import RLConfig
from training.warmup.renderers import Episode, render_episodes

_QUERY = re.compile(r"<q>(.*?)</q>", re.DOTALL)
_ANSWER = re.compile(r"<a>(.*?)</a>", re.DOTALL)


class ToyProtocol(SearchProtocol):
    """Search with ``<q>query</q>``, read ``<d>...</d>``, answer with ``<a>answer</a>``."""

    name = "toy"
    stop = ("</q>", "</a>")
    results_marker = "<d>"
    default_top_k = 2
    default_max_turns = 3
    normalization = "r1searcher"  # the toy seed scores with R1-Searcher's answer rule
    judge_prompt = "r1searcher"

    def build_prompt(self, question: str, tokenizer: Any | None = None) -> str:
        return f"Search with <q>query</q>, answer with <a>answer</a>.\nQuestion: {question}\n"

    def on_completion(self, state: AgentState, completion: Any) -> str | None:
        final = self.last_pass(state)
        self._record(state, completion, completion.text)
        state.n_passes += 1
        if self.extract_answer(completion.text) is not None:
            state.finish("answer")
            return None
        query = self.extract_query(completion.text)
        if query is None or final:
            state.finish("max_turns" if final else "eos")
            return None
        return query

    def format_docs(self, hits: list[Hit]) -> str:
        return "".join(f"({i}) {h.contents}\n" for i, h in enumerate(hits, 1))

    def on_results(self, state: AgentState, query: str, hits: list[Hit]) -> None:
        state.n_searches += 1
        self._insert(state, f"\n<d>\n{self.format_docs(hits)}</d>\n", query, hits)

    def extract_query(self, text: str) -> str | None:
        found = _QUERY.findall(text)
        return found[-1].strip() if found else None

    def extract_answer(self, response: str) -> str | None:
        found = _ANSWER.findall(response)
        return found[-1].strip() if found else None

    def validate(self, response: str) -> FormatCheck:
        reasons = [] if response.count("<a>") == 1 and response.rstrip().endswith("</a>") else ["one <a>...</a> last"]
        return FormatCheck.from_reasons(reasons)

    def warmup_script(self, queries: list[str], facts: list[str], answer: str) -> Script:
        steps: Script = [(f"{facts[i - 1] if i else WARMUP_OPENING} <q>{q}</q>", "</q>", "stop")
                         for i, q in enumerate(queries)]
        return [*steps, (f"{facts[-1] if facts else WARMUP_OPENING} <a>{answer}</a>", "</a>", "stop")]


@pytest.fixture
def toy(monkeypatch) -> str:
    monkeypatch.setitem(PROTOCOLS, "toy", f"{__name__}:ToyProtocol")
    return "toy"


HITS = [Hit(id="d1", title="Ed Wood (film)", text="Ed Wood is a 1994 film directed by Tim Burton.", score=2.0),
        Hit(id="d2", title="Tim Burton", text="Tim Burton is an American film director.", score=1.0)]


class FixedSearcher:
    name = "fixed"

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return [HITS[:k] for _ in queries]


def test_unregistered_protocol_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown protocol 'toy'"):
        build_config(AgentEvalConfig, {"protocol": "toy"})


def test_toy_protocol_rolls_out_with_the_engine(toy) -> None:
    gen = ScriptedGenerator({"Ed Wood": ["I need to search. <q>Ed Wood director</q>", "Burton. <a>Tim Burton</a>"]})
    q = Question(id="q1", question="Who directed Ed Wood?", golden_answers=["Tim Burton"], dataset="t")
    [traj] = run_rollouts([q], toy, gen, FixedSearcher(), RolloutConfig())
    assert traj.final_answer == "Tim Burton" and traj.format_ok and traj.n_searches == 1
    assert "<d>\n(1) " in traj.response and traj.finish_reason == "answer"


def test_toy_protocol_renders_warmup_trajectories(toy, smol_tokenizer) -> None:
    from training.protocols.base import load_protocol

    q = Question(id="w1", question="Who directed Ed Wood?", golden_answers=["Tim Burton"], dataset="t")
    episode = Episode(question=q, steps=[("Ed Wood director", "Tim Burton directed it.", HITS)],
                      answer="Tim Burton", source="test")
    rows, stats = render_episodes(load_protocol(toy), [episode], smol_tokenizer, "test")
    assert stats.valid == 1 and rows[0]["protocol"] == "toy"
    assert rows[0]["response"].endswith("Tim Burton directed it. <a>Tim Burton</a>")
    generated = [text for text, gen in rows[0]["segments"] if gen]
    assert generated[0] == f"{WARMUP_OPENING} <q>Ed Wood director</q>"
    assert sum(label != -100 for label in rows[0]["labels"]) < len(rows[0]["input_ids"])  # documents masked


def test_evaluation_uses_the_protocols_own_normalization(toy, tmp_path) -> None:
    """R1-Searcher's rule (the toy's) maps a "True" prediction to "yes"; SQuAD's would not match."""
    cfg = build_config(AgentEvalConfig, {"protocol": toy})
    assert cfg.answer_normalization() == "r1searcher"
    bench = tmp_path / "yes.jsonl"
    bench.write_text('{"id": "y1", "question": "Is Ed Wood a film?", "golden_answers": ["yes"]}\n')
    gen = ScriptedGenerator({"Ed Wood": ["<a>True</a>"]})
    ref = evaluate_dataset(cfg, str(bench), tmp_path / "eval", generator=gen, searcher=FixedSearcher())
    assert ref.means["em"] == 1.0
    squad = build_config(AgentEvalConfig, {"protocol": toy, "normalization": "squad"})
    again = evaluate_dataset(squad, str(bench), tmp_path / "eval_squad", generator=ScriptedGenerator(
        {"Ed Wood": ["<a>True</a>"]}), searcher=FixedSearcher())
    assert again.means["em"] == 0.0


def test_rl_config_takes_the_toy_protocol(toy) -> None:
    cfg = load_config(RLConfig, "research_grpo_cpu_demo", [f"protocol={toy}"])
    assert cfg.protocol == "toy" and cfg.eval_normalization() == "r1searcher"
