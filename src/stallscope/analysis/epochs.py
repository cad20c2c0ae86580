"""What starting every epoch afresh costs a pipeline of workers, for a prediction over the run's length.

The throughput model (``capacity.py``) predicts the steady rate of a pipeline that never stops. A
training loop meets the end of an epoch every ``len(loader)`` batches, or sooner when it breaks out,
and each new ``iter(loader)`` pays again for what the steady rate leaves out:

- **start-up**: without ``persistent_workers`` the workers are new processes. ``fork`` (Linux's default
  up to Python 3.13) starts them one after another in the training process, tens of milliseconds each;
  ``spawn`` and ``forkserver`` start new interpreters that import the script's modules again, seconds each,
  side by side on the cores.
- **filling**: the first batch of an epoch is made from scratch by one worker (``batch_size`` samples at
  its per-sample cost), where in the steady state a batch arrives every ``batch_size / rate``.
- **dropped batches**: a loop that leaves an epoch early (``break``) leaves about
  ``num_workers x prefetch_factor - 1`` batches in flight; the workers finish them (the training process
  waits for that when the iterator shuts down or resets) and they are thrown away.

A run of a few long epochs pays this a few times and the steady rate holds; a run of short epochs
(a small dataset, a loop that breaks after N batches, a new DataLoader every epoch) may pay more than
the workers gain. A run without workers pays none of it, so its recording cannot show it: the costs
are then estimated from the recorded per-sample costs and the start method, and said so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.findings import LoaderSummary, StepStats
from stallscope.session import Session

#: Seconds to fork one worker and have it ready, where no worker of the run was measured: 20-35 ms per worker
#: for a training process of 0.7 GiB on the 2-core development VM (2026-12-01).
TYPICAL_FORK_START_S = 0.03


@dataclass(frozen=True)
class EpochShape:
    """The training loader's epochs inside the measured (steady) steps.

    ``restarts``: new ``iter(loader)`` calls inside the steady steps (epoch starts after the first);
    ``samples``: the samples of those steps; ``left_early``: the epochs end before the sampler runs out;
    ``worker_start_s``: seconds from creating a worker to its being ready to load, per ``start_basis``;
    ``serial_start``: workers start one after another (fork) rather than side by side (spawn, forkserver);
    ``rebuilt``: the script builds a new DataLoader every epoch, so ``persistent_workers`` cannot keep them.
    """
    restarts: int
    samples: int
    batch_size: int
    prefetch_factor: int
    persistent: bool
    left_early: bool
    worker_start_s: float
    serial_start: bool
    start_basis: str  # "measured" | "typical fork" | "as long as the training process took to build its loader"
    rebuilt: bool = False


def epoch_shape(session: Session, stats: StepStats, train: LoaderSummary | None) -> EpochShape | None:
    """The shape of the training loader's epochs over the steady steps; None where it cannot matter (no
    training loader, fewer than two steady steps, no epoch start inside them, no batch size)."""
    if train is None or len(stats.steady) < 2 or not stats.samples:
        return None
    t0, t1 = stats.steady[0].start_ns, stats.steady[-1].end_ns
    ids = set(train.ids)
    restarts = sum(1 for it in session.iters if it.loader_id in ids and t0 < it.start_ns < t1)
    config = train.config
    batch_size = config.get("batch_size")
    if restarts == 0 or not isinstance(batch_size, int) or batch_size <= 0:
        return None
    start_s, serial, basis = _worker_start(session, train)
    rebuilt = len(train.ids) > 1
    return EpochShape(
        restarts=restarts, samples=int(stats.samples), batch_size=batch_size,
        prefetch_factor=int(config.get("prefetch_factor") or 2),
        persistent=bool(config.get("persistent_workers")) and not rebuilt,
        left_early=_left_early(session, train, batch_size), worker_start_s=start_s, serial_start=serial,
        start_basis=basis, rebuilt=rebuilt)


def _left_early(session: Session, train: LoaderSummary, batch_size: int) -> bool:
    """True when most epochs that ended stopped before the sampler ran out (the loop broke out)."""
    length = train.config.get("dataset_len")
    if not isinstance(length, int) or length <= 0 or train.config.get("iterable"):
        return False
    full = length // batch_size if train.config.get("drop_last") else math.ceil(length / batch_size)
    per_epoch: dict[tuple[int, int], int] = {}
    ids = set(train.ids)
    for n in session.nexts:
        if n.loader_id in ids:
            key = (n.loader_id, n.iter_id)
            per_epoch[key] = per_epoch.get(key, 0) + 1
    ended = list(per_epoch.values())[:-1]  # the last epoch may have been cut by the run's end
    return bool(ended) and sum(1 for used in ended if used < full) > len(ended) / 2


def start_method(session: Session, config: dict) -> str:
    """The multiprocessing start method the loader's workers use (or would use): its own context, else the
    platform's default (fork on Linux up to Python 3.13, forkserver from 3.14, spawn on macOS and Windows)."""
    chosen = str(config.get("multiprocessing_context") or "default")
    if chosen not in ("default", "None"):
        return chosen
    env = session.environment
    system = str(env.get("platform", "")).lower()
    if system.startswith(("macos", "darwin", "windows")):
        return "spawn"
    try:
        major, minor = (int(p) for p in str(env.get("python", "3.11")).split(".")[:2])
    except ValueError:
        return "fork"
    return "forkserver" if (major, minor) >= (3, 14) else "fork"


def _worker_start(session: Session, train: LoaderSummary) -> tuple[float, bool, str]:
    """(seconds to start one worker, started one after another, how the figure was obtained)."""
    method = start_method(session, train.config)
    serial = method == "fork"
    pipeline = train.pipeline
    if pipeline is not None and pipeline.startup_s:
        ids = set(train.ids)
        per_iter: dict[tuple[int, int], list[float]] = {}
        for w in session.worker_starts:
            if w.loader_id in ids:
                per_iter.setdefault((w.loader_id, w.iter_id), []).append((w.ready_ns - w.created_ns) / 1e9)
        if per_iter:
            if serial:  # the last worker of a start was ready after all the forks before it
                each = [max(times) / len(times) for times in per_iter.values()]
            else:
                each = [max(times) for times in per_iter.values()]
            return sorted(each)[len(each) // 2], serial, "measured"
    if serial:
        return TYPICAL_FORK_START_S, True, "typical fork"
    main = next((p for p in session.processes if p.pid == session.main_pid), None)
    loader = next((ld for ld in session.loaders if ld.loader_id == train.loader_id), None)
    if main is not None and main.start_ns is not None and loader is not None and loader.created_ns > main.start_ns:
        return (loader.created_ns - main.start_ns) / 1e9, False, \
            "as long as the training process took to start and build its DataLoader"
    return TYPICAL_FORK_START_S, False, "typical fork"


@dataclass(frozen=True)
class EpochCost:
    """Seconds one epoch start costs beyond the steady rate, by part."""
    start_s: float
    fill_s: float
    dropped_s: float

    @property
    def total_s(self) -> float:
        return self.start_s + self.fill_s + self.dropped_s


def epoch_cost(model: ThroughputModel, shape: EpochShape, workers: int, persistent: bool,
               scale: dict[str, float] | None = None) -> EpochCost:
    """What each epoch start costs ``workers`` workers (none without workers: loading then restarts with nothing
    to refill). Start-up: ``workers x worker_start_s`` when forked one after another, else ``worker_start_s``
    once per round of as many workers as there are cores; none with persistent workers. Filling: one worker's
    batch at its per-sample cost, less the steady interval between batches. Dropped: the batches in flight when
    an epoch is left early, their CPU shared by the cores."""
    if workers <= 0:
        return EpochCost(0.0, 0.0, 0.0)
    cpu, blocked = model.costs(scale, workers)
    rate = model.rate(workers, scale)
    if persistent:
        start = 0.0
    elif shape.serial_start:
        start = workers * shape.worker_start_s
    else:
        start = shape.worker_start_s * math.ceil(workers / max(1.0, model.usable_cpus))
    batch = shape.batch_size
    fill = max(0.0, batch * (cpu + blocked) - (batch / rate if rate > 0 else 0.0))
    dropped = 0.0
    if shape.left_early:
        in_flight = max(0, workers * shape.prefetch_factor - 1)
        dropped = in_flight * batch * cpu / max(1.0, model.core_capacity(model.usable_cpus))
    return EpochCost(start, fill, dropped)


def rate_over_epochs(model: ThroughputModel, shape: EpochShape, workers: int, persistent: bool,
                     scale: dict[str, float] | None = None) -> float:
    """Samples/s over the steady steps' samples when each of their ``restarts`` epoch starts costs
    :func:`epoch_cost` on top of the model's steady rate."""
    rate = model.rate(workers, scale)
    if rate <= 0:
        return 0.0
    seconds = shape.samples / rate + shape.restarts * epoch_cost(model, shape, workers, persistent, scale).total_s
    return shape.samples / seconds if seconds > 0 else rate


def best_over_epochs(model: ThroughputModel, shape: EpochShape, candidates: list[int], workers_now: int
                     ) -> tuple[int, bool, float]:
    """(workers, persistent, speedup over the current setting) counting every epoch start of the measured
    steps: the smallest worker count within 2% of the best rate, kept alive between epochs where that gains
    5% more than restarting them (never for a DataLoader built anew every epoch). The current persistence is
    kept where it is already on."""
    baseline = rate_over_epochs(model, shape, workers_now, shape.persistent)
    choices = {shape.persistent} if shape.rebuilt else {shape.persistent, True}
    options = {(w, p): rate_over_epochs(model, shape, w, p) for w in candidates for p in choices}
    top = max(options.values())
    workers = min(w for (w, _), r in options.items() if r >= 0.98 * top)
    keep = shape.persistent or ((workers, True) in options
                                and options[(workers, True)] >= 1.05 * options[(workers, shape.persistent)])
    return workers, keep, options[(workers, keep)] / baseline if baseline > 0 else 1.0
