"""Compute split into the parts of the training step: forward, backward, optimizer, and the script's own step code.

The recorder gives spans of the host's time: the model's outermost forward calls, the outermost backward calls and
the optimizer steps (``recorder/step_parts.py``, ``recorder/steps.py``). A step's compute is what is left of it
after the data wait, the copies to the device and the wait for other ranks; each part is its spans' time inside the
step less those, so the parts and the step code add up to compute exactly. Where spans nest, the inner one keeps
the time: a forward and backward inside an optimizer's closure (L-BFGS) are forward and backward, the optimizer's
own update the rest of it; a forward recomputed inside backward (activation checkpointing) is backward.

On a GPU these are the host's times: kernels run asynchronously, so a part that launches work can end before the
work does, and the host then waits where it next synchronizes (an ``.item()``, the optimizer). The device's own
busy time is ``gpu_timing``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallscope.analysis.spans import SpanIndex, index_of
from stallscope.analysis.sync import merge_intervals
from stallscope.session import Session

#: The parts in the order they are shown; ``step_code`` is the rest of compute.
PART_NAMES = ("forward", "backward", "optimizer", "step_code")


@dataclass(frozen=True)
class Parts:
    forward_ns: int
    backward_ns: int
    optimizer_ns: int


class PartsMeter:
    """Measures the parts of each step of one process, given what is not compute in it."""

    def __init__(self, session: Session, pid: int | None, not_compute: list[tuple[int, int]]) -> None:
        forwards = merge_intervals([(f.start_ns, f.end_ns) for f in session.forwards if f.pid == pid])
        backwards = merge_intervals([(b.start_ns, b.end_ns) for b in session.backwards if b.pid == pid])
        optimizer = merge_intervals([(o.start_ns, o.end_ns) for o in session.optimizer_steps if o.pid == pid])
        #: forward and backward were recorded (sessions of older versions have neither: their parts are unknown)
        self.recorded = bool(forwards or backwards)
        gaps = merge_intervals(list(not_compute))
        self._forwards, self._backwards, self._optimizer = index_of(forwards), index_of(backwards), index_of(optimizer)
        self._not_backward = index_of(gaps)
        self._not_forward = index_of(merge_intervals(gaps + backwards))
        self._not_optimizer = index_of(merge_intervals(gaps + backwards + forwards))

    def measure(self, s0: int, s1: int, compute_ns: int) -> Parts:
        """The parts of the step ``[s0, s1)``; never more together than its ``compute_ns``."""
        if not self.recorded:
            return Parts(0, 0, 0)
        backward = _inside(self._backwards, self._not_backward, s0, s1)
        forward = _inside(self._forwards, self._not_forward, s0, s1)
        optimizer = _inside(self._optimizer, self._not_optimizer, s0, s1)
        total = forward + backward + optimizer
        if total > compute_ns > 0:  # waits counted twice where they overlap left compute short: scale to fit
            forward, backward = forward * compute_ns // total, backward * compute_ns // total
            optimizer = compute_ns - forward - backward
        elif compute_ns <= 0:
            return Parts(0, 0, 0)
        return Parts(forward, backward, optimizer)


def _inside(spans: SpanIndex[None], minus: SpanIndex[None], s0: int, s1: int) -> int:
    """Nanoseconds of the (disjoint) ``spans`` inside ``[s0, s1)`` that no (disjoint) ``minus`` span covers."""
    total = 0
    for a, b, _ in spans.overlapping(s0, s1):
        lo, hi = max(a, s0), min(b, s1)
        if hi > lo:
            total += hi - lo - minus.overlap_ns(lo, hi)
    return total
