"""What handing batches over in order costs workers whose batches take uneven times.

The DataLoader gives batch k to worker ``k mod W`` and returns batches in order (``in_order=True``, its default):
each worker has at most ``prefetch_factor`` batches outstanding, and the training process takes batch k only when
k is done, however many later ones are ready. When one batch takes much longer than the mean (a shard download, a
cold read, a long text), the training process waits for it while the other workers finish their outstanding
batches and then sit idle: the workers deliver less than ``W / mean batch time``. Equal batch times lose nothing;
the wider their spread, the more workers and the shallower their queues, the more is lost.

The loss is found by running that hand-over on the batch times this run measured (their shape: each over their
mean), with the mean and the training process's time per batch the model predicts for the configuration priced.
A run's measured rate already holds its own loss, and every prediction is a ratio of the model's rates, so the
recorded configuration is priced through the same hand-over as every other.
"""

from __future__ import annotations

import functools
import random
import statistics

from stallscope.analysis.findings import LoaderSummary, StepStats
from stallscope.analysis.pipeline import foreign_records
from stallscope.session import Session

#: Fewer timed batches than this in the measured steps: their spread is not known well enough to price.
MIN_BATCHES = 8
#: The batch times' shape is kept as this many quantiles (each over their mean): enough for the tail that matters.
QUANTILES = 32
#: Batches the hand-over is run for: its rate settles within about 1% by then.
HANDOVER_BATCHES = 3000
#: Each batch time is taken over the mean of this many batches around it: only batches in flight together wait on
#: each other, so a slow phase of the run (an epoch's first, download-heavy batches) that slows all of them alike is
#: not a spread the hand-over loses to.
NEIGHBOURS = 16


def batch_time_shape(session: Session, stats: StepStats, train: LoaderSummary | None) -> tuple[float, ...]:
    """The training loader's batch times in the measured steps, each over the mean of the ``NEIGHBOURS`` batches
    around it, as ``QUANTILES`` quantiles; empty where too few were timed. A worker's first batch of an epoch is left
    out: the epoch starts' own cost (``epochs.py``) prices it."""
    if train is None or not stats.steady or train.config.get("in_order") is False:
        return ()
    t0, t1 = stats.steady[0].start_ns, stats.steady[-1].end_ns
    ids = set(train.ids)
    foreign = foreign_records(session, train.ids, train.pid)
    seen: set[tuple[int, int, int, int]] = set()
    times = []
    for f in sorted(session.fetches, key=lambda f: f.start_ns):
        if f.loader_id not in ids or foreign.has(f.pid, f.worker):
            continue
        key = (f.pid, f.loader_id, f.iter_id, f.worker)
        first = key not in seen
        seen.add(key)
        if not first and t0 <= f.start_ns and f.end_ns <= t1 and f.end_ns > f.start_ns:
            times.append(f.end_ns - f.start_ns)
    if len(times) < MIN_BATCHES:
        return ()
    half = NEIGHBOURS // 2
    local = [t / statistics.fmean(times[max(0, i - half):i + half + 1]) for i, t in enumerate(times)]
    mean = statistics.fmean(local)
    ordered = sorted(t / mean for t in local)
    last = len(ordered) - 1
    return tuple(round(ordered[round(last * (q + 0.5) / QUANTILES)], 3) for q in range(QUANTILES))


def in_order_share(shape: tuple[float, ...], workers: int, depth: int, workers_rate: float,
                   compute_rate: float) -> float:
    """The share of ``min(workers_rate, compute_rate)`` that ``workers`` workers with ``depth`` batches each in
    flight deliver in order, their batch times shaped as ``shape``; 1.0 where nothing is lost or nothing is known."""
    if not shape or workers <= 0 or depth <= 0 or workers_rate <= 0 or workers_rate == float("inf"):
        return 1.0
    # the training process's time per batch over a worker's mean batch time: the batch size cancels
    consumer = workers_rate / (workers * compute_rate) if 0 < compute_rate < float("inf") else 0.0
    return _handover_share(shape, workers, depth, float(f"{consumer:.2g}"))


@functools.lru_cache(maxsize=4096)
def _handover_share(shape: tuple[float, ...], workers: int, depth: int, consumer: float) -> float:
    """Run the hand-over: batch k goes to worker ``k mod workers`` when batch ``k - workers x depth`` is taken;
    each worker makes its batches one after another, each taking a time drawn from ``shape`` (mean about 1); the
    training process takes batch k once it is made and spends ``consumer`` on it. Its rate after the first round
    over the rate with every batch taking the mean."""
    draw = random.Random(0)
    free = [0.0] * workers
    ready: dict[int, float] = {}
    in_flight = workers * depth

    def hand_out(k: int, at: float) -> None:
        w = k % workers
        free[w] = max(free[w], at) + draw.choice(shape)
        ready[k] = free[w]

    for k in range(in_flight):
        hand_out(k, 0.0)
    now = started = 0.0
    for k in range(in_flight + HANDOVER_BATCHES):
        if k == in_flight:  # the first round filled the queues: an epoch start, priced in epochs.py
            started = now
        now = max(now, ready.pop(k))
        hand_out(k + in_flight, now)
        now += consumer
    mean = statistics.fmean(shape)
    even = min(workers / mean, 1.0 / consumer if consumer > 0 else float("inf"))
    return min(1.0, HANDOVER_BATCHES / (now - started) / even) if now > started else 1.0
