"""Throughput and its noise from per-step times, so that noise does not pick a winner.

Consecutive steps are correlated (workers deliver batches in bursts, epochs restart workers),
so the naive standard error of per-step times understates the noise. The standard error here
uses batch means: the steady steps are cut into about sqrt(n) contiguous blocks, each block's
rate is one observation, and the spread of those rates gives the error of the overall rate.
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
    rates = []
    for b in range(blocks):
        lo = b * size
        hi = n if b == blocks - 1 else lo + size
        t = sum(durations_s[lo:hi])
        if t > 0:
            rates.append(sum(units[lo:hi]) / t)
    se = statistics.stdev(rates) / math.sqrt(len(rates)) if len(rates) > 1 else value
    return Rate(value, se, n)


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
