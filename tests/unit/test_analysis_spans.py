"""SpanIndex finds by bisection exactly what a scan of every span finds."""

from __future__ import annotations

import random

from stallscope.analysis.spans import SpanIndex, index_of
from stallscope.analysis.sync import merge_intervals, overlap_ns


def _random_spans(rng: random.Random, n: int) -> list[tuple[int, int, int]]:
    spans = []
    for k in range(n):
        start = rng.randrange(0, 10_000)
        spans.append((start, start + rng.choice([0, 1, 5, 50, 400, 3000]), k))  # some long ones, some empty
    return spans


def test_within_and_overlapping_find_what_a_full_scan_finds():
    rng = random.Random(7)
    for _ in range(50):
        spans = _random_spans(rng, rng.randrange(0, 60))
        index = SpanIndex(spans)
        for _ in range(40):
            a = rng.randrange(-100, 10_500)
            b = a + rng.randrange(0, 2000)
            assert sorted(index.within(a, b)) == sorted(k for s, e, k in spans if s >= a and e <= b)
            assert sorted(index.overlapping(a, b)) == sorted(sp for sp in spans if sp[0] < b and sp[1] > a)


def test_overlap_of_merged_intervals_is_syncs_overlap():
    rng = random.Random(3)
    merged = merge_intervals([(s, e) for s, e, _ in _random_spans(rng, 80)])
    index = index_of(merged)
    for a in range(-50, 10_500, 97):
        assert index.overlap_ns(a, a + 333) == overlap_ns(merged, a, a + 333)


def test_an_empty_index_finds_nothing():
    index = SpanIndex([])
    assert index.within(0, 10) == [] and index.overlapping(0, 10) == [] and index.overlap_ns(0, 10) == 0
