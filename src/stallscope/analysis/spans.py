"""Spans of time found by bisection: what overlaps a step, in time proportional to what overlaps it.

A step looks up the batches, copies, epoch starts and waits that fall inside it. Scanning every span of the run
for every step made the analysis quadratic in the run's length: a 10-minute run of 40,000 steps took four and a
half minutes to analyse. Each list is sorted once by start; the running maximum of the ends tells where the spans
that can still reach a step begin, so overlapping spans need not be disjoint.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class SpanIndex(Generic[T]):
    """``(start, end, item)`` spans in nanoseconds, sorted by start."""

    def __init__(self, spans: Iterable[tuple[int, int, T]]) -> None:
        # a span that ends before it starts (clocks of different processes) is kept where it ends
        self.spans = sorted(((min(s, e), e, item) for s, e, item in spans), key=lambda span: (span[0], span[1]))
        self.starts = [span[0] for span in self.spans]
        self.reach: list[int] = []  # the latest end of the spans up to each one: never decreasing
        latest = None
        for _, end, _item in self.spans:
            latest = end if latest is None else max(latest, end)
            self.reach.append(latest)

    def within(self, start: int, end: int) -> list[T]:
        """The items of the spans that lie wholly inside ``[start, end]``."""
        lo = bisect.bisect_left(self.starts, start)
        hi = bisect.bisect_right(self.starts, end)
        return [item for _, e, item in self.spans[lo:hi] if e <= end]

    def overlapping(self, start: int, end: int) -> list[tuple[int, int, T]]:
        """The spans that share time with ``(start, end)``: starting before its end, ending after its start."""
        lo = bisect.bisect_right(self.reach, start)  # every span before this one ended by ``start``
        hi = bisect.bisect_left(self.starts, end)
        return [span for span in self.spans[lo:hi] if span[1] > start]

    def overlap_ns(self, start: int, end: int) -> int:
        """Nanoseconds of the spans inside ``[start, end]``, each counted (as ``sync.overlap_ns`` does for merged
        spans)."""
        return sum(max(0, min(e, end) - max(s, start)) for s, e, _ in self.overlapping(start, end))


def index_of(intervals: Iterable[tuple[int, int]]) -> SpanIndex[None]:
    """An index of bare ``(start, end)`` intervals."""
    return SpanIndex((start, end, None) for start, end in intervals)
