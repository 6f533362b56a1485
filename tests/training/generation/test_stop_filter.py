"""The stop-string check decodes a row's tail only after a token that can complete a stop string, and decides
exactly as decoding at every step does (``training.generation.decode.StopCheck``)."""

from __future__ import annotations

import random

from training.generation.decode import StopCheck, may_end


class _Counting:
    """Wraps a tokenizer and counts ``decode`` calls."""

    def __init__(self, tok) -> None:
        self.tok, self.calls = tok, 0

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def __len__(self) -> int:
        return len(self.tok)

    def decode(self, *args, **kwargs):
        self.calls += 1
        return self.tok.decode(*args, **kwargs)


def _stops_every_step(tok, stops: list[str], new: list[int], tail: int) -> bool:
    text = tok.decode(new[-tail:], skip_special_tokens=False)
    return any(s in text for s in stops)


def test_filter_decides_like_decoding_every_step(smol_tokenizer) -> None:
    stops = ["</search>", "</answer>"]
    check = StopCheck(smol_tokenizer, stops, eos_id=None)
    assert check.could_end is not None
    text = "I need to look. <search>who wrote Hamlet</search> then <answer>Shakespeare</answer> done"
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    rng = random.Random(0)
    noise = [rng.randrange(len(smol_tokenizer)) for _ in range(300)]
    for seq in (ids, noise, noise[:50] + ids, ids[:9] + noise[:40] + ids):
        # a row ends at the first step whose check says so: both checks must pick the same step
        first_filtered = next((n for n in range(1, len(seq) + 1) if check.done(seq[:n], 10_000)), None)
        first_every = next((n for n in range(1, len(seq) + 1)
                            if _stops_every_step(smol_tokenizer, stops, seq[:n], check.tail)), None)
        assert first_filtered == first_every, seq
    assert next(n for n in range(1, len(ids) + 1) if check.done(ids[:n], 10_000)) < len(ids)


def test_tail_is_decoded_only_after_a_candidate_token(smol_tokenizer) -> None:
    counting = _Counting(smol_tokenizer)
    check = StopCheck(counting, ["</search>"], eos_id=None)
    counting.calls = 0
    ids = smol_tokenizer.encode("plain words with no closing tag at all, " * 8, add_special_tokens=False)
    for n in range(1, len(ids) + 1):
        assert not check.done(ids[:n], 10_000)
    assert counting.calls == 0  # no '>' in any token: nothing decoded
    tag = smol_tokenizer.encode("x</search>", add_special_tokens=False)
    assert check.done(ids + tag, 10_000)
    assert counting.calls >= 1
    assert may_end(check.could_end, tag[-1])


def test_whitespace_or_non_ascii_stop_checks_every_step(smol_tokenizer) -> None:
    assert StopCheck(smol_tokenizer, ["\n\n"], eos_id=None).could_end is None
    assert StopCheck(smol_tokenizer, ["。"], eos_id=None).could_end is None


def test_generate_criterion_keeps_the_new_tokens_on_the_host(smol_tokenizer) -> None:
    """``_StopCriteria`` decides per step exactly as checking each row's new columns read from ``input_ids``, also
    when a call skips a step (it then reads the new columns once)."""
    import torch

    from training.generation.hf import _StopCriteria

    stops = ["</search>", "</answer>"]
    text = "I need to look. <search>who wrote Hamlet</search> then <answer>Shakespeare</answer> done"
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    rng = random.Random(1)
    rows = [ids, [rng.randrange(len(smol_tokenizer)) for _ in range(len(ids))], ids[5:] + ids[:5]]
    prompt = [[7, 8, 9]] * len(rows)
    budgets = [len(ids), 12, len(ids)]
    check = StopCheck(smol_tokenizer, stops, eos_id=None)
    for skip in (None, 4):
        criteria = _StopCriteria(smol_tokenizer, 3, stops, budgets)
        expected = [False] * len(rows)
        for n in range(1, len(ids) + 1):
            for r, row in enumerate(rows):
                expected[r] = expected[r] or n >= budgets[r] or check.done(row[:n], budgets[r])
            if n == skip:
                continue
            seqs = torch.tensor([p + row[:n] for p, row in zip(prompt, rows, strict=True)])
            assert criteria(seqs, None).tolist() == expected, (skip, n)
        assert all(expected)
