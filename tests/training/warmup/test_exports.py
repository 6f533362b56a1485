"""Exports read back by their consumers' own loaders: pyarrow for Search-R1's schema, LLaMA-Factory's dataset
parser and converters for alpaca / sharegpt, our benchmark loader for FlashRAG; a user's own dataset_info is read."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from evaluation.benchmarks import load_benchmark
from training.sft.launcher import STUB_DIR
from training.warmup.exports import export_dataset
from training.warmup.lf_data import read_lf_dataset

CHATS = [
    {"messages": [
        {"role": "system", "content": "You search."},
        {"role": "user", "content": "Who wrote Hamlet?"},
        {"role": "assistant", "content": "<QUERY> author of Hamlet"},
        {"role": "user", "content": "<SEARCH> Hamlet is a tragedy by William Shakespeare."},
        {"role": "assistant", "content": "William Shakespeare"},
    ]},
    {"messages": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris"}]},
]


def _lf_align(dataset_dir: Path, name: str):
    """LLaMA-Factory's own path: dataset_info parser -> file loader -> format converter."""
    if str(STUB_DIR) not in sys.path:
        sys.path.insert(0, str(STUB_DIR))
    pytest.importorskip("llamafactory")
    from llamafactory.data.loader import _load_single_dataset
    from llamafactory.data.parser import get_dataset_list
    from llamafactory.hparams import DataArguments

    data_args = DataArguments(dataset_dir=str(dataset_dir), dataset=[name])
    (attr,) = get_dataset_list([name], str(dataset_dir))
    model_args = SimpleNamespace(cache_dir=None, hf_hub_token=None)
    training_args = SimpleNamespace(local_process_index=0, dataloader_num_workers=0)
    return _load_single_dataset(attr, model_args, data_args, training_args)


def test_searchr1_parquet_schema_read_by_pyarrow(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    out = tmp_path / "test.parquet"
    assert export_dataset("searchr1-parquet", "hotpotqa_mini", out, limit=4)["rows"] == 4
    table = pq.read_table(out)
    assert {"data_source", "prompt", "ability", "reward_model", "extra_info"} <= set(table.column_names)
    row = table.to_pylist()[0]
    gold = load_benchmark("hotpotqa_mini", limit=1)[0]
    # Search-R1's qa_em reward: ground_truth['target']
    assert row["reward_model"] == {"style": "rule", "ground_truth": {"target": gold.golden_answers}}
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith(f"Question: {row['question']}\n")
    assert row["extra_info"] == {"split": "test", "index": 0} and row["ability"] == "fact-reasoning"
    # and we read it back (question recovered even without the kept source columns)
    table.drop_columns(["id", "question", "golden_answers"]).to_pandas().to_parquet(tmp_path / "bare.parquet")
    back = load_benchmark(tmp_path / "bare.parquet")
    assert back[0].question.rstrip("?") == gold.question.rstrip("?") and back[0].golden_answers == gold.golden_answers
    assert back[0].dataset == "hotpotqa" and back[0].id == "hotpotqa_0" and "prompt" not in back[0].metadata


def test_lf_alpaca_read_by_llamafactory(tmp_path: Path) -> None:
    chats = tmp_path / "chats.jsonl"
    chats.write_bytes(b"\n".join(orjson.dumps(c) for c in CHATS))
    result = export_dataset("lf-alpaca", str(chats), tmp_path / "lf", name="warm")
    assert result["rows"] == 2
    ds = _lf_align(tmp_path / "lf", "warm")
    assert len(ds) == 2
    first = ds[0]
    assert first["_system"] == "You search."
    assert [m["content"] for m in first["_prompt"]] == [
        "Who wrote Hamlet?", "<QUERY> author of Hamlet", "<SEARCH> Hamlet is a tragedy by William Shakespeare."]
    assert first["_response"][0]["content"] == "William Shakespeare"


def test_lf_sharegpt_of_a_benchmark_read_by_llamafactory(tmp_path: Path) -> None:
    export_dataset("lf-sharegpt", "hotpotqa_mini", tmp_path / "lf", limit=3)
    ds = _lf_align(tmp_path / "lf", "hotpotqa_mini")
    qs = load_benchmark("hotpotqa_mini", limit=3)
    assert len(ds) == 3
    assert [r["_prompt"][0]["content"] for r in ds] == [q.question for q in qs]
    assert [r["_response"][0]["content"] for r in ds] == [q.golden_answers[0] for q in qs]


def test_user_dataset_info_sharegpt_defaults_and_alpaca(tmp_path: Path) -> None:
    # a user's own dataset in LLaMA-Factory's default sharegpt tags (from/value, human/gpt/observation)
    (tmp_path / "mine.json").write_bytes(orjson.dumps([{"conversations": [
        {"from": "human", "value": "Q?"}, {"from": "gpt", "value": "<QUERY> q"},
        {"from": "observation", "value": "doc"}, {"from": "gpt", "value": "A"}]}]))
    (tmp_path / "dataset_info.json").write_bytes(orjson.dumps({"mine": {"file_name": "mine.json",
                                                                         "formatting": "sharegpt"}}))
    rows = read_lf_dataset(tmp_path / "dataset_info.json", "mine")
    assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant", "user", "assistant"]
    assert rows[0]["source"] == "lf:mine"
    # the alpaca export reads back to the same chats
    chats = tmp_path / "chats.jsonl"
    chats.write_bytes(b"\n".join(orjson.dumps(c) for c in CHATS))
    export_dataset("lf-alpaca", str(chats), tmp_path / "lf", name="warm")
    back = read_lf_dataset(tmp_path / "lf" / "dataset_info.json", "warm")
    assert [r["messages"] for r in back] == [c["messages"] for c in CHATS]


def test_user_dataset_info_errors_name_the_fix(tmp_path: Path) -> None:
    from infra.errors import DataError

    (tmp_path / "dataset_info.json").write_bytes(orjson.dumps({"hub": {"hf_hub_url": "x/y"}}))
    with pytest.raises(DataError, match="has no dataset 'other'; it has hub"):
        read_lf_dataset(tmp_path / "dataset_info.json", "other")
    with pytest.raises(DataError, match="only local files"):
        read_lf_dataset(tmp_path / "dataset_info.json", "hub")


def test_flashrag_export_reloads(tmp_path: Path) -> None:
    export_dataset("flashrag", "musique_mini", tmp_path / "m.jsonl", limit=5)
    back, orig = load_benchmark(tmp_path / "m.jsonl"), load_benchmark("musique_mini", limit=5)
    assert [(q.id, q.question, q.golden_answers) for q in back] == [(q.id, q.question, q.golden_answers) for q in orig]
    assert orjson.loads((tmp_path / "m.jsonl").read_bytes().splitlines()[0])["metadata"]["dataset"] == "musique"


def test_lf_alpaca_of_a_benchmark_read_by_llamafactory(tmp_path: Path) -> None:
    """No row has a system prompt: dataset_info.json must not map a ``system`` column (LLaMA-Factory's converter
    raised ``KeyError: 'system'``)."""
    export_dataset("lf-alpaca", "hotpotqa_mini", tmp_path / "lf", limit=3)
    info = orjson.loads((tmp_path / "lf" / "dataset_info.json").read_bytes())
    assert "system" not in info["hotpotqa_mini"]["columns"]
    ds = _lf_align(tmp_path / "lf", "hotpotqa_mini")
    qs = load_benchmark("hotpotqa_mini", limit=3)
    assert [r["_prompt"][0]["content"] for r in ds] == [q.question for q in qs]
    assert [r["_response"][0]["content"] for r in ds] == [q.golden_answers[0] for q in qs]
    assert {r["_system"] for r in ds} == {""}


SEARCHR1_QA_SOURCES = {"nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"}


@pytest.mark.parametrize("bench", ["hotpotqa_mini", "2wikimultihopqa_mini", "musique_mini", "bamboogle_mini"])
def test_searchr1_parquet_read_as_verl_rlhf_dataset_does(bench: str, tmp_path: Path) -> None:
    """verl's RLHFDataset path (Search-R1's trainer): ``datasets`` parquet loader -> ``prompt`` messages for the chat
    template -> the reward picked by ``data_source`` (Search-R1's ``_select_rm_score_fn``: qa_em for these names)
    and called with ``reward_model['ground_truth']`` (its ``target`` list)."""
    import datasets

    out = tmp_path / f"{bench}.parquet"
    export_dataset("searchr1-parquet", bench, out, limit=3)
    ds = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert len(ds) == 3
    for row in ds:
        messages = row["prompt"]
        assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in messages)
        assert messages[-1]["role"] == "user"
        assert row["data_source"] in SEARCHR1_QA_SOURCES  # else Search-R1 raises NotImplementedError
        target = row["reward_model"]["ground_truth"]["target"]
        assert isinstance(target, list) and target and all(isinstance(t, str) for t in target)
        assert isinstance(row["extra_info"]["index"], int)


FLASHRAG_ITEM_KEYS = {"id", "question", "golden_answers", "choices", "metadata", "output"}


def test_flashrag_jsonl_has_flashrag_item_shape(tmp_path: Path) -> None:
    """FlashRAG's ``Dataset`` reads one ``json.loads`` per line into an ``Item`` (id, question, golden_answers list,
    metadata dict; choices/output optional): the export has exactly that shape."""
    import json

    export_dataset("flashrag", "bamboogle_mini", tmp_path / "b.jsonl", limit=4)
    lines = (tmp_path / "b.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4
    for line in lines:
        item = json.loads(line)
        assert set(item) <= FLASHRAG_ITEM_KEYS and {"id", "question", "golden_answers"} <= set(item)
        assert isinstance(item["golden_answers"], list) and all(isinstance(a, str) for a in item["golden_answers"])
        assert isinstance(item["metadata"], dict) and item["question"].strip()
