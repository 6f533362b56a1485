"""Peak memory and time of the EM scoring step (answer-only gold log-likelihood), before and after keeping logits only
at the scored positions.

The baseline is measured in the same run: the same model behind a forward without ``logits_to_keep``, so the full
``B x T x vocab`` logits are materialised as before the change. Each variant runs in its own child process (peak RSS
is per process). SmolLM2-135M, synthetic chats of ``--tokens`` tokens with a short gold answer, the preset's
``batch_tokens``. Example (idle machine):

    PYTHONPATH=. python benchmarks/scoring_memory.py --n 32 --tokens 700 --batch-tokens 8192
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _child(variant: str, n: int, tokens: int, batch_tokens: int) -> dict[str, Any]:
    import torch

    from training.em.scoring import ScoringConfig, ScoringInput, score_trajectories
    from training.generation.models import load_tokenizer, resolve_model

    torch.set_num_threads(int(os.environ.get("SEARCHLOOP_TORCH_THREADS", "1")))
    path = str(resolve_model("smollm2"))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    tok = load_tokenizer(path)

    class FullLogits(torch.nn.Module):
        """The model behind a forward without ``logits_to_keep``: full logits, as before the change."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any = None) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    scorer = FullLogits(model) if variant == "full_logits" else model
    filler = " ".join(["the search returned a passage about a river in France"] * (tokens // 10))
    items = [ScoringInput(trajectory_id=str(i), question_id=str(i // 4),
                          messages=[{"role": "user", "content": f"Question {i}: where is it?"},
                                    {"role": "assistant", "content": f"<search>{filler}</search> The answer is x"}],
                          gold_answer="Paris, France") for i in range(n)]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    out = score_trajectories(items, path, ScoringConfig(tokens="answer", batch_tokens=batch_tokens,
                                                        max_length=4096), model=scorer, tokenizer=tok)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"variant": variant, "seconds": round(seconds, 2), "peak_rss_mb": round(peak / 1024, 1),
            "rss_growth_mb": round((peak - base) / 1024, 1),
            "scores": [round(r.sum_logprob, 4) for r in out]}


def main() -> None:
    """Run both variants in child processes and print their numbers and the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=32, help="Trajectories to score.")
    ap.add_argument("--tokens", type=int, default=700, help="Approximate tokens per trajectory.")
    ap.add_argument("--batch-tokens", type=int, default=8192, help="ScoringConfig.batch_tokens (padded B x T).")
    ap.add_argument("--child", choices=["full_logits", "scored_positions"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.n, args.tokens, args.batch_tokens)))
        return
    res = {}
    for variant in ("full_logits", "scored_positions"):
        cmd = [sys.executable, __file__, "--child", variant, "--n", str(args.n), "--tokens", str(args.tokens),
               "--batch-tokens", str(args.batch_tokens)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
        res[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    full, kept = res["full_logits"], res["scored_positions"]
    same = all(abs(a - b) <= 1e-3 * max(1.0, abs(a)) for a, b in zip(full["scores"], kept["scores"], strict=True))
    for r in (full, kept):
        r.pop("scores")
    print(json.dumps({"full_logits": full, "scored_positions": kept, "same_scores": same,
                      "rss_growth_ratio": round(full["rss_growth_mb"] / max(kept["rss_growth_mb"], 1.0), 1),
                      "speedup": round(full["seconds"] / max(kept["seconds"], 1e-6), 2)}, indent=2))


if __name__ == "__main__":
    main()
