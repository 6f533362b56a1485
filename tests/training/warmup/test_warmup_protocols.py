"""Warm-up trajectories for every protocol: replayed through the real rollout engine with the real SmolLM2
tokenizer and a real BM25 index; each passes its protocol's validator, its labels mask exactly the inserted text
(documents, feedback, template tokens), and a real 2-step LLaMA-Factory SFT runs on a non-ExSearch protocol."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from evaluation.benchmarks import load_benchmark
from infra import artifacts
from infra.errors import ArtifactError
from training.protocols.base import load_protocol
from training.warmup import renderers as wp
from training.warmup import sources as warmup

DATA = Path(__file__).resolve().parents[3] / "data"
PROTOCOLS = ["research", "searchr1", "r1searcher", "smartsearch", "exsearch"]


@pytest.fixture(scope="module")
def index():
    from retrieval.bm25 import BM25Searcher
    from retrieval.corpus import read_corpus

    passages = read_corpus(DATA / "train" / "corpus_train_mini.jsonl") + read_corpus(DATA / "corpus" / "mini.jsonl")
    return BM25Searcher.build(passages), {p.id: p for p in passages}


@pytest.fixture(scope="module")
def sources(index):
    searcher, passages = index
    qs = [q for name in ("hotpotqa", "2wikimultihopqa", "musique")
          for q in load_benchmark(DATA / "train" / f"{name}_train_mini.jsonl", limit=5)]
    eps, skipped = wp.decomposition_episodes(qs, searcher, passages, top_k=2)
    chats = [json.loads(line) for line in (DATA / "train" / "fireact_hotpotqa_react_60.jsonl").open()][:5]
    eps["fireact"], _ = wp.fireact_episodes(chats)
    assert not skipped and sum(len(v) for v in eps.values()) == 20
    return eps


def _token_flags(tokenizer, row):
    """Per input token: True when it belongs to generated text. The prompt and every segment are tokenized on their
    own (a token never spans generated and inserted text)."""
    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    expected, flags = ids(row["prompt"]), [False] * len(ids(row["prompt"]))
    for seg, gen in row["segments"]:
        expected += ids(seg)
        flags += [gen] * len(ids(seg))
    assert expected == row["input_ids"]
    return flags


@pytest.mark.parametrize("name", PROTOCOLS)
def test_every_protocol_sample_passes_its_validator_with_masked_documents(name, sources, smol_tokenizer) -> None:
    rows, stats = wp.build_protocol_warmup(name, sources, smol_tokenizer, top_k=2)
    assert sum(s.candidates for s in stats) == 20 and sum(s.valid for s in stats) == len(rows) >= 18
    protocol = load_protocol(name, top_k=2)
    for row in rows:
        response = "".join(t for t, _ in row["segments"])
        assert response == row["response"] and protocol.validate(response).ok, row["question_id"]
        assert row["prompt"] == protocol.build_prompt(_question(sources, row), smol_tokenizer)
        # labels: exactly the tokens made only of generated characters are supervised
        flags = _token_flags(smol_tokenizer, row)
        assert [lab != -100 for lab in row["labels"]] == flags
        assert all(lab in (-100, tid) for lab, tid in zip(row["labels"], row["input_ids"], strict=True))
        # every retrieved document sits in an inserted segment, so none of its tokens is trained
        inserted = "".join(t for t, gen in row["segments"] if not gen)
        episode = next(e for e in sources[row["source"]] if e.question.id == row["question_id"])
        for _, _, hits in episode.steps:
            for hit in hits[:2]:
                assert hit.text[:80] in inserted
        # the supervised tokens spell (a subsequence of) the generated text only
        assert _subsequence(smol_tokenizer.decode([t for t in row["labels"] if t != -100]), row)


def _question(sources, row) -> str:
    return next(e.question.question for eps in sources.values() for e in eps if e.question.id == row["question_id"])


def _subsequence(supervised: str, row) -> bool:
    generated = "".join(t for t, gen in row["segments"] if gen)
    it = iter(generated)
    return all(ch in it for ch in supervised)


def test_inserted_blocks_are_the_protocols_own(sources, smol_tokenizer) -> None:
    """research: the inserted text is exactly ReSearchProtocol.result_text of the episode's documents."""
    protocol = load_protocol("research", top_k=2)
    rows, _ = wp.build_protocol_warmup("research", {"fireact": sources["fireact"]}, smol_tokenizer, top_k=2)
    ep = sources["fireact"][0]
    inserted = [t for t, gen in rows[0]["segments"] if not gen]
    assert inserted[0] == protocol.result_text(ep.steps[0][0], ep.steps[0][2])
    assert rows[0]["response"].endswith("\\boxed{" + ep.answer + "} \\] </answer>" + smol_tokenizer.eos_token)


def test_exsearch_rollout_rendering_equals_the_llamafactory_chat(index, smol_tokenizer) -> None:
    """Two independent constructions agree: the rollout engine's ExSearch chat == warmup.build_chat's messages."""
    searcher, passages = index
    qs = load_benchmark(DATA / "train" / "2wikimultihopqa_train_mini.jsonl", limit=3)
    eps, _ = wp.decomposition_episodes(qs, searcher, passages, top_k=3)
    chats, _ = warmup.from_decompositions(qs, searcher, passages, top_k=3)
    protocol = load_protocol("exsearch", top_k=3)
    for ep, chat in zip(eps["decomposition:2wikimultihopqa"], chats, strict=True):
        traj, _ = wp.render_episode(protocol, ep, smol_tokenizer)
        rendered = smol_tokenizer.apply_chat_template(chat["messages"], tokenize=False)
        assert traj.format_ok and (traj.prompt + traj.response).rstrip("\n") == rendered.rstrip("\n")


def test_no_search_allowed_puts_all_facts_in_one_reasoning_step(sources, smol_tokenizer) -> None:
    ep = sources["decomposition:2wikimultihopqa"][0]
    rows, [stats] = wp.build_protocol_warmup("research", {"x": [ep]}, smol_tokenizer, top_k=2, max_turns=1)
    assert stats.valid == stats.truncated == 1 and "<search>" not in rows[0]["response"]
    assert all(f in rows[0]["response"] for _, f, _ in ep.steps)


def test_truncation_to_the_search_limit(sources, smol_tokenizer) -> None:
    two_hop = [e for e in sources["decomposition:2wikimultihopqa"] if len(e.steps) >= 2]
    rows, [stats] = wp.build_protocol_warmup("searchr1", {"2wiki": two_hop}, smol_tokenizer, 6, top_k=2,
                                             max_turns=1)
    assert stats.truncated == len(two_hop) == stats.valid
    for row in rows:
        assert row["response"].count("<search>") == 1 and row["response"].count("<information>") == 1
    rows, [stats] = wp.build_protocol_warmup("research", {"2wiki": two_hop}, smol_tokenizer, top_k=2, max_turns=2)
    assert stats.valid == len(two_hop) and all(r["response"].count("<result>") == 1 for r in rows)


def test_bad_episode_is_rejected_and_counted(sources, smol_tokenizer) -> None:
    ep = sources["fireact"][0]
    bad = wp.Episode(ep.question, ep.steps, "one two three four five six seven eight nine ten eleven", "x")
    _, [stats] = wp.build_protocol_warmup("r1searcher", {"x": [bad]}, smol_tokenizer, top_k=2)
    assert stats.valid == 0 and stats.rejected == {"invalid_format": 1}
    assert stats.first_reasons == {"answer longer than 10 words": 1}


def test_teacher_rollouts_become_episodes(sources, smol_tokenizer) -> None:
    """A teacher's trajectory (any protocol) -> episode -> another protocol's valid trajectory."""
    protocol = load_protocol("searchr1", top_k=2)
    traj, _ = wp.render_episode(protocol, sources["fireact"][1], smol_tokenizer)
    [ep] = wp.teacher_episodes([traj])
    assert len(ep.steps) == len(sources["fireact"][1].steps) and ep.answer == traj.final_answer
    rows, [stats] = wp.build_protocol_warmup("smartsearch", {"teacher": [ep]}, smol_tokenizer, top_k=2)
    assert stats.valid == 1 and rows[0]["response"].count("<result>result: ") == len(ep.steps)


def test_tokenized_dataset_filters_and_checks(tmp_path) -> None:
    from datasets import load_from_disk

    from training.sft.launcher import write_tokenized_dataset

    rows = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [1] * 9, "labels": [1] * 9},
            {"input_ids": [1, 2], "labels": [-100, -100]}]
    counts = write_tokenized_dataset(rows, tmp_path / "ds", cutoff_len=4)
    assert counts == {"kept": 1, "over_cutoff": 1, "no_labels": 1}
    ds = load_from_disk(str(tmp_path / "ds"))
    assert ds[0]["labels"] == [-100, 2, 3] and ds[0]["weight"] == 1.0 and ds[0]["attention_mask"] == [1, 1, 1]
    with pytest.raises(ArtifactError, match="labels"):
        write_tokenized_dataset([{"input_ids": [1, 2], "labels": [1]}], tmp_path / "bad", cutoff_len=4)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # real LLaMA-Factory run; minutes on a busy 2-core machine
def test_tokenized_sft_two_steps_research(sources, smol_path, smol_tokenizer, tmp_path) -> None:
    """Real LLaMA-Factory SFT workflow with our trainer on ReSearch warm-up rows (documents masked), 2 steps."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.sft.launcher import SFTConfig, train_sft_tokenized

    rows, _ = wp.build_protocol_warmup("research", sources, smol_tokenizer, 8, top_k=1, max_turns=2)
    rows = sorted(rows, key=lambda r: len(r["input_ids"]))[:4]
    artifacts.write_jsonl(tmp_path / "rows.jsonl", rows)
    cfg = SFTConfig(max_steps=2, cutoff_len=512, per_device_train_batch_size=2, warmup_ratio=0.0,
                    learning_rate=1e-3, report_to_mlflow=False, timeout_s=1500)
    ref = train_sft_tokenized(cfg, tmp_path / "rows.jsonl", str(smol_path), tmp_path / "sft")
    assert ref.n_examples == 4 and ref.train_loss is not None and math.isfinite(ref.train_loss)
    engine_args = artifacts.read_manifest(tmp_path / "sft")["engine_args"]
    assert engine_args["tokenized_path"].endswith("tokenized")
    assert "Loaded tokenized dataset" in (tmp_path / "sft" / "engine.log").read_text()
    base = AutoModelForCausalLM.from_pretrained(str(smol_path))
    tuned = AutoModelForCausalLM.from_pretrained(ref.uri)
    name = "model.layers.0.self_attn.q_proj.weight"
    delta = (tuned.state_dict()[name] - base.state_dict()[name]).abs().max().item()
    assert delta > 0 and not torch.isnan(tuned.state_dict()[name]).any()
    assert train_sft_tokenized(cfg, tmp_path / "rows.jsonl", str(smol_path), tmp_path / "sft") == ref  # cached


@pytest.mark.parametrize("name", ["searchr1", "research", "r1searcher", "smartsearch"])
def test_no_search_share_renders_answers_without_a_search(name, sources, smol_tokenizer) -> None:
    """``WarmupConfig.no_search_share``: the chosen episodes (by question id, so the same for every seed) render as a
    valid answer with no search and no document; the others are untouched."""
    split = wp.without_search(sources, 0.5)
    moved = [e for src, eps in split.items() if src.endswith(":no_search") for e in eps]
    kept = [e for src, eps in split.items() if not src.endswith(":no_search") for e in eps]
    assert 0 < len(moved) < 20 and len(moved) + len(kept) == 20
    assert all(not e.steps for e in moved) and all(e.steps for e in kept)
    again = {e.question.id for src, eps in wp.without_search(sources, 0.5).items() if src.endswith(":no_search")
             for e in eps}
    assert again == {e.question.id for e in moved}  # deterministic
    assert wp.without_search(sources, 0.0) is sources
    rows, stats = wp.build_protocol_warmup(name, {k: v for k, v in split.items() if k.endswith(":no_search")},
                                           smol_tokenizer, top_k=2)
    protocol = load_protocol(name, top_k=2)
    assert rows and sum(s.valid for s in stats) == len(rows)
    for row in rows:
        assert protocol.validate(row["response"]).ok
        assert protocol.extract_answer(row["response"]) is not None
        assert all(gen for text, gen in row["segments"] if text.strip())  # nothing inserted: no document block


def test_no_search_share_is_left_out_of_dumps_at_zero() -> None:
    from training.sft.config import WarmupConfig

    assert "no_search_share" not in WarmupConfig().model_dump()
    assert WarmupConfig(no_search_share=0.5).model_dump()["no_search_share"] == 0.5
    with pytest.raises(ValueError):
        WarmupConfig(no_search_share=1.0)


def test_em_loop_refuses_no_search_share() -> None:
    """The EM loop's warm-up chats always search, so a share it would ignore is refused with the fix."""
    from infra.config import load_config
    from infra.errors import ConfigError
    from training.em.config import EMLoopConfig

    with pytest.raises(ConfigError, match="no_search_share is read by the RL warm-up only"):
        load_config(EMLoopConfig, "exsearch_cpu_demo", ["warmup.no_search_share=0.5"])
