"""E-step scoring: gold substitution, assistant-only spans, batching invariance, manual log-prob equality."""

from __future__ import annotations

import math

import pytest

from infra.errors import DataError
from training.em.scoring import (
    ScoringConfig,
    ScoringInput,
    score_trajectories,
    supervised_spans,
    with_gold_answer,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


CHAT = [
    {"role": "user", "content": "Which city is the capital of France?"},
    {"role": "assistant", "content": "<QUERY> capital of France"},
    {"role": "user", "content": "<SEARCH> [0] Title: Paris. Content: Paris is the capital and largest city of France."},
    {"role": "assistant", "content": "<FACT> Paris is the capital\n<FINAL>"},
    {"role": "user", "content": "<FINAL>\n<SEARCH> end search. please give the final answer to the input question"},
    {"role": "assistant", "content": "Lyon"},
]


@pytest.fixture(scope="module")
def tok(smol_path):
    return transformers.AutoTokenizer.from_pretrained(str(smol_path))


@pytest.fixture(scope="module")
def tiny(tok):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_gold_substitution_and_spans(tok) -> None:
    chat = with_gold_answer(CHAT, "Paris")
    assert chat[-1] == {"role": "assistant", "content": "Paris"} and CHAT[-1]["content"] == "Lyon"
    ids, mask = supervised_spans(tok, chat, "answer")
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == "Paris<|im_end|>\n"
    ids, mask = supervised_spans(tok, chat, "trajectory")
    scored = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert scored == ("<QUERY> capital of France<|im_end|>\n<FACT> Paris is the capital\n<FINAL><|im_end|>\n"
                      "Paris<|im_end|>\n")
    assert "Content:" not in scored  # retrieved documents (user turns) are never scored
    with pytest.raises(DataError, match="must end with the assistant"):
        with_gold_answer(CHAT[:-1], "Paris")


def _manual(model, tok, chat, tokens):
    ids, mask = supervised_spans(tok, chat, tokens)
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return sum(logp[t - 1, ids[t]].item() for t in range(1, len(ids)) if mask[t]), sum(mask)


def test_scores_match_manual_and_are_batch_invariant(tiny, tok) -> None:
    short = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "x"}]
    items = [
        ScoringInput(trajectory_id="a", question_id="q", messages=CHAT, gold_answer="Paris"),
        ScoringInput(trajectory_id="b", question_id="q",
                     messages=CHAT[:-1] + [{"role": "assistant", "content": "Nice"}], gold_answer="Paris"),
        ScoringInput(trajectory_id="c", question_id="r", messages=short, gold_answer="a much longer gold answer"),
    ]
    cfg = ScoringConfig(tokens="trajectory", batch_tokens=4096)
    batched = score_trajectories(items, "unused", cfg, model=tiny, tokenizer=tok)
    single = score_trajectories(items, "unused", cfg.model_copy(update={"batch_tokens": 64}), model=tiny, tokenizer=tok)
    for b, s in zip(batched, single, strict=True):
        assert b.sum_logprob == pytest.approx(s.sum_logprob, rel=1e-4, abs=1e-3)  # padding does not leak
    # the predicted answer is replaced by the gold one: a and b score identically
    assert batched[0].sum_logprob == pytest.approx(batched[1].sum_logprob, rel=1e-5)
    want, n = _manual(tiny, tok, with_gold_answer(CHAT, "Paris"), "trajectory")
    assert batched[0].n_tokens == n and batched[0].sum_logprob == pytest.approx(want, rel=1e-4)
    ans = score_trajectories(items[:1], "unused", ScoringConfig(tokens="answer"), model=tiny, tokenizer=tok)[0]
    assert 0 < ans.n_tokens < batched[0].n_tokens and ans.sum_logprob > batched[0].sum_logprob
    too_long = score_trajectories(items[:1], "unused", ScoringConfig(max_length=16), model=tiny, tokenizer=tok)[0]
    assert math.isnan(too_long.sum_logprob)


def test_answer_scores_use_logits_at_scored_positions_only(tiny, tok) -> None:
    """Answer-only scores in one padded batch (answers at different positions per row) equal the full-logits manual
    ones, with the model's ``logits_to_keep`` and without it (a forward that lacks the argument)."""

    class NoKeep(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None):  # noqa: ANN001, ANN202 - test double
            return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    short = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": "x"}]
    items = [ScoringInput(trajectory_id="a", question_id="q", messages=CHAT, gold_answer="Paris"),
             ScoringInput(trajectory_id="c", question_id="r", messages=short, gold_answer="a much longer gold answer")]
    cfg = ScoringConfig(tokens="answer", batch_tokens=4096)
    for model in (tiny, NoKeep(tiny)):
        got = score_trajectories(items, "unused", cfg, model=model, tokenizer=tok)
        for it, g in zip(items, got, strict=True):
            want, n = _manual(tiny, tok, with_gold_answer(it.messages, it.gold_answer), "answer")
            assert g.n_tokens == n and g.sum_logprob == pytest.approx(want, rel=1e-4, abs=1e-4)


@pytest.mark.slow
def test_real_model_prefers_the_supported_answer(smol_path) -> None:
    """SmolLM2-135M: with the document in context, the supported gold answer is more likely than an unrelated one."""
    items = [ScoringInput(trajectory_id=g, question_id="q", messages=CHAT, gold_answer=g) for g in ("Paris", "Tokyo")]
    res = score_trajectories(items, str(smol_path), ScoringConfig(tokens="answer"))
    assert all(math.isfinite(r.sum_logprob) for r in res)
    assert res[0].sum_logprob > res[1].sum_logprob


def test_answer_only_scoring_is_the_default_in_every_preset() -> None:
    # Samples come from the model, so the importance weight is p(y* | x, z_i): answer-only scoring. Whole-trajectory
    # scoring (the released _entropy.py) stays a named option but no preset uses it by default.
    from infra.config import load_config
    from infra.settings import REPO_ROOT
    from training.em.config import EMLoopConfig

    assert ScoringConfig().tokens == "answer"
    assert ScoringConfig(tokens="trajectory").tokens == "trajectory"
    presets = sorted((REPO_ROOT / "flows" / "configs").glob("exsearch*.yaml"))
    assert presets
    for preset in presets:
        assert load_config(EMLoopConfig, preset).scoring.tokens == "answer", preset.name
