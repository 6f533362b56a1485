"""SmartSearch stage-2 LoRA DPO through TRL and LLaMA-Factory in one run: same pairs, same settings, same base model.

The issue says "LoRA DPO (LLaMA-Factory or TRL: pick by measurement)"; this is the measurement. Engines:

- ``trl``: our ``training.smartsearch.dpo.train_dpo`` (TRL ``DPOTrainer``, adapter merged in process), run in a child
  process of this script;
- ``llamafactory``: ``llamafactory-cli train`` with ``stage: dpo`` on a pairwise alpaca dataset (``ranking: true``,
  columns ``instruction``/``chosen``/``rejected``), then ``training.sft.launcher.merge_lora`` in a second child.

Both children get ``training.sft.launcher.engine_environment()`` (torchaudio stub on ``PYTHONPATH`` in the CPU env).
Settings shared through one ``DPOSpec``: LoRA rank/alpha on all linear modules, sigmoid loss, beta, lr (cosine,
10% warm-up), steps, micro-batch, accumulation, max length (LLaMA-Factory ``cutoff_len``), seed.

Same token streams: the pairs are raw text with the SmartSearch prompt already rendered through the chat template,
so LLaMA-Factory uses its ``empty`` template (the prompt is the user turn's text, the response the assistant's, no
role tokens). TRL appends EOS to each response and LLaMA-Factory's ``empty`` template does not, so the EOS token's
text is appended to LLaMA-Factory's responses. LLaMA-Factory saves what it tokenized (``tokenized_path``); the run
compares it with TRL's own ``DPOTrainer.tokenize_row`` (prompt ids, chosen ids, rejected ids) and reports
``token_streams.identical``. Pairs longer than the max length are counted: the engines truncate them differently
(TRL keeps the end of prompt+response, LLaMA-Factory shortens prompt and response in proportion).

Measured per engine: wall seconds from the first child's start to the merged model on disk, CPU seconds (user +
system; on a shared machine wall time mostly measures the scheduler, CPU time less so), peak RSS of the engine
processes (``os.wait4`` rusage of each child, the max over the engine's children), per-step loss, reward margin and
accuracy (both engines log TRL's ``rewards/*``), and whether the merged model loads and generates (checked after
timing). Pairs: SmartSearch prompts over ``data/train/hotpotqa_train_mini.jsonl``; chosen = search, the question's
supporting passages in a ``<result>`` block, the gold answer boxed; rejected = the same with another question's answer.

Usage (quiet machine; a few minutes on 2 cores):

    PYTHONPATH=. python benchmarks/dpo_engines.py --out dpo_engines.json
    PYTHONPATH=. python benchmarks/dpo_engines.py --pairs 4 --steps 1 --grad-accum 1   # quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from infra import artifacts  # noqa: E402
from training.sft.config import SFTConfig  # noqa: E402
from training.sft.launcher import render_train_args  # noqa: E402
from training.smartsearch.config import DPOSpec  # noqa: E402

ENGINES = ("trl", "llamafactory")
DATASET = "searchloop_dpo"
QUESTIONS = REPO / "data" / "train" / "hotpotqa_train_mini.jsonl"
CORPUS = REPO / "data" / "train" / "corpus_train_mini.jsonl"
METRICS = ("loss", "rewards/margins", "rewards/accuracies", "rewards/chosen", "rewards/rejected")


def build_pairs(n: int, tokenizer: Any, docs: int = 2) -> list[dict[str, str]]:
    """``n`` deterministic SmartSearch pairs (prompt/chosen/rejected text) from the shipped hotpotqa train mini."""
    from retrieval.types import Hit
    from training.protocols.smartsearch import SmartSearchProtocol

    rows = artifacts.read_jsonl(QUESTIONS)
    if n > len(rows):
        raise ValueError(f"--pairs {n}: {QUESTIONS.name} holds {len(rows)} questions; ask for at most that many")
    passages = {p["id"]: p for p in artifacts.read_jsonl(CORPUS)}
    proto = SmartSearchProtocol()
    pairs = []
    for i, row in enumerate(rows[:n]):
        hits = [Hit(id=d, title=passages[d]["title"], text=passages[d]["text"], score=1.0)
                for d in row["supporting_doc_ids"][:docs] if d in passages]
        query = row["question"]
        head = (f" I should look this up. </think>\n<search> {query} </search>{proto.result_text(query, hits)}"
                "<think> The passages give the answer. </think> <answer> \\boxed{")
        wrong = rows[(i + 1) % len(rows)]["golden_answers"][0]
        pairs.append({"prompt": proto.build_prompt(query, tokenizer),
                      "chosen": head + row["golden_answers"][0] + "} </answer>",
                      "rejected": head + wrong + "} </answer>"})
    return pairs


def lf_rows(pairs: list[dict[str, str]], eos_token: str) -> list[dict[str, str]]:
    """Pairwise alpaca rows; responses end with the EOS text (TRL appends the EOS id, the ``empty`` template not)."""
    return [{"instruction": p["prompt"], "chosen": p["chosen"] + eos_token, "rejected": p["rejected"] + eos_token}
            for p in pairs]


def lf_dataset_info(file_name: str, name: str = DATASET) -> dict[str, Any]:
    """``dataset_info.json`` registering one pairwise alpaca file (LLaMA-Factory 0.9.5 ``data/README.md``)."""
    return {name: {"file_name": file_name, "formatting": "alpaca", "ranking": True,
                   "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}}}


def lf_train_args(spec: DPOSpec, model_path: str, dataset_dir: str, output_dir: str,
                  tokenized_path: str | None = None) -> dict[str, Any]:
    """LLaMA-Factory DPO arguments: our SFT renderer with the DPO stage, ``empty`` template and ``spec``'s settings."""
    sft = SFTConfig(template="empty", lora_rank=spec.lora_rank, lora_alpha=spec.lora_alpha, lora_target="all",
                    learning_rate=spec.learning_rate, num_train_epochs=spec.num_train_epochs,
                    max_steps=spec.max_steps, lr_scheduler_type="cosine", warmup_ratio=0.1,
                    cutoff_len=spec.max_length, per_device_train_batch_size=spec.per_device_train_batch_size,
                    gradient_accumulation_steps=spec.gradient_accumulation_steps, seed=spec.seed,
                    report_to_mlflow=False)
    args = render_train_args(sft, model_path, dataset_dir, output_dir, run_name="dpo", dataset=DATASET)
    args |= {"stage": "dpo", "pref_beta": spec.beta, "pref_loss": spec.loss_type, "pref_ftx": 0.0,
             "lora_dropout": 0.0}
    if tokenized_path:
        args["tokenized_path"] = tokenized_path
    return args


def trl_token_streams(pairs: list[dict[str, str]], tokenizer: Any) -> list[dict[str, list[int]]]:
    """What TRL trains on: ``DPOTrainer.tokenize_row`` with the arguments ``DPOTrainer`` passes (decoder-only)."""
    from trl import DPOTrainer

    return [DPOTrainer.tokenize_row(p, tokenizer, max_prompt_length=None, max_completion_length=None,
                                    add_special_tokens=False) for p in pairs]


def lf_token_streams(tokenized_path: str | Path) -> list[dict[str, list[int]]]:
    """What LLaMA-Factory trained on, split like TRL's rows (the prompt is where the labels start)."""
    from datasets import load_from_disk

    ds = load_from_disk(str(tokenized_path))
    ds = ds["train"] if hasattr(ds, "keys") and "train" in ds else ds
    out = []
    for r in ds:
        n = next(i for i, lab in enumerate(r["chosen_labels"]) if lab != -100)
        out.append({"prompt_input_ids": r["chosen_input_ids"][:n], "chosen_input_ids": r["chosen_input_ids"][n:],
                    "rejected_input_ids": r["rejected_input_ids"][n:]})
    return out


def compare_streams(trl: list[dict[str, list[int]]], lf: list[dict[str, list[int]]], max_length: int) -> dict[str, Any]:
    """Equality of the two engines' token ids per pair; the first difference when there is one."""
    keys = ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")
    over = sum(len(t["prompt_input_ids"]) + max(len(t["chosen_input_ids"]), len(t["rejected_input_ids"])) > max_length
               for t in trl)
    res: dict[str, Any] = {"pairs_trl": len(trl), "pairs_llamafactory": len(lf), "over_max_length": over,
                           "tokens_per_pair": [len(t["prompt_input_ids"]) + len(t["chosen_input_ids"]) for t in trl]}
    first = None
    for i, (a, b) in enumerate(zip(trl, lf, strict=False)):
        for k in keys:
            if a[k] != b[k] and first is None:
                j = next((j for j, (x, y) in enumerate(zip(a[k], b[k], strict=False)) if x != y),
                         min(len(a[k]), len(b[k])))
                first = {"pair": i, "field": k, "position": j, "trl": a[k][j:j + 8], "llamafactory": b[k][j:j + 8],
                         "len_trl": len(a[k]), "len_llamafactory": len(b[k])}
    res["identical"] = first is None and len(trl) == len(lf)
    res["first_difference"] = first
    return res


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, float, float]:
    """Run one child to completion; (wall seconds, CPU seconds, peak RSS MiB) from its ``wait4`` rusage (the child
    and its descendants). Raises on failure."""
    t0 = time.perf_counter()
    with open(log, "a", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:3])} exited with {proc.returncode}; see {log}. Last output:\n{tail}")
    return secs, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def _steps(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"step": h.get("step"), **{k: round(float(h[k]), 5) for k in METRICS if k in h}}
            for h in history if "loss" in h]


def run_trl(spec: DPOSpec, model: str, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """TRL through ``train_dpo`` in a child; merged model in ``work/trl/model``."""
    cmd = [sys.executable, __file__, "--child", "trl", "--work", str(work), "--model", model]
    secs, cpu, peak = _spawn(cmd, env, work / "trl.log")
    history = artifacts.read_jsonl(work / "trl" / "loss_curve.jsonl")
    return {"wall_s": round(secs, 1), "cpu_s": round(cpu, 1), "peak_rss_mb": round(peak, 1), "steps": _steps(history),
            "model_dir": str(work / "trl" / "model")}


def run_llamafactory(spec: DPOSpec, model: str, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """``llamafactory-cli train`` (stage dpo) then ``merge_lora`` in a second child; model in ``work/lf/model``."""
    from training.sft.launcher import engine_command

    lf = work / "lf"
    data = lf / "data"
    data.mkdir(parents=True)
    from training.generation.models import load_tokenizer

    eos = load_tokenizer(model).eos_token
    artifacts.write_jsonl(data / "pairs.jsonl", lf_rows(artifacts.read_jsonl(work / "pairs.jsonl"), eos))
    artifacts.write_json(data / "dataset_info.json", lf_dataset_info("pairs.jsonl"))
    args = lf_train_args(spec, model, str(data), str(lf / "engine"), str(lf / "tokenized"))
    yaml_path = lf / "train.yaml"
    import yaml

    artifacts.write_text(yaml_path, yaml.safe_dump(args, sort_keys=False))
    train_s, train_cpu, train_peak = _spawn(engine_command(yaml_path, SFTConfig(), None), env, work / "lf.log")
    merge = [sys.executable, __file__, "--child", "merge", "--work", str(work), "--model", model]
    merge_s, merge_cpu, merge_peak = _spawn(merge, env, work / "lf.log")
    state = lf / "engine" / "trainer_state.json"
    history = json.loads(state.read_text())["log_history"] if state.exists() else []
    return {"wall_s": round(train_s + merge_s, 1), "train_s": round(train_s, 1), "merge_s": round(merge_s, 1),
            "cpu_s": round(train_cpu + merge_cpu, 1),
            "peak_rss_mb": round(max(train_peak, merge_peak), 1), "steps": _steps(history),
            "model_dir": str(lf / "model")}


def _summary(r: dict[str, Any]) -> None:
    last = r["steps"][-1] if r["steps"] else {}
    r["final_loss"] = last.get("loss")
    r["final_margin"] = last.get("rewards/margins")
    r["final_accuracy"] = last.get("rewards/accuracies")


def _child(kind: str, work: Path, model: str) -> None:
    import torch

    if kind == "trl":
        from training.smartsearch.dpo import train_dpo

        spec = DPOSpec.model_validate_json((work / "spec.json").read_text())
        train_dpo(spec, artifacts.read_jsonl(work / "pairs.jsonl"), model, work / "trl")
    elif kind == "merge":
        from training.sft.launcher import merge_lora

        merge_lora(model, str(work / "lf" / "engine"), str(work / "lf" / "model"))
    else:  # generate: does each merged model load and generate; how far did its weights move from the base
        from transformers import AutoModelForCausalLM, AutoTokenizer

        prompt = artifacts.read_jsonl(work / "pairs.jsonl")[0]["prompt"]
        base = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).state_dict()
        out = {}
        for name in ENGINES:
            path = work / ("trl" if name == "trl" else "lf") / "model"
            try:
                tok = AutoTokenizer.from_pretrained(str(path))
                m = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32)
                ids = tok(prompt, return_tensors="pt", add_special_tokens=False, return_token_type_ids=False)
                gen = m.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
                delta = max(float((p - base[k]).abs().max()) for k, p in m.state_dict().items() if k in base)
                out[name] = {"loads": True, "generates": gen.shape[1] > ids["input_ids"].shape[1],
                             "text": tok.decode(gen[0, ids["input_ids"].shape[1]:]), "max_abs_weight_change": delta}
            except Exception as exc:  # noqa: BLE001 - reported, not raised: the benchmark's answer for this engine
                out[name] = {"loads": False, "generates": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train both engines on the same pairs, compare their token streams, print and write the numbers."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=16, help="Pairs built from the hotpotqa train mini.")
    ap.add_argument("--steps", type=int, default=4, help="Optimizer steps (max_steps).")
    ap.add_argument("--batch-size", type=int, default=1, help="Pairs per micro-batch.")
    ap.add_argument("--grad-accum", type=int, default=4, help="Micro-batches per optimizer step.")
    ap.add_argument("--max-length", type=int, default=1024, help="Prompt + response token cutoff (both engines).")
    ap.add_argument("--lr", type=float, default=DPOSpec().learning_rate, help="Learning rate.")
    ap.add_argument("--docs", type=int, default=2, help="Supporting passages in each response's <result> block.")
    ap.add_argument("--model", default="smollm2", help="Base model (name or HF folder, via resolve_model).")
    ap.add_argument("--engines", default=",".join(ENGINES), help="Engines, in run order.")
    ap.add_argument("--work", type=Path, help="Working folder (default: a temporary one, removed at the end).")
    ap.add_argument("--out", type=Path, help="Write the results as JSON here.")
    ap.add_argument("--child", choices=["trl", "merge", "generate"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.work, args.model)
        return {}
    from training.generation.models import load_tokenizer, resolve_model
    from training.sft.launcher import engine_environment

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if unknown := sorted(set(engines) - set(ENGINES)):
        raise SystemExit(f"--engines: unknown {unknown}; choose from {list(ENGINES)}")
    model = str(resolve_model(args.model))
    spec = DPOSpec(max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                   gradient_accumulation_steps=args.grad_accum, max_length=args.max_length, learning_rate=args.lr)
    work = args.work or Path(tempfile.mkdtemp(prefix="dpo-engines-"))
    work.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(model)
    pairs = build_pairs(args.pairs, tok, args.docs)
    artifacts.write_jsonl(work / "pairs.jsonl", pairs)
    artifacts.write_text(work / "spec.json", spec.model_dump_json())
    env = engine_environment()
    runners = {"trl": run_trl, "llamafactory": run_llamafactory}
    res: dict[str, Any] = {"model": model, "pairs": len(pairs), "settings": spec.model_dump(), "work": str(work)}
    for name in engines:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        res[name] = runners[name](spec, model, work, env)
        _summary(res[name])
    if set(engines) == set(ENGINES):
        lf_streams = lf_token_streams(work / "lf" / "tokenized")
        res["token_streams"] = compare_streams(trl_token_streams(pairs, tok), lf_streams, spec.max_length)
        gen = subprocess.run([sys.executable, __file__, "--child", "generate", "--work", str(work), "--model", model],
                             check=True, capture_output=True, text=True, cwd=REPO, env=env)
        for name, check in json.loads(gen.stdout.strip().splitlines()[-1]).items():
            res[name]["merged_model"] = check
        res["ratio_llamafactory_over_trl"] = {
            "wall": round(res["llamafactory"]["wall_s"] / res["trl"]["wall_s"], 2),
            "cpu": round(res["llamafactory"]["cpu_s"] / max(res["trl"]["cpu_s"], 1e-6), 2),
            "peak_rss": round(res["llamafactory"]["peak_rss_mb"] / res["trl"]["peak_rss_mb"], 2)}
    print(json.dumps(res, indent=2))
    if "ratio_llamafactory_over_trl" in res:
        r = res["ratio_llamafactory_over_trl"]
        print(f"LLaMA-Factory / TRL: wall {r['wall']}x, CPU {r['cpu']}x, peak RSS {r['peak_rss']}x "
              f"(token streams identical: {res['token_streams']['identical']})")
    if args.out:
        artifacts.write_json(args.out, res)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return res


if __name__ == "__main__":
    main()
