"""Weighted-loss gradients on a tiny randomly initialised Llama: zero weight = no gradient, doubled weight = 2x."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from training.sft.weighted import (  # noqa: E402
    IGNORE_INDEX,
    WeightedCollator,
    per_example_ce,
    weighted_sequence_loss,
    weighted_trainer_class,
)


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(cfg).double().eval()


# a: 7 tokens, supervised positions 3..6; b: 5 tokens (right-padded to 7), supervised 2..4
A_IDS = [5, 9, 11, 13, 17, 19, 23]
A_LAB = [IGNORE_INDEX] * 3 + [13, 17, 19, 23]
B_IDS = [7, 3, 2, 31, 33]
B_LAB = [IGNORE_INDEX] * 2 + [2, 31, 33]


def _batch(examples):
    width = max(len(ids) for ids, _ in examples)
    ids = [e[0] + [0] * (width - len(e[0])) for e in examples]
    lab = [e[1] + [IGNORE_INDEX] * (width - len(e[1])) for e in examples]
    att = [[1] * len(e[0]) + [0] * (width - len(e[0])) for e in examples]
    return torch.tensor(ids), torch.tensor(lab), torch.tensor(att)


def _grads(model, examples, weights, **kw):
    model.zero_grad()
    ids, lab, att = _batch(examples)
    logits = model(input_ids=ids, attention_mask=att).logits
    loss = weighted_sequence_loss(logits, lab, torch.tensor(weights, dtype=torch.float64), **kw)
    loss.backward()
    return torch.cat([p.grad.flatten().clone() for p in model.parameters()])


def test_zero_weight_changes_no_gradient(tiny_model) -> None:
    g_ab = _grads(tiny_model, [(A_IDS, A_LAB), (B_IDS, B_LAB)], [1.0, 0.0])
    g_a = _grads(tiny_model, [(A_IDS, A_LAB)], [1.0])
    # normalize="mean" divides by B: the pair's loss is (1 * CE_a + 0 * CE_b) / 2 = CE_a / 2
    assert g_a.abs().sum() > 0
    torch.testing.assert_close(g_ab * 2, g_a, rtol=1e-9, atol=1e-12)
    g_ab_sum = _grads(tiny_model, [(A_IDS, A_LAB), (B_IDS, B_LAB)], [1.0, 0.0], normalize="sum")
    torch.testing.assert_close(g_ab_sum, g_a, rtol=1e-9, atol=1e-12)


def test_doubled_weight_doubles_contribution(tiny_model) -> None:
    pair = [(A_IDS, A_LAB), (B_IDS, B_LAB)]
    g_11 = _grads(tiny_model, pair, [1.0, 1.0])
    g_12 = _grads(tiny_model, pair, [1.0, 2.0])
    g_b = _grads(tiny_model, pair, [0.0, 1.0])
    g_a = _grads(tiny_model, pair, [1.0, 0.0])
    assert g_b.abs().sum() > 0
    torch.testing.assert_close(g_12 - g_11, g_b, rtol=1e-7, atol=1e-12)
    torch.testing.assert_close(g_12, g_a + 2 * g_b, rtol=1e-7, atol=1e-12)


def test_per_example_ce_matches_model_loss(tiny_model) -> None:
    ids, lab, att = _batch([(A_IDS, A_LAB)])
    with torch.no_grad():
        out = tiny_model(input_ids=ids, attention_mask=att, labels=lab)
        ce, n = per_example_ce(out.logits, lab)
    assert n.tolist() == [4]
    torch.testing.assert_close(ce[0], out.loss.to(ce.dtype), rtol=1e-6, atol=1e-8)


def test_released_mode_uses_microbatch_nll_ratio(tiny_model) -> None:
    ids, lab, att = _batch([(A_IDS, A_LAB), (B_IDS, B_LAB)])
    with torch.no_grad():
        logits = tiny_model(input_ids=ids, attention_mask=att).logits
        ce, _ = per_example_ce(logits, lab)
        loss = weighted_sequence_loss(logits, lab, probs=torch.tensor([0.5, 1.5]), mode="exsearch_released_buggy")
    # w = [-0.5, -1.5] / -2.0 = [0.25, 0.75]; loss = 0.25 CE_a + 0.75 CE_b (summed, not averaged)
    torch.testing.assert_close(loss, 0.25 * ce[0] + 0.75 * ce[1])
    with pytest.raises(ValueError, match="prob"):
        weighted_sequence_loss(logits, lab, mode="exsearch_released_buggy")


def test_trainer_subclass_and_collator(tiny_model, tmp_path) -> None:
    """The Trainer subclass takes weights from the collated batch; the loss equals the library function."""
    def pad(features):
        ex = [(f["input_ids"], f["labels"]) for f in features]
        ids, lab, att = _batch(ex)
        return {"input_ids": ids, "labels": lab, "attention_mask": att}

    collate = WeightedCollator(pad)
    batch = collate([{"input_ids": A_IDS, "labels": A_LAB, "weight": 2.0}, {"input_ids": B_IDS, "labels": B_LAB}])
    assert batch["weight"].tolist() == [2.0, 1.0]
    cls = weighted_trainer_class(transformers.Trainer)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], save_strategy="no")
    trainer = cls(model=tiny_model, args=args, data_collator=collate)
    assert trainer.model_accepts_loss_kwargs is False
    with torch.no_grad():
        loss = trainer.compute_loss(tiny_model, dict(batch))
        logits = tiny_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        expected = weighted_sequence_loss(logits, batch["labels"], batch["weight"])
    torch.testing.assert_close(loss, expected)
