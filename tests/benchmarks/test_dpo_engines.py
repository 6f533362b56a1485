"""The DPO engine benchmark: its pairwise dataset and DPO arguments pass LLaMA-Factory's own parser, LLaMA-Factory's
data pipeline tokenizes the pairs exactly as TRL's ``DPOTrainer`` does, and the whole benchmark runs both engines
for two steps on a tiny random model (real ``llamafactory-cli``, real TRL, merged models generate)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from infra import artifacts
from training.sft.launcher import STUB_DIR
from training.smartsearch.config import DPOSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import dpo_engines  # noqa: E402


@pytest.fixture(scope="module")
def smol_path() -> Path:
    from training.generation.models import resolve_model

    return resolve_model("smollm2")


@pytest.fixture(scope="module")
def smol_tokenizer(smol_path):
    from training.generation.models import load_tokenizer

    return load_tokenizer(smol_path)


@pytest.fixture(scope="module")
def lf_parser():
    sys.path.insert(0, str(STUB_DIR))
    pytest.importorskip("llamafactory")
    from llamafactory.hparams import get_train_args

    return get_train_args


def _dataset_dir(tmp_path: Path, pairs: list[dict[str, str]], eos: str) -> Path:
    d = tmp_path / "data"
    artifacts.write_jsonl(d / "pairs.jsonl", dpo_engines.lf_rows(pairs, eos))
    artifacts.write_json(d / "dataset_info.json", dpo_engines.lf_dataset_info("pairs.jsonl"))
    return d


def test_pairs_are_deterministic_smartsearch_text(smol_tokenizer) -> None:
    pairs = dpo_engines.build_pairs(3, smol_tokenizer)
    assert pairs == dpo_engines.build_pairs(3, smol_tokenizer)
    for p in pairs:
        assert p["prompt"].startswith("<|im_start|>system") and p["prompt"].endswith("<|im_start|>assistant\n<think>")
        assert "<result>result: \n" in p["chosen"] and p["chosen"].endswith("} </answer>")
        head = p["chosen"][: p["chosen"].rindex("\\boxed{")]
        assert p["rejected"].startswith(head) and p["rejected"] != p["chosen"]  # only the answer differs
    rows = dpo_engines.lf_rows(pairs, "<|im_end|>")
    assert rows[0] == {"instruction": pairs[0]["prompt"], "chosen": pairs[0]["chosen"] + "<|im_end|>",
                       "rejected": pairs[0]["rejected"] + "<|im_end|>"}


def test_rendered_dpo_args_and_dataset_pass_llamafactory_parser(lf_parser, smol_path, smol_tokenizer,
                                                                tmp_path) -> None:
    from llamafactory.data.parser import get_dataset_list

    d = _dataset_dir(tmp_path, dpo_engines.build_pairs(2, smol_tokenizer), smol_tokenizer.eos_token)
    spec = DPOSpec(max_steps=3, max_length=900, learning_rate=5e-6, gradient_accumulation_steps=2, seed=7)
    args = dpo_engines.lf_train_args(spec, str(smol_path), str(d), str(tmp_path / "out"))
    model_args, data_args, training_args, finetuning_args, _ = lf_parser(dict(args))
    assert finetuning_args.stage == "dpo" and finetuning_args.finetuning_type == "lora"
    assert finetuning_args.pref_beta == spec.beta and finetuning_args.pref_loss == "sigmoid"
    assert finetuning_args.pref_ftx == 0.0 and finetuning_args.ref_model is None  # reference = adapter disabled
    assert finetuning_args.lora_rank == 8 and finetuning_args.lora_alpha == 16
    assert finetuning_args.lora_target == ["all"] and finetuning_args.lora_dropout == 0.0
    assert data_args.template == "empty" and data_args.cutoff_len == 900
    assert training_args.max_steps == 3 and training_args.learning_rate == 5e-6 and training_args.seed == 7
    assert training_args.gradient_accumulation_steps == 2 and training_args.per_device_train_batch_size == 1
    assert training_args.lr_scheduler_type.value == "cosine" and training_args.warmup_ratio == 0.1
    assert training_args.report_to in ([], ["none"])
    [attr] = get_dataset_list([dpo_engines.DATASET], str(d))
    assert attr.ranking is True and attr.formatting == "alpaca" and attr.load_from == "file"
    assert (attr.prompt, attr.chosen, attr.rejected, attr.query) == ("instruction", "chosen", "rejected", None)


@pytest.mark.slow
def test_llamafactory_pipeline_tokenizes_pairs_exactly_like_trl(lf_parser, smol_path, smol_tokenizer,
                                                                 tmp_path) -> None:
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.model import load_tokenizer

    pairs = dpo_engines.build_pairs(4, smol_tokenizer)
    d = _dataset_dir(tmp_path, pairs, smol_tokenizer.eos_token)
    args = dpo_engines.lf_train_args(DPOSpec(max_steps=1, max_length=2048), str(smol_path), str(d),
                                     str(tmp_path / "out"), tokenized_path=str(tmp_path / "tok"))
    model_args, data_args, training_args, _, _ = lf_parser(dict(args))
    tok_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tok_module["tokenizer"], data_args)
    get_dataset(template, model_args, data_args, training_args, stage="rm", **tok_module)  # what run_dpo calls
    lf = dpo_engines.lf_token_streams(tmp_path / "tok")
    trl = dpo_engines.trl_token_streams(pairs, smol_tokenizer)
    cmp = dpo_engines.compare_streams(trl, lf, 2048)
    assert cmp["identical"], cmp["first_difference"]
    assert cmp["pairs_llamafactory"] == 4 and cmp["over_max_length"] == 0
    assert trl[0]["chosen_input_ids"][-1] == smol_tokenizer.eos_token_id  # the EOS both engines end responses with
    # without the EOS text the streams differ exactly there (what the empty template alone would train on)
    bare = [{**t, "chosen_input_ids": t["chosen_input_ids"][:-1]} for t in trl]
    diff = dpo_engines.compare_streams(bare, lf, 2048)["first_difference"]
    assert diff["field"] == "chosen_input_ids" and diff["llamafactory"] == [smol_tokenizer.eos_token_id]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two real engine runs (subprocesses); minutes on a busy 2-core machine
def test_benchmark_runs_both_engines_on_a_tiny_model(smol_tokenizer, tmp_path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                      bos_token_id=smol_tokenizer.bos_token_id, eos_token_id=smol_tokenizer.eos_token_id,
                      pad_token_id=smol_tokenizer.pad_token_id, tie_word_embeddings=True)
    tiny = tmp_path / "tiny"
    LlamaForCausalLM(cfg).save_pretrained(tiny)
    smol_tokenizer.save_pretrained(tiny)
    res = dpo_engines.main(["--pairs", "2", "--steps", "2", "--grad-accum", "1", "--max-length", "1024",
                            "--lr", "1e-3", "--model", str(tiny), "--work", str(tmp_path / "w"),
                            "--out", str(tmp_path / "r.json")])
    assert artifacts.read_json(tmp_path / "r.json") == json_roundtrip(res)
    assert res["token_streams"]["identical"], res["token_streams"]["first_difference"]
    for name in ("trl", "llamafactory"):
        r = res[name]
        assert [s["step"] for s in r["steps"]] == [1, 2] and math.isfinite(r["final_loss"])
        # step 1 trains at lr 0 (cosine warm-up), so at both logged steps policy == reference: sigmoid loss = ln 2
        assert all(abs(s["loss"] - math.log(2)) < 1e-3 for s in r["steps"])
        assert r["final_margin"] == 0.0 and r["wall_s"] > 0 and r["peak_rss_mb"] > 50
        assert r["merged_model"]["loads"] and r["merged_model"]["generates"]
        assert r["merged_model"]["max_abs_weight_change"] > 0  # the merged adapter moved the weights
    lf = tmp_path / "w" / "lf"
    assert (lf / "model" / "model.safetensors").exists() and (lf / "engine" / "adapter_config.json").exists()
    assert artifacts.read_json(lf / "data" / "dataset_info.json")[dpo_engines.DATASET]["ranking"] is True
    assert res["ratio_llamafactory_over_trl"]["wall"] > 0


def json_roundtrip(obj: object) -> object:
    import json

    return json.loads(json.dumps(obj))
