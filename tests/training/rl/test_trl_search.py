"""TRL GRPO with search in the loop: a real 1-step run (SmolLM2, BM25, a seed reward) and the loss mask check."""

from __future__ import annotations

import math

import pytest

from evaluation.benchmarks import load_benchmark
from training.rl.data import default_messages, trl_rows, verl_rows
from training.rl.trl_engine import RolloutSample, TRLSearchConfig, _pad_right, last_checkpoint


def test_rollout_sample_checks_mask_length() -> None:
    with pytest.raises(ValueError, match="one mask value per token"):
        RolloutSample(prompt_ids=[1], completion_ids=[2, 3], loss_mask=[1], response="x")
    assert _pad_right([[1, 0], [1]], 3) == [[1, 0, 0], [1, 0, 0]]


def test_last_checkpoint_picks_newest_complete(tmp_path) -> None:
    for step, complete in ((2, True), (10, True), (12, False)):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        if complete:
            (d / "trainer_state.json").write_text("{}")
    assert last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert last_checkpoint(str(tmp_path / "missing")) is None


@pytest.mark.slow
def test_grpo_step_with_search_masks_retrieved_tokens(tmp_path, data_dir, smol_path, smol_tokenizer, bm25) -> None:
    import torch

    from training.agent.rollout import RolloutConfig
    from training.protocols.base import load_protocol
    from training.rewards.adapters import trl_reward_func
    from training.rl.trl_engine import build_trainer, engine_rollout_fn, prompt_rows

    # ExSearch searches on its first step (every step before <FINAL> is a query), so inserted user turns with
    # documents are guaranteed even from a 135M model; max_turns=1 keeps the run short.
    protocol = load_protocol("exsearch", top_k=1, max_turns=1)
    questions = load_benchmark("hotpotqa_mini", limit=1)
    rows = prompt_rows(protocol, trl_rows(verl_rows(questions, default_messages())), smol_tokenizer)
    sink: list = []
    rollout = engine_rollout_fn(protocol, bm25, RolloutConfig(temperature=1.0, best_of=1, max_tokens_per_turn=16,
                                                              max_total_tokens=40, seed=0), sink=sink)
    # micro_batch_size=1: the step's 2 completions train as 2 accumulated micro-batches (one generation per step)
    cfg = TRLSearchConfig(num_generations=2, prompts_per_step=1, max_steps=1, save_steps=100, beta=0.0,
                          max_completion_length=256, learning_rate=1e-5, micro_batch_size=1)
    reward = trl_reward_func("searchr1_em", eos_token_id=smol_tokenizer.eos_token_id)
    trainer = build_trainer(cfg, str(smol_path), rows, [reward], rollout, str(tmp_path / "out"))
    trainer.train()

    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert trainer.state.global_step == 1 and logs
    assert math.isfinite(logs[-1]["loss"]) and math.isfinite(logs[-1]["grad_norm"])
    assert logs[-1]["search/searches_per_traj"] >= 1.0
    assert 0.0 < logs[-1]["search/masked_token_frac"] < 1.0
    assert len(sink) == 2 and all(t.n_searches >= 1 for t in sink)

    batch = dict(trainer.last_loss_inputs)
    tool, comp = batch["tool_mask"].bool(), batch["completion_mask"].bool()
    inserted, generated = comp & ~tool, comp & tool
    assert inserted.any() and generated.any(), "the batch must hold both retrieved and generated tokens"
    # the last micro-batch is one trajectory: its inserted tokens are exactly the 0s of one trajectory's loss mask
    assert batch["completion_ids"].size(0) == 1
    assert int(inserted.sum()) in {len(t.loss_mask) - sum(t.loss_mask) for t in sink}

    # Gradient check: with non-zero advantages, d loss / d logp is non-zero on generated tokens and exactly zero
    # on retrieved ones (they stay in the attention context but contribute nothing to the loss). One row keeps
    # the extra forward/backward cheap; every ExSearch trajectory holds an inserted user turn.
    rows = batch["completion_ids"].size(0)
    batch = {k: v[:1] if torch.is_tensor(v) and v.dim() > 0 and v.size(0) == rows else v for k, v in batch.items()}
    tool, comp = batch["tool_mask"].bool(), batch["completion_mask"].bool()
    inserted, generated = comp & ~tool, comp & tool
    batch["advantages"] = torch.ones_like(batch["advantages"])
    trainer.capture_logps = True
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    grad = trainer.captured_logps.grad
    assert grad[inserted].abs().max().item() == 0.0
    assert grad[generated].abs().min().item() > 0.0


def test_micro_batches_accumulate_to_one_generation_per_step(tmp_path) -> None:
    from pydantic import ValidationError

    from training.rl.trl_engine import grpo_args

    cfg = TRLSearchConfig(num_generations=8, prompts_per_step=2, micro_batch_size=8)
    args = grpo_args(cfg, str(tmp_path))
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (8, 2)
    assert args.generation_batch_size == 16 and args.steps_per_generation == 2  # one rollout batch per step
    whole = grpo_args(TRLSearchConfig(num_generations=8, prompts_per_step=2), str(tmp_path))
    assert (whole.per_device_train_batch_size, whole.gradient_accumulation_steps) == (16, 1)
    with pytest.raises(ValidationError, match="must divide"):
        TRLSearchConfig(num_generations=4, prompts_per_step=2, micro_batch_size=3)


def test_to_sample_splits_prompt_from_masked_response(smol_tokenizer) -> None:
    from training.agent.records import Trajectory
    from training.agent.rollout import token_mask
    from training.protocols.base import Segment
    from training.rl.trl_engine import to_sample

    prompt = "<|im_start|>user\nWho directed Ed Wood?<|im_end|>\n<|im_start|>assistant\n"
    segments = [Segment("<search> Ed Wood film </search>", True),
                Segment(" <result>\nEd Wood is a 1994 film by Tim Burton.\n</result>", False),
                Segment(" <answer> Tim Burton </answer><|im_end|>", True)]
    ids, mask, _ = token_mask(smol_tokenizer, prompt, segments)
    traj = Trajectory(question_id="q", question="Who directed Ed Wood?", protocol="research", prompt=prompt,
                      response="".join(s.text for s in segments), finish_reason="answer", n_searches=1,
                      token_ids=ids, loss_mask=mask, format_ok=False)
    sample = to_sample(traj, smol_tokenizer)
    assert sample.prompt_ids == smol_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert sample.completion_ids == ids and sample.loss_mask == mask
    assert sample.completion_ids[-1] == smol_tokenizer.eos_token_id and sample.loss_mask[-1] == 1
    pairs = zip(sample.completion_ids, sample.loss_mask, strict=True)
    inserted = smol_tokenizer.decode([t for t, m in pairs if m == 0])
    assert "Tim Burton" in inserted and "<search>" not in inserted
    assert sample.num_searches == 1 and sample.format_ok is False


def test_rollout_seeds_differ_per_step_and_call_and_are_reproducible(monkeypatch, bm25, smol_tokenizer) -> None:
    # before: every rollout call (= every optimizer step) generated with seeds 0, 1, 2, ... again
    from training_fakes import ScriptedGenerator

    import training.generation.hf as hf
    from training.agent.rollout import RolloutConfig
    from training.protocols.base import load_protocol
    from training.rl.trl_engine import RolloutSeeds, engine_rollout_fn, rollout_seed

    seen: list[list[int | None]] = []

    class RecordingGenerator(ScriptedGenerator):
        def __init__(self, model, tokenizer, batch_size=16) -> None:
            super().__init__({"Ed Wood": ["<answer> \\boxed{Tim Burton} </answer><EOS>"]}, tokenizer)
            seen.append([])

        def generate(self, prompts, sampling, max_tokens=None):
            seen[-1].append(sampling.seed)
            return super().generate(prompts, sampling, max_tokens)

    monkeypatch.setattr(hf, "TransformersGenerator", RecordingGenerator)
    rows = [{"question_id": "q1", "question": "Who directed Ed Wood?", "golden_answers": ["Tim Burton"]}] * 2
    fn = engine_rollout_fn(load_protocol("research"), bm25, RolloutConfig(temperature=1.0, seed=0))
    seeds = RolloutSeeds(base=0)
    per_step = [seeds.next(step) for step in (0, 1, 2)] + [seeds.next(2)]  # two rollout calls at step 2
    for s in per_step:
        fn(rows, None, smol_tokenizer, seed=s)
    from training.generation.base import derive_seed

    # the rollout engine's first generation pass samples with derive_seed(seed, 0)
    assert [calls[0] for calls in seen] == [derive_seed(s, 0) for s in per_step]
    assert len(set(per_step)) == 4, "every step (and every call within a step) draws fresh noise"
    again = RolloutSeeds(base=0)
    assert [again.next(step) for step in (0, 1, 2)] + [again.next(2)] == per_step  # reproducible
    resumed = RolloutSeeds(base=0)
    assert resumed.next(2) == per_step[2]  # a resumed run continues with the seeds of the steps it had not done
    assert rollout_seed(1, 0) != rollout_seed(0, 0) and 0 <= rollout_seed(0, 5) < 2**31
