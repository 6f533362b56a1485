"""Stage-2 LoRA DPO with TRL's ``DPOTrainer`` (in process), then the adapter merged into a full HF folder.

Why TRL and not LLaMA-Factory (the seed's engine): on this CPU machine a 2-step LoRA DPO of SmolLM2-135M over
4 pairs ran in process with TRL 0.24 / transformers 4.57.6 (see the report in ``docs/status-history.md``), without a
subprocess start or a second data format; LLaMA-Factory's DPO would need its pairwise dataset registration and the
torchaudio stub for the same result. ``benchmarks/dpo_engines.py`` trains both engines on the same pairs with the
same settings and checks that their token streams are identical; quiet, 16 pairs x 4 steps (session 9,
``docs/results/dpo_engines/dpo_engines.json``): TRL 143.9 s wall / 263 s CPU / 5.7 GB peak, LLaMA-Factory 181.0 s /
325 s / 3.6 GB, the same losses and margins at every step: TRL is kept for speed (LLaMA-Factory takes 1.26x the
wall time) where memory allows; LLaMA-Factory needs 0.63x the memory. The settings mirror the seed's
``qwen_lora_dpo.yaml`` (LoRA rank 8 on all linear modules, sigmoid loss, ``pref_beta`` 0.1, lr 7e-6, 3 epochs,
cutoff 10000).

Pairs are text: ``prompt`` (the protocol's prompt, ending with the generation ``<think>``), ``chosen`` and
``rejected`` responses. As in the seed, retrieved text inside the responses is not masked in DPO (the prompt and
the shared prefix cancel in the log-ratio difference; branches' own documents do not).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from infra import artifacts
from infra.config import config_hash
from infra.errors import ArtifactError
from training.refs import CheckpointRef
from training.smartsearch.config import DPOSpec

log = logging.getLogger(__name__)


def dpo_args(cfg: DPOSpec, output_dir: str, run_name: str = "dpo") -> Any:
    """TRL ``DPOConfig`` for our settings (CPU when there is no CUDA)."""
    import torch
    from trl import DPOConfig

    return DPOConfig(
        output_dir=output_dir, run_name=run_name, beta=cfg.beta, loss_type=cfg.loss_type,
        learning_rate=cfg.learning_rate, num_train_epochs=cfg.num_train_epochs, max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, max_length=cfg.max_length,
        max_prompt_length=None, lr_scheduler_type="cosine", warmup_ratio=cfg.warmup_ratio,
        seed=cfg.seed, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=not torch.cuda.is_available(), bf16=False, fp16=False,
        disable_tqdm=True, dataloader_num_workers=0, dataset_num_proc=None, gradient_checkpointing=False,
    )


def train_dpo(cfg: DPOSpec, pairs: list[dict[str, str]], base_model: str, out_dir: str | Path) -> CheckpointRef:
    """LoRA DPO from ``base_model`` on ``pairs`` (prompt/chosen/rejected); merged folder in ``out_dir/model``.

    Skipped when ``out_dir`` already has a manifest; a half-written attempt is redone from scratch.
    """
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOTrainer

    out = Path(out_dir)
    done = artifacts.read_manifest(out)
    if done is not None:
        return CheckpointRef.model_validate(done["checkpoint"])
    if not pairs:
        raise ArtifactError("no DPO pairs to train on; stage 2 built none (see pairs.jsonl and the counts)")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tok = AutoTokenizer.from_pretrained(base_model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(base_model)
    rows = [{"prompt": p["prompt"], "chosen": p["chosen"], "rejected": p["rejected"]} for p in pairs]
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules="all-linear",
                      task_type="CAUSAL_LM", lora_dropout=0.0)
    trainer = DPOTrainer(model=model, args=dpo_args(cfg, str(out / "engine")), train_dataset=Dataset.from_list(rows),
                         processing_class=tok, peft_config=lora)
    trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    artifacts.write_jsonl(out / "loss_curve.jsonl", history)
    merged = trainer.model.merge_and_unload()
    merged.save_pretrained(str(out / "model"))
    tok.save_pretrained(str(out / "model"))
    ref = CheckpointRef(uri=str(out / "model"), base_model=base_model, engine="trl", stage="dpo",
                        train_loss=history[-1]["loss"] if history else None, n_examples=len(rows),
                        config_hash=config_hash(cfg))
    artifacts.write_manifest(out, stage="train_dpo", checkpoint=ref.model_dump(), engine="trl",
                             last_metrics={k: v for k, v in (history[-1] if history else {}).items()
                                           if isinstance(v, (int, float))})
    return ref
