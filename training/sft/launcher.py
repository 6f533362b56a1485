"""LLaMA-Factory launcher: render dataset_info.json + training YAML from ``SFTConfig``, run it, return a CheckpointRef.

Data format: one JSON object per line, ``{"messages": [{"role": "system"|"user"|"assistant"|"observation",
"content": ...}, ...], "weight"?: float, "prob"?: float}`` (ShareGPT layout with OpenAI role names, registered in
``dataset_info.json`` as ``formatting: sharegpt`` with explicit tags). Turns must alternate user/observation then
assistant after an optional leading system turn. LLaMA-Factory supervises **every assistant turn** (``mask_history``
off) and masks system, user and observation turns from the loss (labels -100). ExSearch's retrieved documents sit
in user turns (``<SEARCH> ...``), so they are masked, as in the seed.

Pre-tokenized data (``train_sft_tokenized``): rows with ``input_ids`` and ``labels`` (``-100`` on every token that is
not entirely model-generated), rendered by the rollout engine for single-stream protocols (ReSearch, Search-R1,
R1-Searcher, SmartSearch; ``training.warmup.renderers``). Their documents sit *inside* the assistant's text, so
LLaMA-Factory's role turns could not reproduce the rollout text (an ``observation`` turn adds its own template
tokens); instead the rows are saved as a ``datasets`` folder and passed as ``tokenized_path``, which LLaMA-Factory
loads without re-tokenizing, and the run goes through ``training.sft.lf_weighted`` (its SFT workflow, our trainer with
every weight 1). Train and rollout text are then byte-identical and the masks are the rollout's own.

The engine runs as a subprocess: ``llamafactory-cli train run.yaml`` for plain SFT (warm-up) or
``python -m training.sft.lf_weighted run.yaml`` for the weighted M-step (``torchrun`` when ``nproc_per_node > 1``).
Its environment carries ``MLFLOW_TRACKING_URI``/``MLFLOW_RUN_ID`` so ``report_to: mlflow`` logs into our stage run,
and the torchaudio stub on ``PYTHONPATH`` when no real torchaudio is installed (CPU env). LoRA adapters are merged
into a full checkpoint (``model/``) so the next sampling round can load it like any model. ``manifest.json`` last.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import orjson

from infra import artifacts, progress
from infra.config import config_hash
from infra.errors import ArtifactError, ConfigError
from infra.settings import REPO_ROOT
from training.refs import CheckpointRef
from training.sft.config import SFTConfig

log = logging.getLogger(__name__)

STUB_DIR = Path(__file__).resolve().parent / "_stubs"
PROGRESS_POLL_S = 2.0
DATASET_NAME = "searchloop_train"
IGNORE_INDEX = -100


def render_dataset_info(file_name: str, name: str = DATASET_NAME) -> dict[str, Any]:
    """``dataset_info.json`` content registering one multi-turn chat file (see module docstring)."""
    return {
        name: {
            "file_name": file_name,
            "formatting": "sharegpt",
            "columns": {"messages": "messages"},
            "tags": {
                "role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
                "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system",
            },
        }
    }


def deepspeed_config(stage: Literal["z2", "z3"]) -> dict[str, Any]:
    """A DeepSpeed ZeRO config with ``auto`` values resolved by the HF integration."""
    zero: dict[str, Any] = {"stage": 2 if stage == "z2" else 3, "overlap_comm": False, "contiguous_gradients": True}
    if stage == "z3":
        zero |= {"stage3_gather_16bit_weights_on_model_save": True, "stage3_param_persistence_threshold": "auto"}
    return {
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "zero_allow_untested_optimizer": True, "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"}, "zero_optimization": zero,
    }


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def sft_bf16(cfg: SFTConfig) -> bool:
    """``cfg.bf16`` with ``auto`` decided on this machine (the engine subprocess runs here): native bf16 or not."""
    if cfg.bf16 != "auto":
        return bool(cfg.bf16)
    from infra.machine import native_bf16

    return native_bf16()


def render_train_args(
    cfg: SFTConfig, model_path: str, dataset_dir: str, output_dir: str, run_name: str = "sft",
    deepspeed_path: str | None = None, dataset: str = DATASET_NAME,
) -> dict[str, Any]:
    """The LLaMA-Factory training arguments (the YAML body) for one run."""
    args: dict[str, Any] = {
        "model_name_or_path": model_path, "trust_remote_code": False, "stage": "sft", "do_train": True,
        "finetuning_type": cfg.finetuning_type, "dataset": dataset, "dataset_dir": dataset_dir,
        "template": cfg.template, "cutoff_len": cfg.cutoff_len, "overwrite_cache": True,
        "preprocessing_num_workers": 1, "dataloader_num_workers": 0, "output_dir": output_dir,
        "overwrite_output_dir": True, "logging_steps": cfg.logging_steps, "save_strategy": "no", "plot_loss": False,
        "report_to": "mlflow" if cfg.report_to_mlflow else "none", "run_name": run_name,
        "per_device_train_batch_size": cfg.per_device_train_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "learning_rate": cfg.learning_rate,
        "num_train_epochs": cfg.num_train_epochs, "max_steps": cfg.max_steps,
        "lr_scheduler_type": cfg.lr_scheduler_type, "warmup_ratio": cfg.warmup_ratio, "bf16": sft_bf16(cfg),
        "fp16": False, "seed": cfg.seed, "ddp_timeout": 180000000,
    }
    if not cfg.gradient_checkpointing:
        args["disable_gradient_checkpointing"] = True
    if args["bf16"] and not _cuda():
        args["use_cpu"] = True  # transformers refuses bf16 without a GPU unless the run is declared CPU-only
    if cfg.finetuning_type == "lora":
        args |= {"lora_rank": cfg.lora_rank, "lora_alpha": cfg.lora_alpha, "lora_target": cfg.lora_target}
    if cfg.max_samples is not None:
        args["max_samples"] = cfg.max_samples
    if deepspeed_path:
        args["deepspeed"] = deepspeed_path
    return args


def needs_torchaudio_stub() -> bool:
    """True when no real torchaudio is importable (absent, or only our stub is on sys.path)."""
    spec = importlib.util.find_spec("torchaudio")
    return spec is None or str(STUB_DIR) in str(spec.origin)


def engine_environment(mlflow_run_id: str | None = None, experiment: str | None = None) -> dict[str, str]:
    """Environment for the engine subprocess: repo + (if needed) torchaudio stub on PYTHONPATH, MLflow join, offline."""
    env = dict(os.environ)
    paths = [str(REPO_ROOT)]
    if needs_torchaudio_stub():
        paths.insert(0, str(STUB_DIR))
    env["PYTHONPATH"] = os.pathsep.join([*paths, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["DISABLE_VERSION_CHECK"] = env.get("DISABLE_VERSION_CHECK", "0")
    from infra.settings import get_settings

    env["MLFLOW_TRACKING_URI"] = get_settings().tracking_uri
    if mlflow_run_id:
        env["MLFLOW_RUN_ID"] = mlflow_run_id
    else:
        env.pop("MLFLOW_RUN_ID", None)
    if experiment:
        env["MLFLOW_EXPERIMENT_NAME"] = experiment
    return env


def engine_command(yaml_path: Path, cfg: SFTConfig, weight_mode: str | None) -> list[str]:
    """The subprocess argv: llamafactory-cli (plain) or our weighted launcher (torchrun when multi-GPU)."""
    if weight_mode is None:
        cli = Path(sys.executable).with_name("llamafactory-cli")
        if not cli.exists():
            raise ConfigError(f"{cli} not found; install llamafactory==0.9.5 --no-deps (requirements/cpu-nodeps.txt)")
        return [str(cli), "train", str(yaml_path)]
    tail = ["-m", "training.sft.lf_weighted", str(yaml_path), "--weight-mode", weight_mode]
    if cfg.nproc_per_node > 1:
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={cfg.nproc_per_node}", *tail]
    return [sys.executable, *tail]


def merge_lora(base_model: str, adapter_dir: str, out_dir: str) -> None:
    """Merge a LoRA adapter into its base model and save a full HF checkpoint (with the tokenizer)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base_model, torch_dtype="auto")
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    merged.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(adapter_dir).save_pretrained(out_dir)


def read_loss_curve(output_dir: Path) -> list[dict[str, Any]]:
    """LLaMA-Factory's ``trainer_log.jsonl`` rows that carry a loss (step, loss, lr...); empty if absent."""
    path = output_dir / "trainer_log.jsonl"
    return [r for r in artifacts.read_jsonl(path) if r.get("loss") is not None] if path.exists() else []


def train_sft(
    cfg: SFTConfig, data_path: str | Path, base_model: str, out_dir: str | Path,
    weight_mode: str | None = None, mlflow_run_id: str | None = None, run_name: str = "sft",
) -> CheckpointRef:
    """Run one LLaMA-Factory SFT (``weight_mode=None``) or weighted alignment run; skip if already complete.

    Args:
        cfg: engine settings.
        data_path: JSONL chat file (``messages`` and optional ``weight``/``prob``).
        base_model: HF folder to start from.
        out_dir: stage directory; ``model/`` holds the result, ``manifest.json`` is written last.
        weight_mode: ``None`` (plain SFT), ``precomputed`` or ``exsearch_released_buggy``.
        mlflow_run_id: MLflow run the engine reports into.
        run_name: run name shown by the engine.

    Returns:
        CheckpointRef of ``out_dir/model``.
    """
    def write_data(data_dir: Path) -> tuple[int, dict[str, Any]]:
        rows = artifacts.read_jsonl(data_path)
        if not rows:
            raise ArtifactError(f"{data_path} holds no training examples; the selection step kept nothing")
        artifacts.write_jsonl(data_dir / "train.jsonl", rows)
        return len(rows), {}

    return _run_training(cfg, write_data, base_model, out_dir, weight_mode, mlflow_run_id, run_name)


def write_tokenized_dataset(rows: list[dict[str, Any]], path: str | Path, cutoff_len: int) -> dict[str, int]:
    """Save ``input_ids``/``labels`` rows as a ``datasets`` folder LLaMA-Factory loads via ``tokenized_path``.

    Rows longer than ``cutoff_len`` are dropped, not truncated (a truncated warm-up trajectory would lose its
    answer), as are rows with no supervised token. Every row gets ``weight`` 1 (the weighted collator's column).
    Returns ``{"kept", "over_cutoff", "no_labels"}``.
    """
    from datasets import Dataset

    keep, over, empty = [], 0, 0
    for r in rows:
        if len(r["input_ids"]) != len(r["labels"]):
            raise ArtifactError(f"row {r.get('question_id')}: {len(r['input_ids'])} input_ids vs "
                                f"{len(r['labels'])} labels; rebuild the data with training.warmup.renderers")
        if len(r["input_ids"]) > cutoff_len:
            over += 1
        elif all(lab == IGNORE_INDEX for lab in r["labels"]):
            empty += 1
        else:
            keep.append(r)
    if not keep:
        raise ArtifactError(f"no tokenized example fits cutoff_len={cutoff_len} ({over} longer, {empty} without "
                            "supervised tokens); raise sft.cutoff_len or shorten the trajectories (fewer documents)")
    Dataset.from_dict({
        "input_ids": [r["input_ids"] for r in keep], "attention_mask": [[1] * len(r["input_ids"]) for r in keep],
        "labels": [r["labels"] for r in keep], "weight": [float(r.get("weight", 1.0)) for r in keep],
        "prob": [float("nan")] * len(keep),
    }).save_to_disk(str(path))
    return {"kept": len(keep), "over_cutoff": over, "no_labels": empty}


def train_sft_tokenized(
    cfg: SFTConfig, data_path: str | Path, base_model: str, out_dir: str | Path,
    mlflow_run_id: str | None = None, run_name: str = "sft",
) -> CheckpointRef:
    """SFT on pre-tokenized rows (``input_ids``, ``labels`` with -100 on inserted text) through LLaMA-Factory's
    SFT workflow with our trainer (``training.sft.lf_weighted``, every weight 1); skip if already complete.

    The rows come from the rollout engine (``training.warmup.renderers``), so the trained text is byte-identical to
    what a rollout of the protocol produces and the documents are masked token by token; LLaMA-Factory's own
    tokenization (chat template, role turns) is bypassed with ``tokenized_path``. Returns ``out_dir/model``.
    """
    def write_data(data_dir: Path) -> tuple[int, dict[str, Any]]:
        rows = artifacts.read_jsonl(data_path)
        counts = write_tokenized_dataset(rows, data_dir / "tokenized", cfg.cutoff_len)
        log.info("tokenized SFT data: %s", counts)
        return counts["kept"], {"tokenized_path": str(data_dir / "tokenized")}

    return _run_training(cfg, write_data, base_model, out_dir, "precomputed", mlflow_run_id, run_name)


def _run_training(
    cfg: SFTConfig, write_data: Any, base_model: str, out_dir: str | Path, weight_mode: str | None,
    mlflow_run_id: str | None, run_name: str,
) -> CheckpointRef:
    out = Path(out_dir)
    done = artifacts.read_manifest(out)
    if done is not None:
        log.info("skipping train_sft: already complete at %s", out)
        return CheckpointRef.model_validate(done["checkpoint"])
    if out.exists():
        shutil.rmtree(out)  # a half-written attempt: redo from scratch
    data_dir, engine_dir = out / "data", out / "engine"
    data_dir.mkdir(parents=True)
    n_rows, extra_args = write_data(data_dir)
    artifacts.write_json(data_dir / "dataset_info.json", render_dataset_info("train.jsonl"))
    ds_path = None
    if cfg.deepspeed != "none":
        ds_path = str(out / "deepspeed.json")
        artifacts.write_json(ds_path, deepspeed_config(cfg.deepspeed))
    args = render_train_args(cfg, base_model, str(data_dir), str(engine_dir), run_name, ds_path) | extra_args
    yaml_path = out / "train.yaml"
    artifacts.write_text(yaml_path, _dump_yaml(args))
    _run_engine(engine_command(yaml_path, cfg, weight_mode), engine_environment(mlflow_run_id), out, cfg.timeout_s,
                name=f"sft {run_name}")
    model_dir = out / "model"
    if cfg.finetuning_type == "lora" and cfg.merge_lora:
        merge_lora(base_model, str(engine_dir), str(model_dir))
    else:
        shutil.copytree(engine_dir, model_dir)
    curve = read_loss_curve(engine_dir)
    artifacts.write_jsonl(out / "loss_curve.jsonl", curve)
    losses = [r["loss"] for r in curve if r.get("loss") is not None]
    ref = CheckpointRef(uri=str(model_dir), base_model=base_model, engine="llamafactory", stage_dir=str(out),
                        train_loss=losses[-1] if losses else None, n_examples=n_rows, config_hash=config_hash(cfg))
    artifacts.write_manifest(out, stage="train_sft", checkpoint=ref.model_dump(), weight_mode=weight_mode,
                             engine_args=args)
    return ref


def _dump_yaml(args: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(args, sort_keys=False)


def _die_with_parent_hook() -> Any:
    """Linux: a preexec hook that makes the engine receive SIGKILL when the launching process dies (kill -9 of a
    flow must not leave an orphan trainer writing into a stage directory the resumed run is about to redo).
    libc is loaded here, in the parent, so the hook itself does no import between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import signal

    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None
    sig = int(signal.SIGKILL)
    return lambda: prctl(1, sig)  # PR_SET_PDEATHSIG


def _report_steps(engine_dir: Path, bar: progress.Tracker) -> None:
    """Steps done / total and the loss from the last line of LLaMA-Factory's ``trainer_log.jsonl`` (its
    ``LogCallback`` appends one every ``logging_steps`` while it trains)."""
    path = engine_dir / "trainer_log.jsonl"
    if not path.exists():
        return
    lines = path.read_bytes().strip().splitlines()
    try:
        last = orjson.loads(lines[-1]) if lines else None
    except orjson.JSONDecodeError:  # a line being written
        return
    if last and last.get("current_steps") is not None:
        loss = last.get("loss")
        bar.update(float(last["current_steps"]), total=float(last.get("total_steps") or 0) or None,
                   note=f"loss {loss:.4g}" if isinstance(loss, int | float) else None)


def _run_engine(cmd: list[str], env: dict[str, str], out: Path, timeout_s: int, name: str = "sft") -> None:
    """Run the engine subprocess, its output to ``out/engine.log``; its steps are the progress loop ``name``
    (``infra.progress``: timer lines in the terminal and in the Prefect run log, a progress artifact)."""
    log_path = out / "engine.log"
    start = time.monotonic()
    log.info("running %s (log: %s)", " ".join(cmd), log_path)
    with open(log_path, "w", encoding="utf-8") as fh, progress.track(name, unit="step") as bar:
        proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), env=env, stdout=fh, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent_hook())
        while True:
            try:
                proc.wait(timeout=PROGRESS_POLL_S)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() - start > timeout_s:
                    proc.kill()
                    proc.wait()
                    raise subprocess.TimeoutExpired(cmd, timeout_s) from None
                _report_steps(out / "engine", bar)
        _report_steps(out / "engine", bar)
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise ArtifactError(f"LLaMA-Factory exited with {proc.returncode} after {time.monotonic() - start:.0f}s; "
                            f"see {log_path}. Last output:\n{tail}")
    log.info("engine finished in %.1fs", time.monotonic() - start)
