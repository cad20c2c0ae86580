"""The garbage collector's time in the training process, from ``gc.callbacks``: a run whose collections grow longer
(a loop that keeps more objects alive at every step) shows it over time (``analysis/over_time.py``).

Each collection's start and stop cost two clock reads; the totals go out as one cumulative ``gc`` event at most once
a second (a young collection can run hundreds of times a second), read by difference per window (``folding.py``),
with the longest collection since the last event. On Python 3.11 a leak of Python objects hardly changes the
collector's total time (full collections come less often as the heap grows) but lengthens each full one: 112 ms
to 1.2 s over 30 s of a loop keeping 200 small dicts a step.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from stallscope.recorder import events

EMIT_EVERY_NS = 1_000_000_000
_perf = time.perf_counter_ns
_started_ns = 0
_count = 0
_total_ns = 0
_oldest_count = 0  # full collections (generation 2): the ones that walk every object
_oldest_ns = 0
_longest_ns = 0  # the longest collection since the last event: a leak of Python objects lengthens the full ones
_last_emit_ns = 0
_installed = False


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    global _started_ns, _count, _total_ns, _oldest_count, _oldest_ns, _last_emit_ns, _longest_ns
    now = _perf()
    if phase == "start":
        _started_ns = now
        return
    if not _started_ns:
        return
    took = now - _started_ns
    _started_ns = 0
    _count += 1
    _total_ns += took
    _longest_ns = max(_longest_ns, took)
    if info.get("generation") == 2:
        _oldest_count += 1
        _oldest_ns += took
    if now - _last_emit_ns >= EMIT_EVERY_NS:
        _last_emit_ns = now
        # never flushes: we are inside gc
        events.append("gc", now, _count, _total_ns, _oldest_count, _oldest_ns, _longest_ns)
        _longest_ns = 0


def install() -> None:
    """Time the collections of this process (once)."""
    global _installed
    if not _installed:
        gc.callbacks.append(_on_gc)
        _installed = True


def uninstall() -> None:
    """Stop timing (tests: the callback would otherwise outlive the test in its process)."""
    global _installed
    if _installed:
        gc.callbacks.remove(_on_gc)
        _installed = False


def emit() -> None:
    """The totals so far, at exit: a run shorter than a second still says them."""
    if _count:
        events.emit("gc", _perf(), _count, _total_ns, _oldest_count, _oldest_ns, _longest_ns)
