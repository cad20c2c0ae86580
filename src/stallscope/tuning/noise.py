"""Throughput and its noise from per-step times, so that noise does not pick a winner.

Consecutive steps are correlated (workers deliver batches in bursts, epochs restart workers),
so the naive standard error of per-step times understates the noise. The standard error here
uses batch means: the steady steps are cut into about sqrt(n) contiguous blocks, each block's
time per unit of work is one observation, and the spread of those times gives the relative error
of the overall rate. Times, not rates: a block of batches the workers had already queued takes
almost no time, its rate is near infinite, and one such block made the spread of rates many times
the rate itself (a tuner trial at 1517/s once reported +-2918/s and lost to a 184/s original).
A block's time per unit lies between zero and the slowest block's, so it cannot blow up.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Improvements must exceed this many combined standard errors to count.
DEFAULT_Z = 2.0


@dataclass(frozen=True)
class Rate:
    """Work per second over the measured steps, with its standard error (same unit)."""
    value: float
    se: float
    steps: int

    @property
    def rel_se(self) -> float:
        return self.se / self.value if self.value > 0 else math.inf


def warmup_steps(total: int, workers: int, prefetch_factor: int | None, batches_per_step: float = 1.0,
                 recorded_warmup: int = 1) -> int:
    """Steps to discard: the recorder's warm-up, and the batches workers prefetched during start-up.

    Right after start-up every worker has its first batches queued, so the next
    ``workers * prefetch_factor`` batches come for free and would flatter configurations with
    many workers in a short trial. At most a third of the steps is discarded.
    """
    prefilled = workers * (prefetch_factor or 2) if workers > 0 else 0
    wanted = max(recorded_warmup, 1 + math.ceil(prefilled / max(batches_per_step, 1.0)))
    return min(wanted, total // 3)


def rate_of(durations_s: Sequence[float], work: Sequence[float] | None = None) -> Rate | None:
    """Rate of ``work`` (samples per step; 1 per step when None) over steps of ``durations_s``."""
    n = len(durations_s)
    if n == 0:
        return None
    units = list(work) if work is not None else [1.0] * n
    total_t = sum(durations_s)
    if total_t <= 0:
        return None
    value = sum(units) / total_t
    if n < 4:
        return Rate(value, value, n)  # too few steps to estimate noise: treat as very noisy
    blocks = max(2, int(math.sqrt(n)))
    size = n // blocks
    times_per_unit = []
    for b in range(blocks):
        lo = b * size
        hi = n if b == blocks - 1 else lo + size
        block_units = sum(units[lo:hi])
        if block_units > 0:
            times_per_unit.append(sum(durations_s[lo:hi]) / block_units)
    if len(times_per_unit) < 2:
        return Rate(value, value, n)
    mean_time_per_unit = total_t / sum(units)
    # The delta method: the rate is 1/time, so its relative error is the time's relative error.
    rel_se = statistics.stdev(times_per_unit) / math.sqrt(len(times_per_unit)) / mean_time_per_unit
    return Rate(value, value * rel_se, n)


def mean_rate(rates: Sequence[Rate]) -> Rate:
    """The mean of repeated runs' rates of one configuration, with the standard error of that mean."""
    if not rates:
        raise ValueError("mean_rate needs at least one rate")
    value = sum(r.value for r in rates) / len(rates)
    se = math.sqrt(sum(r.se ** 2 for r in rates)) / len(rates)
    return Rate(value, se, sum(r.steps for r in rates))


def better(candidate: Rate, incumbent: Rate, z: float = DEFAULT_Z) -> bool:
    """True when ``candidate`` beats ``incumbent`` by more than ``z`` combined standard errors."""
    return candidate.value - incumbent.value > z * math.hypot(candidate.se, incumbent.se)


def within_noise(a: Rate, b: Rate, z: float = DEFAULT_Z) -> bool:
    return abs(a.value - b.value) <= z * math.hypot(a.se, b.se)
