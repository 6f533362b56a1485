"""The length-groups benchmark's helpers: agreement of two top-5 tables, and timing that switches the encoder's path
and searches in calls of the given size."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import query_grouping  # noqa: E402


def test_agreement_counts_equal_top1_and_equal_top5_sets() -> None:
    a = np.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [1, 2, 3, 4, 5]])
    b = np.array([[1, 3, 2, 5, 4], [7, 6, 8, 9, 10], [1, 2, 3, 4, 11]])
    top1, top5 = query_grouping.agreement(a, b)
    assert top1 == 2 / 3 and top5 == 2 / 3


def test_search_ms_switches_the_path_and_searches_in_calls() -> None:
    class Encoder:
        group_queries = True
        pack_queries = True
        unpad_queries = True

    class Searcher:
        encoder = Encoder()
        calls: list[tuple[int, bool]] = []

        def search(self, queries: list[str], k: int) -> list[list[object]]:
            enc = self.encoder
            self.calls.append((len(queries), enc.group_queries or enc.pack_queries or enc.unpad_queries))
            return [[] for _ in queries]

    searcher = Searcher()
    assert query_grouping.search_ms(searcher, [f"q{i}" for i in range(70)], 30, "groups16") >= 0
    assert searcher.calls == [(30, False), (30, False), (10, False)]
    assert query_grouping.search_ms(searcher, [f"q{i}" for i in range(30)], 30, "unpadded") >= 0
    assert searcher.calls[-1] == (30, True)
