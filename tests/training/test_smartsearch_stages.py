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
