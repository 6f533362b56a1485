"""The TRL engine's cost switches on a tiny randomly initialised Llama (real TRL steps, a fake rollout function):
no reference model at beta=0, the LoRA-disabled policy as the reference with LoRA, bf16 only where native, LoRA
merged for saving, and the rollouts' answers reaching the health alarms."""

from __future__ import annotations

import math

import pytest

from training.rl.trl_engine import RolloutSample, TRLSearchConfig


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, smol_tokenizer):
    """A 2-layer, 32-wide Llama with SmolLM2's tokenizer, random weights, saved as an HF folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(smol_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      eos_token_id=smol_tokenizer.eos_token_id, pad_token_id=smol_tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("tiny") / "model"
    LlamaForCausalLM(cfg).save_pretrained(path)
    smol_tokenizer.save_pretrained(path)
    return str(path)


def _rows() -> list[dict]:
    qs = [("q1", "Which country Jakobea Of Baden's mother is from?"), ("q2", "Who directed Ed Wood?")]
    return [{"prompt": f"Question: {q}\n", "question": q, "question_id": i, "golden_answers": ["Germany"]}
            for i, q in qs]


def _rollout(rows, model, tokenizer, seed=None) -> list[RolloutSample]:
    out = []
    for k, r in enumerate(rows):
        ids = tokenizer(f" answer {k % 3} <answer>", add_special_tokens=False)["input_ids"]
        out.append(RolloutSample(prompt_ids=tokenizer(r["prompt"])["input_ids"], completion_ids=ids,
                                 loss_mask=[1] * len(ids), response=f"answer {k}", num_searches=k % 2,
                                 finish_reason="answer", format_ok=True,
                                 extra={"final_answer": "Jakobea Of Baden" if k % 2 else "Germany"}))
    return out


def _reward(prompts, completions, **kw) -> list[float]:
    return [float(c.endswith(("1", "3"))) for c in completions]  # rollouts 0/1 share a prompt: advantages != 0


def _trainer(tiny_model, tmp_path, callbacks=None, **over):
    from training.rl.trl_engine import build_trainer

    cfg = TRLSearchConfig(num_generations=2, prompts_per_step=2, max_steps=1, save_steps=100, learning_rate=1e-2,
                          max_completion_length=32, **over)
    return build_trainer(cfg, tiny_model, _rows(), [_reward], _rollout, str(tmp_path / "out"), callbacks=callbacks)


def test_full_finetune_with_beta_keeps_a_reference_copy(tiny_model, tmp_path) -> None:
    trainer = _trainer(tiny_model, tmp_path, beta=0.1)
    assert trainer.ref_model is not None


def test_beta_zero_builds_no_reference_and_logs_no_kl(tiny_model, tmp_path) -> None:
    trainer = _trainer(tiny_model, tmp_path, beta=0.0)
    assert trainer.ref_model is None
    trainer.train()
    assert not any("kl" in h for h in trainer.state.log_history)


def test_lora_reference_is_the_adapter_disabled_policy(tiny_model, tmp_path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from training.rl.trl_engine import policy_for_saving

    trainer = _trainer(tiny_model, tmp_path, beta=0.1, lora_rank=4)
    assert trainer.ref_model is None, "no second model: the reference is the policy with adapters disabled"
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" not in n}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and math.isfinite(logs[-1]["kl"])
    assert all(torch.equal(p, base_before[n]) for n, p in trainer.model.named_parameters() if n in base_before)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        policy = trainer.model(input_ids=ids).logits
        with trainer.model.disable_adapter():
            ref = trainer.model(input_ids=ids).logits
    assert not torch.allclose(policy, ref), "one step moved the adapters away from the reference"
    merged = policy_for_saving(trainer.model)
    merged.save_pretrained(tmp_path / "merged")
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, policy, atol=1e-4)


def test_bf16_only_where_native(tiny_model, tmp_path, monkeypatch) -> None:
    from infra.errors import ConfigError
    from training.rl import trl_engine

    monkeypatch.setattr("infra.machine.cpu_flags", lambda: {"avx2", "avx512f"})
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert not trl_engine.native_bf16()
    with pytest.raises(ConfigError, match="avx512_bf16 or amx_bf16"):
        _trainer(tiny_model, tmp_path, precision="bf16", beta=0.0)
    monkeypatch.setattr("infra.machine.cpu_flags", lambda: {"avx512_bf16"})
    trainer = _trainer(tiny_model, tmp_path, precision="bf16", beta=0.0)
    assert trainer.args.bf16
    trainer.train()
    loss = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert loss and math.isfinite(loss[-1])


def test_rollout_answers_reach_the_health_alarms(tiny_model, tmp_path) -> None:
    from training.rl.health import HealthConfig, health_callback

    health = health_callback(HealthConfig(window=1, max_copied_share=0.2, min_answer_questions=2),
                             log_to_mlflow=False)
    trainer = _trainer(tiny_model, tmp_path, beta=0.0, callbacks=[health])
    trainer.train()
    log = [h for h in trainer.state.log_history if "search/copied_answer_rate" in h][-1]
    # rollouts answer Germany, Jakobea Of Baden, Germany, Jakobea Of Baden: a copy only in q1's question
    assert log["search/copied_answer_rate"] == pytest.approx(0.25)
    assert log["search/top_answer_share"] == pytest.approx(1.0)  # both questions' majority answer is "germany"
    assert health.series[-1]["health/copied_answer_rate"] == pytest.approx(0.25)
    assert [a.name for a in health.alarms] == ["copied_answers", "answer_collapse"]


@pytest.mark.parametrize("bf16", [False, True])
def test_rollouts_generate_with_merged_adapters_and_a_bf16_copy(tiny_model, bf16: bool) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from training.rl.trl_engine import rollout_policy

    torch.manual_seed(1)
    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model),
                            LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    for name, p in policy.named_parameters():
        if "lora_B" in name:  # B starts at 0 (a no-op adapter): give it weight so merging matters
            torch.nn.init.normal_(p, std=0.5)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    ids = torch.tensor([[1, 5, 9, 12, 40, 7]])
    with torch.no_grad():
        want = policy(input_ids=ids).logits
        with policy.disable_adapter():
            assert not torch.allclose(policy(input_ids=ids).logits, want, atol=1e-3)  # the adapters matter
        with rollout_policy(policy, bf16=bf16) as gen:
            layers = [m for m in gen.modules() if hasattr(m, "merged") and hasattr(m, "lora_A")]
            assert layers and all(m.merged for m in layers), "adapters merged: no extra matmuls per token"
            assert next(gen.parameters()).dtype == (torch.bfloat16 if bf16 else torch.float32)
            got = gen(input_ids=ids).logits.float()
        torch.testing.assert_close(got, want, atol=0.1 if bf16 else 1e-4, rtol=0.05 if bf16 else 1e-4)
    assert not any(m.merged for m in policy.modules() if hasattr(m, "merged") and hasattr(m, "lora_A"))
    for n, p in policy.named_parameters():  # the live policy is back as it was: fp32, unmerged, same weights
        assert p.dtype == torch.float32
        torch.testing.assert_close(p.detach(), before[n], atol=1e-6, rtol=0)


def test_full_finetune_rollouts_use_the_policy_itself_or_a_bf16_copy(tiny_model) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from training.rl.trl_engine import rollout_policy

    policy = AutoModelForCausalLM.from_pretrained(tiny_model)
    with rollout_policy(policy) as gen:
        assert gen is policy
    with rollout_policy(policy, bf16=True) as gen:
        assert gen is not policy and next(gen.parameters()).dtype == torch.bfloat16
    assert next(policy.parameters()).dtype == torch.float32


def test_auto_precision_follows_the_hardware(monkeypatch, tmp_path) -> None:
    from training.rl import trl_engine
    from training.rl.config import TRLSearchConfig

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("infra.machine.cpu_flags", lambda: {"avx2", "avx512f"})
    cfg = TRLSearchConfig(precision="auto")
    trl_engine.check_precision(cfg)  # auto never refuses
    assert trl_engine.resolved_precision(cfg) == "fp32"
    assert not trl_engine.grpo_args(cfg, str(tmp_path)).bf16
    monkeypatch.setattr("infra.machine.cpu_flags", lambda: {"avx512_bf16"})
    assert trl_engine.resolved_precision(cfg) == "bf16"
    assert trl_engine.grpo_args(cfg, str(tmp_path)).bf16
    assert trl_engine.resolved_precision(TRLSearchConfig(precision="fp32")) == "fp32"


def test_dynamic_sampling_replaces_groups_without_reward_spread(tiny_model, tmp_path) -> None:
    """resample_flat_groups: a group whose rollouts all earn the same reward (q1 here) carries no advantage, so the
    trainer rolls out another training prompt's group and trains on it instead; with nothing to replace it by,
    the flat group stays."""
    from training.rl.trl_engine import build_trainer

    calls: list[list[str]] = []

    def rollout(rows, model, tokenizer, seed=None) -> list[RolloutSample]:
        calls.append([r["question_id"] for r in rows])
        out = []
        for k, r in enumerate(rows):
            text = "answer 0" if r["question_id"] == "q1" else f"answer {k}"  # q1: every rollout alike
            ids = tokenizer(f" {text} <answer>", add_special_tokens=False)["input_ids"]
            out.append(RolloutSample(prompt_ids=tokenizer(r["prompt"])["input_ids"], completion_ids=ids,
                                     loss_mask=[1] * len(ids), response=text, num_searches=1,
                                     finish_reason="answer", format_ok=True, extra={"final_answer": text}))
        return out

    rows = _rows() + [{"prompt": "Question: Who wrote Hamlet?\n", "question": "Who wrote Hamlet?",
                       "question_id": "q3", "golden_answers": ["Shakespeare"]}]
    cfg = TRLSearchConfig(num_generations=2, prompts_per_step=2, max_steps=1, save_steps=100, learning_rate=1e-2,
                          max_completion_length=32, beta=0.0, resample_flat_groups=3)
    trainer = build_trainer(cfg, tiny_model, rows, [_reward], rollout, str(tmp_path / "out"))
    trainer.train()
    log = [h for h in trainer.state.log_history if "search/flat_groups" in h][-1]
    step_qids = set(calls[0])
    assert step_qids == {"q1", "q3"}  # TRL's seeded sampler (seed 0) draws q1 and q3 for the step
    # q1's group was flat: the one unused prompt (q2) was rolled out and trained in its place
    assert log["search/flat_groups"] == pytest.approx(0.5) and log["search/replaced_groups"] == 1.0
    assert log["search/extra_groups"] == 1.0 and calls[1] == ["q2", "q2"] and len(calls) == 2
    adv = trainer.last_loss_inputs["advantages"]
    assert bool((adv != 0).all()), "every trained row carries an advantage"

    # no prompt with a spread left to draw: the flat group stays (and is trained on, with zero advantage)
    only_flat = [_rows()[0], {**_rows()[0], "question_id": "q1", "prompt": "Question: again?\n"}]
    calls.clear()
    trainer = build_trainer(cfg.model_copy(update={"prompts_per_step": 1}), tiny_model, only_flat, [_reward],
                            rollout, str(tmp_path / "out2"))
    trainer.train()
    log = [h for h in trainer.state.log_history if "search/flat_groups" in h][-1]
    assert log["search/flat_groups"] == 1.0 and log["search/replaced_groups"] == 0.0
    assert log["search/extra_groups"] == 1.0 and len(calls) == 2  # one extra draw (the other prompt), flat too


def _flat_except(spread: set[str], calls: list[list[str]]):
    """A rollout function whose groups are flat (every rollout alike) except those of the ``spread`` prompts."""
    def rollout(rows, model, tokenizer, seed=None) -> list[RolloutSample]:
        calls.append([r["question_id"] for r in rows])
        out = []
        for k, r in enumerate(rows):
            text = f"answer {k}" if r["question_id"] in spread else "answer 0"
            ids = tokenizer(f" {text} <answer>", add_special_tokens=False)["input_ids"]
            out.append(RolloutSample(prompt_ids=tokenizer(r["prompt"])["input_ids"], completion_ids=ids,
                                     loss_mask=[1] * len(ids), response=text, num_searches=1,
                                     finish_reason="answer", format_ok=True, extra={"final_answer": text}))
        return out
    return rollout


@pytest.mark.parametrize("spread", [{"q6"}, {"q4", "q6"}, set()])
def test_resample_ahead_draws_the_same_candidates_in_fewer_calls(tiny_model, tmp_path, spread) -> None:
    """resample_ahead: the extra groups ride in the step's own rollout call and the rest of the allowance goes in
    one more call; the candidates, their order, the replacements and the metrics are those of one call per group."""
    from training.rl.trl_engine import build_trainer

    rows = [{"prompt": f"Question: number {i}?\n", "question": f"number {i}?", "question_id": f"q{i}",
             "golden_answers": ["x"]} for i in range(1, 7)]
    seen = {}
    for ahead in (0, 2):
        calls: list[list[str]] = []
        cfg = TRLSearchConfig(num_generations=2, prompts_per_step=2, max_steps=1, save_steps=100, learning_rate=1e-2,
                              max_completion_length=32, beta=0.0, resample_flat_groups=4, resample_ahead=ahead)
        trainer = build_trainer(cfg, tiny_model, rows, [_reward], _flat_except(spread, calls),
                                str(tmp_path / f"out{ahead}"))
        trainer.train()
        log = [h for h in trainer.state.log_history if "search/flat_groups" in h][-1]
        step = calls[0][:4]
        drawn = [q for call in ([calls[0][4:]] + calls[1:]) for q in call[::2]]  # one id per candidate group
        metrics = tuple(log[f"search/{k}"] for k in ("flat_groups", "extra_groups", "replaced_groups"))
        seen[ahead] = (step, drawn, metrics, len(calls))
    (step0, drawn0, metrics0, n0), (step2, drawn2, metrics2, n2) = seen[0], seen[2]
    assert step0 == step2 and drawn2[:len(drawn0)] == drawn0  # the same candidates, in the same order
    assert set(drawn2).isdisjoint(step2) and len(set(drawn2)) == len(drawn2)
    # the same flat groups and replacements; ahead may have rolled out more candidates than were needed
    assert metrics2[0] == metrics0[0] and metrics2[2] == metrics0[2] and metrics2[1] == len(drawn2) >= metrics0[1]
    assert n0 == 1 + len(drawn0)  # one call per extra group
    assert n2 == (1 if len(drawn2) <= 2 else 2)  # the first two with the step, the rest together
    if not spread:  # nothing to replace a flat group with: the allowance is spent either way
        assert metrics0[1] == metrics2[1] == 4.0 and metrics0[2] == 0.0


def test_resample_ahead_rolls_out_ahead_even_when_no_group_is_flat(tiny_model, tmp_path) -> None:
    """With every group spread, the groups drawn ahead were rolled out for nothing (counted as extra groups) and
    the step trains on its own rows."""
    from training.rl.trl_engine import build_trainer

    rows = [{"prompt": f"Question: number {i}?\n", "question": f"number {i}?", "question_id": f"q{i}",
             "golden_answers": ["x"]} for i in range(1, 7)]
    calls: list[list[str]] = []
    cfg = TRLSearchConfig(num_generations=2, prompts_per_step=2, max_steps=1, save_steps=100, learning_rate=1e-2,
                          max_completion_length=32, beta=0.0, resample_flat_groups=4, resample_ahead=2)
    trainer = build_trainer(cfg, tiny_model, rows, [_reward], _flat_except({f"q{i}" for i in range(1, 7)}, calls),
                            str(tmp_path / "out"))
    trainer.train()
    log = [h for h in trainer.state.log_history if "search/flat_groups" in h][-1]
    assert len(calls) == 1 and len(calls[0]) == 8
    assert (log["search/flat_groups"], log["search/extra_groups"], log["search/replaced_groups"]) == (0.0, 2.0, 0.0)


def test_resample_ahead_sets_the_rollout_batch_and_leaves_the_run_key_alone_when_off() -> None:
    from infra.config import load_config
    from training.rl.config import RLConfig
    from training.rl.trl_engine import rollout_batch_size

    base = load_config(RLConfig, "research_hops_learn_cpu", [])
    off = load_config(RLConfig, "research_hops_learn_cpu", ["stages.grpo.trl.resample_ahead=0"])
    on = load_config(RLConfig, "research_hops_learn_cpu", ["stages.grpo.trl.resample_ahead=2"])
    assert base.key() == off.key() != on.key()  # the runs from before the switch keep their folders
    t = base.stages[0].trl
    assert rollout_batch_size(t) == 16
    assert rollout_batch_size(on.stages[0].trl) == (t.prompts_per_step + 2) * t.num_generations
    # more groups ahead than dynamic sampling may roll out, or ahead without it: refused with the fix named
    for flat in (1, 0):
        with pytest.raises(ValueError, match="resample_ahead at most resample_flat_groups"):
            TRLSearchConfig(resample_flat_groups=flat, resample_ahead=2)
    assert TRLSearchConfig(resample_flat_groups=2, resample_ahead=2).resample_ahead == 2
