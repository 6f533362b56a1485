"""SmartSearch stage-1 bookkeeping: the SFT rows counted as the trainer keeps them (rows over ``cutoff_len`` are
reported, not silently lost) and the seed's unmasked SFT rows (the whole turn, retrieved text included)."""

from __future__ import annotations

from training.smartsearch.config import Stage1Spec
from training.smartsearch.stages import sft_fit
from training.warmup.renderers import IGNORE_INDEX


def test_sft_fit_counts_rows_the_trainer_drops() -> None:
    """Session 10: counts.json said 6 rows kept, the SFT trained 5 (one over cutoff_len was dropped silently)."""
    rows = [{"input_ids": [1] * n, "labels": [IGNORE_INDEX] * (n - 2) + [1, 1]} for n in (10, 20, 30)]
    rows.append({"input_ids": [1] * 5, "labels": [IGNORE_INDEX] * 5})
    assert sft_fit(rows, cutoff_len=25) == {"kept": 2, "over_cutoff": 1, "no_labels": 1}


def test_stage1_trains_on_the_whole_turn_like_the_seed() -> None:
    """The seed's SFT data holds the <result> blocks in the alpaca ``output``: nothing is masked after the prompt."""
    assert Stage1Spec(questions=[]).mask_retrieved is False


# --- stage 1 policy warm-up and stage 2 pair cases, with unit-test fakes for the model and the trainers ----------

import json  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from infra.config import load_config  # noqa: E402
from training.generation.base import Completion, cut_at_stop  # noqa: E402
from training.smartsearch.config import SmartSearchConfig  # noqa: E402

EOS = "<|im_end|>"


class PolicyFake:
    """Unit-test fake of a sampled policy. ``searches`` False: the base 135M model of the demo (session 11: no
    ``<search>`` in 12 samples); True: a policy that searches once, then answers ``answer``. Output is cut at the
    protocol's stop strings like a real backend's."""

    def __init__(self, tokenizer, searches: bool, answer: str = "no idea") -> None:
        self.tokenizer, self.searches, self.answer, self.eos_token = tokenizer, searches, answer, EOS

    def generate(self, prompts, sampling, max_tokens=None):
        out = []
        for p in prompts:
            if not self.searches:
                raw, eos = "I am not sure what the question means, so I keep thinking about it", False
            elif "</result>" not in p.rsplit("<|im_start|>assistant", 1)[-1]:
                raw, eos = " I need facts </think>\n<search> Ed Wood film director </search> junk", False
            else:
                raw, eos = f"<think> found </think> <answer> \\boxed{{{self.answer}}} </answer>", True
            text, stop = cut_at_stop(raw, sampling.stop)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            reason = "stop" if stop else ("eos" if eos else "length")
            out.append(Completion(text=text, token_ids=ids, finish_reason=reason, stop=stop))
        return out


def _demo(*overrides: str) -> SmartSearchConfig:
    return load_config(SmartSearchConfig, "smartsearch_cpu_demo", [
        "stage1.questions=[{path: data/train/hotpotqa_train_mini.jsonl, limit: 2}]", "stage1.sampling.n=1",
        "stage1.teacher.decomposition_files=[{path: data/train/hotpotqa_train_mini.jsonl, limit: 2}]",
        "stage1.teacher.corpus=[data/train/corpus_train_mini.jsonl]", *overrides])


def _fake_sft(calls: list):
    from training.refs import CheckpointRef

    def train_sft_tokenized(cfg, data_path, base_model, out_dir, mlflow_run_id=None, run_name="sft"):
        rows = [json.loads(x) for x in Path(data_path).read_text().splitlines()]
        calls.append({"run_name": run_name, "base": str(base_model), "steps": cfg.max_steps,
                      "mlflow": cfg.report_to_mlflow, "questions": [r["question_id"] for r in rows]})
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "loss_curve.jsonl").write_text('{"loss": 1.0}\n{"loss": 0.5}\n')
        return CheckpointRef(uri=str(Path(out_dir) / "model"), base_model=str(base_model), steps=cfg.max_steps,
                             n_examples=len(rows))

    return train_sft_tokenized


@pytest.mark.parametrize("warmup", [0, 3])
def test_stage1_policy_rounds_reach_the_judge_after_the_warmup(tmp_path, monkeypatch, bm25, smol_tokenizer,
                                                                warmup) -> None:
    """Session 11's demo: the base policy never searched, so stage 1 judged 0 policy rounds. With
    ``policy_warmup_steps`` the policy samples from a checkpoint fine-tuned on the screened teacher rows (a fake
    policy that searches once it is that checkpoint) and its rounds are judged; the stage's own SFT still starts
    from the initial model and trains on the kept rows of both sources."""
    from training.agent.rollout import run_rollouts
    from training.generation.models import resolve_policy as resolve_model
    from training.sft import launcher
    from training.smartsearch import stages
    from training.smartsearch.judge import GoldSupport, RuleJudge

    cfg = _demo(f"stage1.policy_warmup_steps={warmup}")
    sampled_from: list[str] = []

    def fake_sample(cfg_, model, questions, s, searcher):
        sampled_from.append(str(model))
        gen = PolicyFake(smol_tokenizer, searches="warmup" in str(model))
        return (run_rollouts(questions, stages.protocol_for(cfg_), gen, searcher, stages.rollout_config(s),
                             smol_tokenizer), gen, smol_tokenizer)

    calls: list = []
    monkeypatch.setattr(stages, "sample", fake_sample)
    monkeypatch.setattr(launcher, "train_sft_tokenized", _fake_sft(calls))
    judge = RuleJudge(GoldSupport(stages.load_questions(cfg.stage1.questions)))
    result = stages.run_stage1(cfg, judge, bm25, str(tmp_path / "stage1"))
    c = result.counts
    base = str(resolve_model(cfg.model))
    assert c["sampled_policy"] == 2 and c["rounds_judged_teacher"] > 0 and c["kept_teacher"] > 0
    if not warmup:
        assert c["rounds_judged_policy"] == 0 and sampled_from == ["smollm2"]
        assert [x["run_name"] for x in calls] == ["stage1-sft"]
        return
    assert c["rounds_model_written_policy"] == 0  # the policy's judged rounds are executed searches
    assert c["rounds_judged_policy"] == 2 and c["warmup_steps"] == warmup and c["warmup_rows"] == c["kept_teacher"]
    warm, final = calls
    assert warm["run_name"] == "stage1-policy-warmup" and warm["base"] == base and warm["steps"] == warmup
    assert not warm["mlflow"] and final["mlflow"]  # one trainer reports into the stage's MLflow run
    assert (c["warmup_loss_first"], c["warmup_loss_last"]) == (1.0, 0.5)
    teacher_ids = {r["question_id"] for r in map(json.loads, Path(result.dir, "screen.jsonl").read_text().splitlines())
                   if r["source"] == "teacher" and r["decision"] == "kept"}
    assert set(warm["questions"]) == teacher_ids  # the warm-up trains on the screened teacher rows only
    assert sampled_from == [str(tmp_path / "stage1" / "warmup" / "sft" / "model")]
    assert final["run_name"] == "stage1-sft" and final["base"] == base and final["steps"] == cfg.stage1.sft.max_steps
    assert result.model.endswith("stage1/sft/model")


def test_demo_preset_warms_up_the_stage1_policy() -> None:
    cfg = load_config(SmartSearchConfig, "smartsearch_cpu_demo")
    assert cfg.stage1.policy_warmup_steps > 0 and cfg.stage1.teacher is not None
    with pytest.raises(Exception, match="stage1.teacher"):
        load_config(SmartSearchConfig, "smartsearch_cpu_demo", ["stage1.teacher=null"])


class SiblingsFake(PolicyFake):
    """Unit-test fake of the stage-2 policy on a yes/no question (gold "yes"): of two samples of the same prompt
    the first answers "yes" at once (correct, no search round), the second searches a useless query and answers
    "no"; continuations of a refined prefix alternate "yes"/"no" (the regenerations of one prefix differ)."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, searches=True)
        self.seen: Counter = Counter()

    def generate(self, prompts, sampling, max_tokens=None):
        out = []
        for p in prompts:
            k, self.seen[p] = self.seen[p], self.seen[p] + 1
            tail = p.rsplit("<|im_start|>assistant", 1)[-1]
            if "</result>" not in tail:
                raw = (" easy </think> <answer> \\boxed{yes} </answer><EOS>" if k % 2 == 0 else
                       " I need facts </think>\n<search> Ed Wood film director </search>")
            elif "Ed Wood film director" in tail:
                raw = "<think> found </think> <answer> \\boxed{no} </answer><EOS>"
            else:
                raw = f"<think> found </think> <answer> \\boxed{{{'yes' if k % 2 == 0 else 'no'}}} </answer><EOS>"
            eos = raw.endswith("<EOS>")
            text, stop = cut_at_stop(raw.removesuffix("<EOS>"), sampling.stop)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Completion(text=text, token_ids=ids, finish_reason="stop" if stop else
                                  ("eos" if eos else "length"), stop=stop))
        return out


def test_stage2_builds_pairs_of_both_seed_cases_with_the_demo_sampling(tmp_path, monkeypatch, bm25,
                                                                       smol_tokenizer) -> None:
    """Session 11's demo: the one correct original answered without a search, so it had no round to refine and no
    ``original_correct`` pair. The seed's ``transfer_dpo.py`` groups regenerations by question: with the demo's
    two samples per question a correct original pairs with the wrong regenerations of its searching sibling, and
    that sibling (wrong) with a correct regeneration."""
    from evaluation.benchmarks import Question
    from training.agent.rollout import run_rollouts
    from training.smartsearch import dpo, stages
    from training.smartsearch.judge import GoldSupport, RuleJudge
    from training.smartsearch.refine import Refinement  # noqa: F401  (the rule refiner's record)

    cfg = load_config(SmartSearchConfig, "smartsearch_cpu_demo")
    q = Question(id="q2", question="Were Scott Derrickson and Ed Wood of the same nationality?",
                 golden_answers=["yes"], dataset="hotpotqa")
    gen = SiblingsFake(smol_tokenizer)
    monkeypatch.setattr(stages, "load_questions", lambda sources: [q])
    monkeypatch.setattr(stages, "sample", lambda cfg_, model, qs, s, searcher: (
        run_rollouts(qs, stages.protocol_for(cfg_), gen, searcher, stages.rollout_config(s), smol_tokenizer),
        gen, smol_tokenizer))
    trained: list = []

    def fake_dpo(spec, pairs, base_model, out_dir):
        from training.refs import CheckpointRef

        trained.append(pairs)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "loss_curve.jsonl").write_text('{"loss": 0.69, "rewards/margins": 0.0}\n')
        return CheckpointRef(uri=str(Path(out_dir) / "model"), steps=1, n_examples=len(pairs))

    monkeypatch.setattr(dpo, "train_dpo", fake_dpo)
    support = GoldSupport([q])
    result = stages.run_stage2(cfg, RuleJudge(support), (None, cfg.refiner, support), bm25, "smollm2",
                               str(tmp_path / "stage2"))
    c = result.counts
    assert c["sampled"] == cfg.stage2.sampling.n and c["correct_originals"] == 1 and c["refined"] == 1
    assert c["regenerations"] == cfg.stage2.regenerations and c["correct_regenerations"] >= 1
    assert c["pairs_original_correct"] >= 1 and c["pairs_regeneration_correct"] >= 1
    assert {p["case"] for p in trained[0]} == {"original_correct", "regeneration_correct"}


def test_model_written_result_blocks_are_counted_apart() -> None:
    """Session 11: 22 of 33 judged stage-2 rounds were ``<result>`` blocks the policy wrote itself; the judge judges
    them (as the seed's does) and the counts now tell them from executed searches."""
    from types import SimpleNamespace

    from training.smartsearch.stages import model_written_rounds

    searched = SimpleNamespace(turns=[SimpleNamespace(inserted=" <result>\ndoc\n</result>"),
                                      SimpleNamespace(inserted="")])
    nothing = SimpleNamespace(turns=[SimpleNamespace(inserted="")])
    assert model_written_rounds([searched, nothing], [[1, 0, 0], [0]]) == 3
    assert model_written_rounds([searched], [[1]]) == 0
