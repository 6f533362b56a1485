"""LLaMA-Factory launcher: rendered configs pass LLaMA-Factory's own parser; weights survive its data pipeline with
user turns masked; a real (tiny) LoRA SFT and a weighted alignment run on CPU with SmolLM2-135M."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

from infra import artifacts
from training.sft.launcher import (
    STUB_DIR,
    SFTConfig,
    deepspeed_config,
    render_dataset_info,
    render_train_args,
    train_sft,
)

CHATS = [
    {"messages": [
        {"role": "user", "content": "Who wrote Hamlet? Use search."},
        {"role": "assistant", "content": "<QUERY> author of Hamlet"},
        {"role": "user", "content": "<SEARCH> [0] Title: Hamlet. Content: Hamlet is a tragedy by William Shakespeare."},
        {"role": "assistant", "content": "<FACT> Hamlet was written by Shakespeare\n<FINAL>"},
        {"role": "user", "content": "<FINAL>\n<SEARCH> end search. please give the final answer: Who wrote Hamlet?"},
        {"role": "assistant", "content": "William Shakespeare"},
    ], "weight": 2.0, "prob": 0.5},
    {"messages": [{"role": "user", "content": "broken: ends on a user turn"}], "weight": 9.0},
    {"messages": [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "<QUERY> capital of France"},
        {"role": "user", "content": "<SEARCH> [0] Title: Paris. Content: Paris is the capital of France."},
        {"role": "assistant", "content": "Paris"},
    ], "weight": 0.5, "prob": 1.5},
]


@pytest.fixture(scope="module")
def lf_parser():
    sys.path.insert(0, str(STUB_DIR))
    pytest.importorskip("llamafactory")
    from llamafactory.hparams import get_train_args

    return get_train_args


def _dataset_dir(tmp_path: Path, rows=CHATS) -> Path:
    d = tmp_path / "data"
    artifacts.write_jsonl(d / "train.jsonl", rows)
    artifacts.write_json(d / "dataset_info.json", render_dataset_info("train.jsonl"))
    return d


@pytest.mark.parametrize("cfg", [
    SFTConfig(max_steps=2),
    SFTConfig(finetuning_type="full", learning_rate=2e-6, num_train_epochs=2, lr_scheduler_type="cosine",
              warmup_ratio=0.1, cutoff_len=8192, gradient_accumulation_steps=16, max_samples=300000),
], ids=["lora-demo", "full-paper"])
def test_rendered_args_pass_llamafactory_parser(lf_parser, smol_path, cfg, tmp_path) -> None:
    args = render_train_args(cfg, str(smol_path), str(_dataset_dir(tmp_path)), str(tmp_path / "out"))
    model_args, data_args, training_args, finetuning_args, _ = lf_parser(dict(args))
    assert finetuning_args.stage == "sft" and finetuning_args.finetuning_type == cfg.finetuning_type
    assert data_args.cutoff_len == cfg.cutoff_len and data_args.template == cfg.template
    assert training_args.learning_rate == cfg.learning_rate
    assert training_args.lr_scheduler_type.value == cfg.lr_scheduler_type
    assert training_args.report_to == ["mlflow"]
    assert training_args.remove_unused_columns is False  # what lets the weight column reach the collator
    assert model_args.trust_remote_code is False
    with pytest.raises(ValueError):  # and the parser is strict: an unknown key fails
        lf_parser({**args, "not_a_llamafactory_key": 1})


def test_deepspeed_config_renders() -> None:
    z3 = deepspeed_config("z3")
    assert z3["zero_optimization"]["stage"] == 3 and z3["train_micro_batch_size_per_gpu"] == "auto"
    args = render_train_args(SFTConfig(deepspeed="z2", bf16=True), "m", "d", "o", deepspeed_path="/x/ds.json")
    assert args["deepspeed"] == "/x/ds.json" and args["bf16"] is True


@pytest.mark.slow
def test_weights_survive_llamafactory_pipeline_and_user_turns_are_masked(lf_parser, smol_path, tmp_path) -> None:
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.model import load_tokenizer

    from training.sft.lf_weighted import install_weighting

    args = render_train_args(SFTConfig(cutoff_len=512), str(smol_path), str(_dataset_dir(tmp_path)),
                             str(tmp_path / "o"))
    model_args, data_args, training_args, _, _ = lf_parser(dict(args))
    restore = install_weighting("precomputed")
    try:
        tok_module = load_tokenizer(model_args)
        template = get_template_and_fix_tokenizer(tok_module["tokenizer"], data_args)
        ds = get_dataset(template, model_args, data_args, training_args, stage="sft", **tok_module)["train_dataset"]
    finally:
        restore()
    assert len(ds) == 2  # the broken row is dropped by LLaMA-Factory, and its weight with it
    assert ds["weight"] == [2.0, 0.5] and ds["prob"] == [0.5, 1.5]
    tok = tok_module["tokenizer"]
    supervised = tok.decode([t for t in ds[0]["labels"] if t != -100])
    for text in ("<QUERY> author of Hamlet", "<FACT> Hamlet was written by Shakespeare", "William Shakespeare"):
        assert text in supervised
    for masked in ("Who wrote Hamlet", "<SEARCH>", "Title: Hamlet"):  # user turns (documents) carry no loss
        assert masked not in supervised


@pytest.mark.slow
@pytest.mark.timeout(2400)  # real LLaMA-Factory runs; minutes on a busy 2-core machine
def test_weighted_alignment_run_on_cpu(smol_path, tmp_path) -> None:
    """One optimizer step of the weighted M-step through `python -m training.sft.lf_weighted` (real LLaMA-Factory)."""
    data = tmp_path / "chats.jsonl"
    artifacts.write_jsonl(data, [CHATS[0], CHATS[2]])
    cfg = SFTConfig(max_steps=1, cutoff_len=192, per_device_train_batch_size=2, report_to_mlflow=False,
                    timeout_s=600)
    ref = train_sft(cfg, data, str(smol_path), tmp_path / "align", weight_mode="precomputed")
    manifest = artifacts.read_manifest(tmp_path / "align")
    assert manifest["checkpoint"]["uri"] == ref.uri and manifest["weight_mode"] == "precomputed"
    assert ref.train_loss is not None and math.isfinite(ref.train_loss)
    assert (Path(ref.uri) / "model.safetensors").exists() and (Path(ref.uri) / "tokenizer_config.json").exists()
    assert [r["current_steps"] for r in artifacts.read_jsonl(tmp_path / "align" / "loss_curve.jsonl")] == [1]
    assert "weighted preprocessing" not in (tmp_path / "align" / "engine.log").read_text()
    # a complete stage is skipped on re-run (manifest present), returning the same ref
    assert train_sft(cfg, data, str(smol_path), tmp_path / "align", weight_mode="precomputed") == ref


def test_engine_run_reports_trainer_log_steps_and_times_out(tmp_path) -> None:
    """The engine subprocess is polled: LLaMA-Factory's trainer_log.jsonl steps become progress; the timeout holds."""
    import subprocess

    from infra import progress
    from training.sft import launcher

    (tmp_path / "engine").mkdir()
    script = ("import json, time\n"
              "for i in range(1, 4):\n"
              "    row = json.dumps({'current_steps': i, 'total_steps': 3})\n"
              "    open('engine/trainer_log.jsonl', 'a').write(row + '\\n')\n"
              "    time.sleep(0.3)\n")
    events: list[progress.ProgressEvent] = []
    progress.register_sink(events.append, 0.0)
    old, launcher.PROGRESS_POLL_S = launcher.PROGRESS_POLL_S, 0.1
    try:
        launcher._run_engine([sys.executable, "-c", f"import os; os.chdir({str(tmp_path)!r})\n" + script],
                             dict(os.environ), tmp_path, timeout_s=60)
        with pytest.raises(subprocess.TimeoutExpired):
            launcher._run_engine([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ), tmp_path,
                                 timeout_s=1)
    finally:
        launcher.PROGRESS_POLL_S = old
        progress.unregister_sink(events.append)
    first = next(e.key for e in events if e.name == "sft")
    steps = [e for e in events if e.key == first]
    assert steps[-1].done == 3 and steps[-1].total == 3 and any(0 < e.done < 3 for e in steps)


def test_bf16_auto_and_gradient_checkpointing_reach_the_engine(monkeypatch) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("infra.machine.cpu_flags", lambda: {"avx2"})
    args = render_train_args(SFTConfig(bf16="auto", gradient_checkpointing=False), "m", "d", "o")
    assert args["bf16"] is False and args["disable_gradient_checkpointing"] is True
    monkeypatch.setattr("infra.machine.cpu_flags", lambda: {"avx512_bf16"})
    args = render_train_args(SFTConfig(bf16="auto"), "m", "d", "o")
    assert args["bf16"] is True and "disable_gradient_checkpointing" not in args
    assert args["use_cpu"] is True  # transformers refuses bf16 on a machine without a GPU otherwise
