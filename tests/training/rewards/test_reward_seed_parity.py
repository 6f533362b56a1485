"""Parity with the seeds' own reward and metric code on thousands of generated responses.

The seeds' source is read at test time from local git mirrors (``SEARCHLOOP_SEED_MIRRORS``, default
``/work/.mirror``; nothing of it is stored in this repository) and executed in a scratch module, with the imports
their servers need at start-up (openrlhf, datasets, transformers, uvicorn) removed. Skipped when the mirrors are
absent. The PRM of SmartSearch is unreachable here, which the seed's code turns into "no verdict" per round; our
reward gets the same with its default redundancy-only scorer.
"""

from __future__ import annotations

import os
import random
import subprocess
import types
from pathlib import Path

import pytest

from evaluation import metrics as M
from training import rewards as R

MIRRORS = Path(os.environ.get("SEARCHLOOP_SEED_MIRRORS", "/work/.mirror"))
DROP = ("from openrlhf", "import datasets", "from transformers", "import uvicorn", "from fastapi", "import requests",
        "import jsonlines", "import pdb")


def _seed(repo: str, rev: str, path: str) -> types.ModuleType:
    git_dir = MIRRORS / repo / "repo"
    if not git_dir.exists():
        pytest.skip(f"seed mirror {git_dir} not present")
    src = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{rev}:{path}"], capture_output=True,
                         text=True, check=True).stdout
    lines = ["pass  # removed" if line.startswith(DROP) else line for line in src.splitlines()]
    src = "\n".join(lines).replace("import ujson as json", "import json")
    mod = types.ModuleType(f"seed_{repo}_{Path(path).stem}")
    mod.__dict__.update(init_logger=lambda name: types.SimpleNamespace(info=lambda *a, **k: None),
                        print=lambda *a, **k: None)
    exec(compile(src, f"<{repo}:{path}>", "exec"), mod.__dict__)  # noqa: S102 - reference code, test only
    return mod


VOCAB = ["<think>", "</think>", "<search>", "</search>", "<result>", "</result>", "<answer>", "</answer>",
         "\\boxed{", "}", "{", "Paris", "France", "yes", "no", "the", " ", "\n", "\n\n", "result: ", "<information>",
         "</information>", "<|begin_of_query|>", "<|end_of_query|>", "<|begin_of_documents|>\n", "(1)",
         "<|end_of_documents|>\n\n", "<|begin_of_documents|>", "<|end_of_documents|>", "Assistant", "巴黎",
         "</search<", "\\boxed ", "$", "doc A", "doc B", "True", "False", "London", "Paris, France", "\u2019s"]
BLOCKS = ["<think> plan </think>", "<search> q </search> <result>\nresult: \ndoc A\n\ndoc B\n</result>",
          "<search> q </search> <result>\nresult: \ndoc A\n\ndoc C\n</result>",
          "<answer> The final answer is \\[ \\boxed{Paris} \\] </answer>", "<answer> \\boxed{yes} </answer>",
          "<answer> Paris </answer>", "\n\n<information>Doc 1 Paris France</information>\n\n",
          " <|begin_of_query|> q <|end_of_query|>\n\n<|begin_of_documents|>\n(1)Paris doc\n<|end_of_documents|>\n\n",
          "reasoning</think>", "<search> q </search>"]
GOLDS = ["Paris", "yes", "Paris France", "London", "no", "doc", "the Paris", "Paris_France"]


def _cases(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            text = "".join(rng.choice(VOCAB) for _ in range(rng.randint(0, 25)))
        else:
            parts = [rng.choice(BLOCKS) for _ in range(rng.randint(1, 7))]
            if rng.random() < 0.3:
                parts.insert(rng.randrange(len(parts) + 1), rng.choice(VOCAB))
            text = "".join(parts)
        out.append((text, rng.choice(GOLDS)))
    return out


CASES = _cases(1500)


def _r1_proxy(mod: types.ModuleType, question: str, gold: str):
    proxy = object.__new__(mod.MathRuleProxy)
    proxy.tokenizer = types.SimpleNamespace(pad_token="<|endoftext|>", eos_token="<|endoftext|>")
    proxy.eval_data_dict = {mod.normalize_text(question): gold}
    proxy.log_file, proxy.cnt = None, 0
    return proxy


@pytest.mark.slow
def test_research_and_smartsearch_parity() -> None:
    research = _seed("Agent-RL+ReSearch", "re-search", "src/verl/utils/reward_score/re_search.py")
    smart = _seed("RUC-NLPIR+SmartSearch", "HEAD", "src/verl/utils/reward_score/re_call.py")
    smart.generate_response = lambda prompt: ""  # PRM unreachable: the seed's failure branch
    tok = types.SimpleNamespace(eos_token="<|im_end|>")
    system = "<|im_start|>system\n<think> <think> <think><|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n"
    for resp, gold in CASES:
        for text in (resp, resp + tok.eos_token):
            seed = research.compute_score(tok, "<|im_start|>assistant\n" + text, [gold])[0]
            assert R.research_reward(text, [gold], eos_token=tok.eos_token).score == seed, (text, gold)
        seed = smart.compute_score_with_format(None, system + "<|im_start|>assistant\n<think>" + resp, [gold])
        assert R.smartsearch_reward(resp, [gold]).score == pytest.approx(seed, abs=1e-12), (resp, gold)


@pytest.mark.slow
def test_searchr1_parity() -> None:
    em = _seed("PeterGriffinJin+Search-R1", "HEAD", "verl/utils/reward_score/qa_em.py")
    shaped = _seed("PeterGriffinJin+Search-R1", "HEAD", "verl/utils/reward_score/qa_em_format.py")
    prompt = "<|im_start|>user\nFor example, <answer> Beijing </answer>.<|im_end|>\n<|im_start|>assistant\n"
    for resp, gold in CASES:
        gt = {"target": [gold]}
        assert R.searchr1_em_reward(resp, [gold]).score == em.compute_score_em(prompt + resp, gt), (resp, gold)
        seed = shaped.compute_score_em(prompt + resp, gt, structure_format_score=0.2, final_format_score=0.1,
                                       retrieval_score=0.1)
        assert R.searchr1_format_reward(resp, [gold], retrieval_score=0.1).score == pytest.approx(seed), (resp, gold)


@pytest.mark.slow
@pytest.mark.parametrize(("path", "fn"), [
    ("train/reward_server_llama_stage1.py", lambda r, g: R.r1searcher_stage1_reward(r, g, "<|endoftext|>")),
    ("train/reward_server_llama_stage2.py", lambda r, g: R.r1searcher_stage2_reward(r, g, "llama", "<|endoftext|>")),
    ("train/reward_server_qwen_zero.py", lambda r, g: R.r1searcher_stage2_reward(r, g, "qwen", "<|endoftext|>")),
])
def test_r1searcher_parity(path: str, fn) -> None:
    mod = _seed("RUCAIBox+R1-Searcher", "HEAD", path)
    q = "Which city?"
    for resp, gold in CASES:
        if "qwen" in path:
            query = f"sys\n\nUser:{q}\nAssistant: <think>{resp}"
            if "Assistant: <think>" in resp or "\n\nUser:" in resp:
                continue  # the seed would split the question at the response's own markers
        else:
            query = (f"<|start_header_id|>user<|end_header_id|>\n\n{q}<|eot_id|><|start_header_id|>assistant"
                     f"<|end_header_id|>\n\n<think>{resp}")
        seed = _r1_proxy(mod, q, gold).get_reward([query])[0]
        seed = seed[0] if isinstance(seed, list) else seed
        assert fn(resp, gold).score == pytest.approx(seed, abs=1e-12), (resp, gold)


@pytest.mark.slow
def test_metric_parity_with_seed_metric_code() -> None:
    research = _seed("Agent-RL+ReSearch", "re-search", "src/verl/utils/reward_score/re_search.py")
    em = _seed("PeterGriffinJin+Search-R1", "HEAD", "verl/utils/reward_score/qa_em.py")
    r1 = _seed("RUCAIBox+R1-Searcher", "HEAD", "evaluation/metric_calc_rule.py")
    ex = _seed("mangopy+SearchLM", "v1", "src/utilize/metrics.py")  # the broken normalization
    ex_main = _seed("mangopy+SearchLM", "main", "src/utilize/metrics.py")  # SQuAD normalization, no yes/no rule
    for pred, gold in CASES:
        golds = [gold, "Paris"]
        assert M.f1_score(pred, golds) == research.get_f1_score(pred, golds)  # FlashRAG-style F1
        assert M.exact_match(pred, golds) == em.em_check(pred, golds)
        assert M.cover_exact_match(pred, golds) == em.subem_check(pred, golds)
        assert M.f1_score(pred, gold, "r1searcher") == pytest.approx(r1.f1_score(pred, gold)[0])
        assert M.exact_match(pred, gold, "r1searcher") == float(r1.exact_match_score(pred, gold))
        assert M.token_cover_em(pred, gold, "r1searcher") == float(r1.cover_exact_match_score_1(pred, gold))
        bug = "exsearch_released_buggy"
        assert M.f1_score(pred, golds, bug) == pytest.approx(ex.f1_score(pred, golds))
        assert M.exact_match(pred, golds, bug) == ex.eval_em([pred], [golds])["EM"] / 100
        assert M.cover_exact_match(pred, golds, bug) == ex.eval_acc([pred], [golds])["Acc"] / 100
        assert M.token_scores(pred, golds, yes_no_rule=False).f1 == pytest.approx(ex_main.f1_score(pred, golds))
        assert M.exact_match(pred, golds) == ex_main.eval_em([pred], [golds])["EM"] / 100
