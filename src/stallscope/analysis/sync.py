"""When a rank process was waiting for the others: the intervals of the ``sync`` node.

A synchronous collective (``barrier``, ``all_reduce`` without ``async_op``, ``Work.wait``) blocks its
caller from start to end, and so does the end of a DDP model's ``backward`` (``ddp.allreduce``, from
its last gradient computed to its return: the buckets still being all-reduced). Sessions of earlier
versions timed DDP's buckets one by one; there each backward pass counts from its latest hand-over
to its latest completion.
"""

from __future__ import annotations

from stallscope.session import CollectiveRecord, Session


def sync_intervals(session: Session, pid: int | None) -> list[tuple[int, int]]:
    """Merged, sorted intervals during which process ``pid`` waited in collectives."""
    own = [c for c in session.collectives if c.pid == pid]
    intervals = [(c.start_ns, c.end_ns) for c in own if c.blocking and c.end_ns > c.start_ns]
    intervals += _bucket_waits([c for c in own if c.op == "ddp.allreduce" and not c.blocking])
    return merge_intervals(intervals)


def _bucket_waits(buckets: list[CollectiveRecord]) -> list[tuple[int, int]]:
    """One wait per backward pass: each bucket index is reduced once per pass, so a repeat starts the next."""
    waits: list[tuple[int, int]] = []
    group: list[CollectiveRecord] = []
    for bucket in sorted(buckets, key=lambda c: c.start_ns):
        if group and any(c.bucket == bucket.bucket for c in group):
            waits.append(_group_wait(group))
            group = []
        group.append(bucket)
    if group:
        waits.append(_group_wait(group))
    return [w for w in waits if w[1] > w[0]]


def _group_wait(group: list[CollectiveRecord]) -> tuple[int, int]:
    return max(c.start_ns for c in group), max(c.end_ns for c in group)


def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def overlap_ns(intervals: list[tuple[int, int]], start: int, end: int) -> int:
    """Nanoseconds of ``intervals`` (merged) inside ``[start, end]``."""
    return sum(max(0, min(b, end) - max(a, start)) for a, b in intervals if a < end and b > start)
