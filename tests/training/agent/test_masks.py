"""Training ids and loss masks: for every protocol the trained ids of generated text are the ids the model sampled
(never a token re-merged across the search boundary), inserted text is tokenized on its own and masked, and the
masked (0) runs are exactly the inserted texts."""

from __future__ import annotations

import pytest
from conftest import QUESTIONS, SCRIPTS
from training_fakes import TokenizingGenerator

from training.agent.rollout import RolloutConfig, prompt_token_ids, run_rollouts, token_mask
from training.protocols.base import PROTOCOLS, Segment


def _runs(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """Maximal runs of equal mask value as (value, ids)."""
    runs: list[tuple[int, list[int]]] = []
    for t, m in zip(ids, mask, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(t)
        else:
            runs.append((m, [t]))
    return runs


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_trained_ids_of_generated_text_are_the_sampled_ids(name, questions, bm25, smol_tokenizer) -> None:
    tok = smol_tokenizer
    gen = TokenizingGenerator({q: SCRIPTS[name] for _, q, _ in QUESTIONS}, tok)
    trajs = run_rollouts(questions, name, gen, bm25, RolloutConfig(), tokenizer=tok)
    for t in trajs:
        assert t.n_searches >= 1 and t.token_ids and len(t.token_ids) == len(t.loss_mask)
        assert tok.decode(t.token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == t.response
        runs = _runs(t.token_ids, t.loss_mask)
        trained = [i for m, ids in runs if m == 1 for i in ids]
        inserted = [tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) for m, ids in runs
                    if m == 0]
        if name == "exsearch":
            # a chat protocol: each assistant turn is re-rendered from the parsed step, so the trained ids are that
            # turn's text tokenized on its own (turn boundaries are special tokens), never merged with a user turn
            gen_texts = [t.response[s:e] for s, e in t.generated_spans]
            assert trained == [i for x in gen_texts for i in tok(x, add_special_tokens=False)["input_ids"]]
            assert any("<SEARCH> [0] Title:" in x for x in inserted)
            assert all("<|im_start|>" in x or not x.strip() for x in inserted)
            continue
        sampled = [i for step in gen.sampled[t.question] for i in step]
        assert trained == sampled, "the model is trained on ids it never sampled"
        expected = [turn.inserted for turn in t.turns if turn.inserted]
        assert inserted == expected  # inserted text: its own tokens, exactly, and masked
        assert t.token_ids == [i for m, ids in runs for i in ids]


def test_search_boundary_is_never_merged(smol_tokenizer) -> None:
    # joint tokenization merges the generated '>' of '</search>' with the inserted '<result>' ('><'); per-segment
    # ids keep the generated '>' trainable and the inserted text masked
    tok = smol_tokenizer
    gen_text, ins_text = "<search> Ed Wood </search>", "<result>\ndocs\n</result>"
    sampled = tok(gen_text, add_special_tokens=False)["input_ids"]
    ids, mask, retok = token_mask(tok, "P:", [Segment(gen_text, True, sampled), Segment(ins_text, False)])
    assert ids[: len(sampled)] == sampled and mask[: len(sampled)] == [1] * len(sampled) and retok == 0
    assert mask[len(sampled):] == [0] * (len(ids) - len(sampled))
    joint = tok(gen_text + ins_text, add_special_tokens=False)["input_ids"]
    assert joint != ids  # the old re-tokenization really merged across the boundary for this tokenizer
    assert prompt_token_ids(tok, "P:") == tok("P:", add_special_tokens=False)["input_ids"]


def test_generated_text_without_exact_sampled_ids_is_tokenized_alone(smol_tokenizer) -> None:
    segments = [Segment("hel", True, [0]), Segment("lo world", False), Segment(" again", True)]
    ids, mask, retok = token_mask(smol_tokenizer, "P:", segments)
    assert retok == 2  # [0] does not decode to "hel"; " again" has no ids
    parts = [smol_tokenizer(s.text, add_special_tokens=False)["input_ids"] for s in segments]
    assert ids == parts[0] + parts[1] + parts[2]
    assert mask == [1] * len(parts[0]) + [0] * len(parts[1]) + [1] * len(parts[2])
