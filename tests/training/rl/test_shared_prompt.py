"""The GRPO loss with each distinct prompt forwarded once (``TRLSearchConfig.share_prompt``,
``training/rl/shared_prompt.py``): the same per-token log-probs and gradients as TRL's forward of every row's prompt +
completion (a tiny random Llama, fp32, full fine-tune and LoRA), micro-batches filled one prompt at a time without
changing the step's gradient, and token-budget parts that count a shared prompt once."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from training.rl.shared_prompt import order_by_prompt, prompt_groups, shared_prompt_logps  # noqa: E402
from training.rl.trl_engine import loss_parts  # noqa: E402

#: (prompt id, completion length): three rows of prompt 0, two of prompt 1, one of prompt 2
ROWS = [(0, 6), (1, 9), (0, 3), (2, 7), (1, 5), (0, 8)]
PROMPT_LENGTHS = [7, 4, 10]


def _batch(vocab: int = 100, seed: int = 0) -> dict:
    """A TRL-shaped loss batch with repeated prompts: left-padded prompts, right-padded completions, a tool mask."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, vocab, (n,), generator=g) for n in PROMPT_LENGTHS]
    n, wp, wc = len(ROWS), max(PROMPT_LENGTHS) + 1, max(c for _, c in ROWS) + 2
    prompt_ids, prompt_mask = torch.zeros(n, wp, dtype=torch.long), torch.zeros(n, wp, dtype=torch.long)
    completion_ids, completion_mask = torch.zeros(n, wc, dtype=torch.long), torch.zeros(n, wc, dtype=torch.long)
    for i, (p, c) in enumerate(ROWS):
        prompt_ids[i, wp - len(prompts[p]):] = prompts[p]
        prompt_mask[i, wp - len(prompts[p]):] = 1
        completion_ids[i, :c] = torch.randint(1, vocab, (c,), generator=g)
        completion_mask[i, :c] = 1
    tool_mask = torch.ones(n, wc, dtype=torch.long)
    tool_mask[1, 2:5] = 0  # retrieved tokens: in context, out of the loss
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "tool_mask": tool_mask,
            "advantages": torch.randn(n, generator=g), "num_items_in_batch": completion_mask.sum()}


def test_prompt_groups_ignore_padding_and_keep_first_appearance_order() -> None:
    batch = _batch()
    groups = prompt_groups(batch["prompt_ids"], batch["prompt_mask"])
    assert [rows for rows, _ in groups] == [[0, 2, 5], [1, 4], [3]]
    assert [len(ids) for _, ids in groups] == PROMPT_LENGTHS


def test_order_by_prompt_makes_each_prompt_consecutive() -> None:
    batch = {**_batch(), "names": list("abcdef")}
    out = order_by_prompt(batch, "grpo")
    assert out["names"] == list("acfbed")
    assert torch.equal(out["advantages"], batch["advantages"][[0, 2, 5, 1, 4, 3]])
    assert out["num_items_in_batch"] is batch["num_items_in_batch"]
    assert order_by_prompt(batch, "bnpo") is batch  # its normaliser depends on the micro-batches: TRL's order


def _trainer(model_dir, out_dir, lora_rank: int | None, lora_layers: int | None = None):
    from training.rl.config import TRLSearchConfig
    from training.rl.trl_engine import build_trainer

    def never(*_args, **_kwargs):
        raise AssertionError("no rollout in this test")

    def reward(completions, **_kwargs):
        return [0.0] * len(completions)

    trl = TRLSearchConfig(num_generations=6, prompts_per_step=1, max_steps=1, beta=0.0, max_completion_length=16,
                          micro_batch_size=6, lora_rank=lora_rank, lora_layers=lora_layers)
    trainer = build_trainer(trl, str(model_dir), [{"prompt": "q"}], [reward], never, str(out_dir))
    trainer.model.train()
    if lora_rank:  # PEFT initialises LoRA's B to zero: give the adapters a value so their gradient paths differ
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
    return trainer


def test_shared_forward_gives_trls_log_probs_and_gradients(tiny_model_dir, tmp_path) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, None)
    model, batch = trainer.model, _batch(vocab=trainer.model.config.vocab_size)
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].size(1)
    mask = batch["completion_mask"].bool()
    results = []
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        if shared:
            logps, ent = shared_prompt_logps(model, input_ids, attention, width, 0.7, True, batch_size=2)
        else:
            logps, ent = _trl_at_temperature(model, input_ids, attention, width, 0.7)
        weights = torch.randn(int(mask.sum()), generator=torch.Generator().manual_seed(1))  # every position counts
        (logps[mask] * weights).mean().backward()
        results.append((logps.detach(), ent, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (a, ea, ga), (b, eb, gb) = results
    torch.testing.assert_close(b[mask], a[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(eb[mask], ea[mask], rtol=1e-5, atol=1e-5)
    assert len(ga) == len(gb) and any(g.abs().sum() > 0 for g in ga)
    for x, y in zip(ga, gb, strict=True):  # float order only: within 1e-5 of the tensor's largest entry
        torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-5 * float(x.abs().max()))


def _trl_at_temperature(model, input_ids, attention, width, temperature):
    """TRL 0.24's concatenated forward (its ``_get_per_token_logps_and_entropies`` body) at ``temperature``."""
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    logits = model(input_ids=input_ids, attention_mask=attention, logits_to_keep=width + 1, use_cache=False).logits
    logits = logits[:, :-1, :][:, -width:, :] / temperature
    with torch.no_grad():
        ent = entropy_from_logits(logits)
    return selective_log_softmax(logits, input_ids[:, -width:]), ent


def _loss_grads(trainer, batch: dict, shared: bool, budget: int | None) -> tuple[float, list]:
    trainer.model.zero_grad(set_to_none=True)
    trainer.share_prompt, trainer.loss_token_budget = shared, budget
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


@pytest.mark.parametrize(("lora_rank", "loss_type", "budget", "lora_layers"),
                         [(None, "grpo", None, None), (None, "dr_grpo", 40, None), (4, "grpo", None, None),
                          (4, "grpo", 40, None), (4, "grpo", None, 1), (4, "grpo", 40, 1)])
def test_trainer_loss_with_shared_prompts_gives_the_same_gradient(tiny_model_dir, tmp_path, lora_rank, loss_type,
                                                                  budget, lora_layers) -> None:
    """Also with LoRA on the top one of two layers only (``lora_layers``; both switches on in SmartSearch attempt 2's
    preset): the prompt forwarded once gives TRL's loss and the adapters' gradients."""
    trainer = _trainer(tiny_model_dir, tmp_path, lora_rank, lora_layers)
    if lora_layers:
        assert {int(n.split(".layers.")[1].split(".")[0]) for n, _ in trainer.model.named_parameters()
                if "lora_" in n} == {1}
    trainer.loss_type = loss_type
    batch = _batch(vocab=trainer.model.config.vocab_size)
    base_loss, base = _loss_grads(trainer, batch, False, budget)
    shared_loss, shared = _loss_grads(trainer, batch, True, budget)
    assert shared_loss == pytest.approx(base_loss, rel=1e-5, abs=1e-7)
    assert len(shared) == len(base) and any(g.abs().sum() > 0 for g in base)
    for a, b in zip(base, shared, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_budget_parts_count_a_shared_prompt_once() -> None:
    batch = order_by_prompt(_batch(), "grpo")  # rows 0-2 prompt 0 (7 tokens), 3-4 prompt 1 (4), 5 prompt 2 (10)
    # prompt 0's three rows cost 7 + 3 x 8 = 31 tokens with the prompt once, 3 x (7 + 8) = 45 without
    plain = loss_parts(batch, 31)
    shared = loss_parts(batch, 31, shared_prompt=True)
    assert [0, 1, 2] in [idx.tolist() for idx, _ in shared]
    assert all(len(set(idx.tolist()) & {0, 1, 2}) < 3 for idx, _ in plain)
    assert sorted(r for idx, _ in shared for r in idx.tolist()) == list(range(len(ROWS)))
    for idx, part in shared:
        rows = idx.tolist()
        prompts = {ROWS[[0, 2, 5, 1, 4, 3][r]][0] for r in rows}
        cost = sum(PROMPT_LENGTHS[p] for p in prompts) + len(rows) * part["completion_ids"].size(1)
        assert len(rows) == 1 or cost <= 31


def test_share_prompt_off_leaves_the_run_key_alone() -> None:
    from infra.config import load_config
    from training.rl.config import RLConfig

    base = load_config(RLConfig, "research_hops_learn_cpu", [])
    off = load_config(RLConfig, "research_hops_learn_cpu", ["stages.grpo.trl.share_prompt=false"])
    on = load_config(RLConfig, "research_hops_learn_cpu", ["stages.grpo.trl.share_prompt=true"])
    assert base.key() == off.key() != on.key()  # the runs from before the switch keep their folders
    assert on.stages[0].trl.share_prompt and not base.stages[0].trl.share_prompt


def test_share_prompt_with_gradient_checkpointing_is_refused_with_the_fix() -> None:
    from pydantic import ValidationError

    from training.rl.config import TRLSearchConfig

    with pytest.raises(ValidationError, match="set one of them to false"):
        TRLSearchConfig(share_prompt=True, gradient_checkpointing=True)


def test_trainer_shares_only_text_calls_with_a_repeated_prompt(tiny_model_dir, tmp_path) -> None:
    trainer = _trainer(tiny_model_dir, tmp_path, None)
    batch = _batch(vocab=trainer.model.config.vocab_size)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    width = batch["completion_ids"].size(1)
    groups = trainer._shared_groups(ids, mask, (width,), {"compute_entropy": True, "pixel_values": None})
    assert [rows for rows, _ in groups] == [[0, 2, 5], [1, 4], [3]]
    assert trainer._shared_groups(ids, mask, (width,), {"pixel_values": torch.zeros(1)}) is None  # not text-only
    distinct = [0, 1, 3]  # one row of each prompt: nothing to share, TRL's forward
    assert trainer._shared_groups(ids[distinct], mask[distinct], (width,), {}) is None


@pytest.mark.parametrize(("lora_rank", "shared"), [(None, False), (4, True)])
def test_grouped_loss_attention_gives_the_same_loss_and_gradient(tiny_model_dir, tmp_path, monkeypatch, lora_rank,
                                                                 shared) -> None:
    from training.generation import attention

    calls = []
    grouped = attention.grouped_attention
    monkeypatch.setattr(attention, "grouped_attention", lambda *a, **k: calls.append(1) or grouped(*a, **k))
    trainer = _trainer(tiny_model_dir, tmp_path, lora_rank)
    assert trainer.model.config._attn_implementation == "sdpa"
    batch = _batch(vocab=trainer.model.config.vocab_size)
    base_loss, base = _loss_grads(trainer, batch, shared, None)
    assert not calls
    trainer.loss_attention = "grouped"
    grouped_loss, grads = _loss_grads(trainer, batch, shared, None)
    assert calls  # the loss ran grouped attention, and the model is back on sdpa after it
    assert trainer.model.config._attn_implementation == "sdpa"
    assert grouped_loss == pytest.approx(base_loss, rel=1e-5, abs=1e-7)
    for a, b in zip(base, grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    monkeypatch.undo()
    attention.register()  # transformers' registry holds the counting wrapper until the real function is back


def test_loss_attention_model_leaves_the_run_key_alone() -> None:
    from infra.config import load_config
    from training.rl.config import RLConfig

    base = load_config(RLConfig, "research_hops_learn_cpu", [])
    same = load_config(RLConfig, "research_hops_learn_cpu", ["stages.grpo.trl.loss_attention=model"])
    grouped = load_config(RLConfig, "research_hops_learn_cpu", ["stages.grpo.trl.loss_attention=grouped"])
    assert base.key() == same.key() != grouped.key()
