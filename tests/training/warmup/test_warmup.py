"""Warm-up data: decompositions + retriever, FireAct conversion, a teacher behind the Generator interface, and a
real few-step LoRA warm-up SFT of SmolLM2-135M through LLaMA-Factory on CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from evaluation.benchmarks import load_benchmark
from infra import artifacts
from training.generation.base import Completion, cut_at_stop
from training.protocols.exsearch import FINAL_TOKEN, QUERY_TOKEN, validate_messages
from training.warmup import sources as warmup

DATA = Path(__file__).resolve().parents[3] / "data"


@pytest.fixture(scope="module")
def train_index():
    from retrieval.bm25 import BM25Searcher
    from retrieval.corpus import read_corpus

    passages = read_corpus(DATA / "train" / "corpus_train_mini.jsonl") + read_corpus(DATA / "corpus" / "mini.jsonl")
    return BM25Searcher.build(passages), {p.id: p for p in passages}


@pytest.mark.parametrize("name", ["2wikimultihopqa", "musique", "hotpotqa"])
def test_decomposition_chats_are_valid_and_grounded(train_index, name) -> None:
    searcher, passages = train_index
    questions = load_benchmark(DATA / "train" / f"{name}_train_mini.jsonl")
    rows, stats = warmup.from_decompositions(questions, searcher, passages, top_k=3)
    assert stats.candidates == len(questions) and stats.valid == len(rows) > 0.9 * len(questions)
    for row in rows:
        msgs = row["messages"]
        assert validate_messages(msgs).ok
        assert msgs[1]["content"].startswith(QUERY_TOKEN) and msgs[-3]["content"].endswith(FINAL_TOKEN)
        q = next(q for q in questions if q.id == row["question_id"])
        assert msgs[-1]["content"] == q.golden_answers[0]
        # every step shows at most top_k documents, and the step's gold paragraph is among them
        for user in msgs[2:-2:2]:
            assert user["content"].count("] Title: ") <= 3
        shown = " ".join(m["content"] for m in msgs[2:-2:2])
        for pid in q.supporting_doc_ids:
            if name != "2wikimultihopqa" or len(q.metadata.get("qa_pairs", [])) >= len(q.supporting_doc_ids):
                assert passages[pid].text[:60] in shown


def test_musique_hops_substitute_previous_answers(train_index) -> None:
    searcher, passages = train_index
    q = load_benchmark(DATA / "train" / "musique_train_mini.jsonl")[0]
    steps = warmup.decomposition_steps(q, passages)
    # "Who was the first president of #1 ?" -> the first hop's answer is substituted
    assert steps[1][0] == "Who was the first president of American Psychological Association ?"
    assert [s[2] for s in steps] == ["trw-1000", "trw-1004"]


def test_fireact_conversion() -> None:
    chats = [json.loads(line) for line in (DATA / "train" / "fireact_hotpotqa_react_60.jsonl").open()]
    rows, stats = warmup.from_fireact(chats)
    assert stats.candidates == 60 and stats.valid == len(rows) and stats.valid + sum(stats.skipped.values()) == 60
    first = rows[0]["messages"]
    query = "best kick boxer in the world unsportsmanlike conducts crimes of violence"
    assert first[1]["content"] == f"{QUERY_TOKEN} {query}"
    assert "Badr Hari (born 8 December 1984)" in first[2]["content"]
    assert first[3]["content"].startswith("<FACT> Badr Hari is the person who fits the description.\n<FINAL>")
    assert first[-1]["content"] == "Badr Hari"
    failed = {"messages": chats[0]["messages"][:-1] + [{"role": "user", "content": "Observation: reward = False"}]}
    assert warmup.fireact_chat(failed["messages"]) == "not_successful"


class _Teacher:
    """A fake OpenAI-compatible teacher: replays an ExSearch episode for every prompt (unit-test fake)."""

    eos_token = "<|im_end|>"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.script = ["<QUERY> capital of France<SEARCH>", "<FACT> Paris is the capital\n<FINAL>", "Paris"]

    def generate(self, prompts, sampling, max_tokens=None):
        out = []
        for p in prompts:
            step = min(p.count("<|im_start|>assistant") - 1, 2)
            text, stop = cut_at_stop(self.script[step], sampling.stop)
            out.append(Completion(text=text, token_ids=[1, 2], finish_reason="stop" if stop else "eos", stop=stop))
        return out


def test_teacher_interface(train_index, smol_tokenizer) -> None:
    from evaluation.benchmarks import Question
    from training.agent.rollout import RolloutConfig

    searcher, _ = train_index
    qs = [Question(id="a", question="What is the capital of France?", golden_answers=["Paris"]),
          Question(id="b", question="What is the capital of Spain?", golden_answers=["Madrid"])]
    rows, stats = warmup.from_teacher(qs, _Teacher(smol_tokenizer), searcher, RolloutConfig(best_of=1))
    assert stats.candidates == 2 and stats.valid == 1 and stats.skipped == {"wrong_or_no_answer": 1}
    assert rows[0]["question_id"] == "a" and validate_messages(rows[0]["messages"]).ok


@pytest.mark.slow
@pytest.mark.timeout(2400)  # real LLaMA-Factory runs; minutes on a busy 2-core machine
def test_warmup_sft_few_steps_on_cpu(train_index, smol_path, tmp_path) -> None:
    """Real LLaMA-Factory LoRA SFT, 2 steps, cutoff 256, on warm-up chats; the merged checkpoint changed."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.sft.launcher import SFTConfig, train_sft

    searcher, passages = train_index
    rows, _ = warmup.from_decompositions(load_benchmark(DATA / "train" / "hotpotqa_train_mini.jsonl", limit=4),
                                         searcher, passages)
    data = tmp_path / "warmup.jsonl"
    artifacts.write_jsonl(data, rows)
    cfg = SFTConfig(max_steps=2, cutoff_len=256, per_device_train_batch_size=2, warmup_ratio=0.0,
                    learning_rate=1e-3, report_to_mlflow=False, timeout_s=800)
    ref = train_sft(cfg, data, str(smol_path), tmp_path / "sft")
    assert ref.n_examples == 4 and ref.train_loss is not None and math.isfinite(ref.train_loss)
    base = AutoModelForCausalLM.from_pretrained(str(smol_path))
    tuned = AutoModelForCausalLM.from_pretrained(ref.uri)
    name = "model.layers.0.self_attn.q_proj.weight"
    delta = (tuned.state_dict()[name] - base.state_dict()[name]).abs().max().item()
    assert delta > 0 and not torch.isnan(tuned.state_dict()[name]).any()


def test_user_lf_dataset_as_warmup_source(tmp_path: Path) -> None:
    """A user's LLaMA-Factory sharegpt dataset (LF default tags) goes through the ExSearch validator."""
    chats = [json.loads(line) for line in (DATA / "train" / "fireact_hotpotqa_react_60.jsonl").open()]
    valid, _ = warmup.from_fireact(chats[:5])
    tags = {"user": "human", "assistant": "gpt"}
    convs = [{"conversations": [{"from": tags[m["role"]], "value": m["content"]} for m in r["messages"]]}
             for r in valid]
    convs.append({"conversations": [{"from": "human", "value": "Q?"}, {"from": "gpt", "value": "no protocol"}]})
    artifacts.write_json(tmp_path / "mine.json", convs)
    artifacts.write_json(tmp_path / "dataset_info.json", {"mine": {"file_name": "mine.json", "formatting": "sharegpt"}})
    rows, stats = warmup.from_lf_dataset(tmp_path / "dataset_info.json", "mine")
    assert stats.source == "lf:mine" and stats.candidates == len(valid) + 1
    assert stats.valid == len(valid) and stats.skipped == {"invalid_format": 1}
    assert [r["messages"] for r in rows] == [r["messages"] for r in valid]
