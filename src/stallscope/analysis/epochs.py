"""What starting every epoch afresh costs a pipeline of workers, for a prediction over the run's length.

The throughput model (``capacity.py``) predicts the steady rate of a pipeline that never stops. A
training loop meets the end of an epoch every ``len(loader)`` batches, or sooner when it breaks out,
and each new ``iter(loader)`` pays again for what the steady rate leaves out:

- **start-up**: without ``persistent_workers`` the workers are new processes. ``fork`` (Linux's default
  up to Python 3.13) starts them one after another in the training process, tens of milliseconds each;
  ``spawn`` and ``forkserver`` start new interpreters that import the script's modules again, seconds each,
  side by side on the cores.
- **stopping**: the same workers are stopped at the epoch's end, and the training process waits while they
  finish the batch they are on and exit. A forked worker leaves at once (``os._exit``); a spawned one tears
  down a whole interpreter first, a third of its import time (0.5 s with torch, 0.9 s with torchvision too).
- **filling**: the first batch of an epoch is made from scratch by one worker (``batch_size`` samples at
  its per-sample cost), where in the steady state a batch arrives every ``batch_size / rate``.
- **warming up**: a new worker's first batches cost it more CPU than its later ones (pages it shares with the
  training process copied as it writes to them, its allocator's arenas and the CPU's caches filled again), so
  the first batch arrives later still, and restarted workers pay it every epoch.
- **dropped batches**: a loop that leaves an epoch early (``break``) leaves up to
  ``num_workers x prefetch_factor`` batches in flight; the workers finish them and they are thrown away.
  Persistent workers finish all of them before the next epoch (the iterator's reset waits for them);
  restarted ones, the ones under way.

A run of a few long epochs pays this a few times and the steady rate holds; a run of short epochs
(a small dataset, a loop that breaks after N batches, a new DataLoader every epoch) may pay more than
the workers gain. A run without workers pays none of it, so its recording cannot show it: the costs
are then estimated from the recorded per-sample costs and the start method, and said so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.findings import LoaderSummary, StepStats
from stallscope.analysis.pipeline import foreign_records
from stallscope.analysis.steps import epochs_of
from stallscope.session import Session

#: Seconds to fork one worker and have it ready, where no worker of the run was measured. Forking copies the page
#: tables, so a bigger process takes longer: 10 ms plus 30 ms per GiB resident, where its size was sampled
#: (calibration: epoch-fork-start).
TYPICAL_FORK_START_S = 0.03
FORK_BASE_S = 0.01
FORK_S_PER_GIB = 0.03
#: Seconds for a spawned or forkserver worker to start Python and import torch, where neither a worker nor the
#: training process's own import of torch was measured (a recording started after torch was imported; calibration:
#: epoch-spawn-start).
TYPICAL_SPAWN_START_S = 2.0
#: Seconds for a stopped worker to exit once its batch is done, where no stop of the run was measured. A worker
#: made by fork or forkserver leaves through ``os._exit``: milliseconds. A spawned worker runs the interpreter's
#: full teardown, a share of its import time (calibration: epoch-spawn-teardown).
TYPICAL_FORKED_STOP_S = 0.005
SPAWN_TEARDOWN_SHARE = 0.3
#: Batches' worth of CPU a new worker spends on its first two batches beyond its steady cost per sample, where
#: no worker of the run made enough batches to measure it (``_worker_warmup``): more where a fixed cost weighs
#: against cheap samples (calibration: epoch-warmup-batches).
TYPICAL_WARMUP_BATCHES = 0.5
#: A worker life is measured for its warm-up only with at least this many batches: two warming up, three or more
#: for its steady cost.
WARMUP_MIN_FETCHES = 5
#: Where the loop leaves its epochs early, one batch per worker in flight (``prefetch_factor=1``) is advised with a
#: worker count when, over the measured epoch starts, it gains this much on the deeper queue's best setting: it saves
#: only the batches an early exit drops, and a deeper queue absorbs uneven batches that no steady rate shows.
SHALLOW_QUEUE_GAIN = 1.05
#: Samplers that walk the whole dataset: with one of them an epoch is ``len(dataset)`` samples, for sessions
#: recorded before ``len(loader)`` was.
WHOLE_DATASET_SAMPLERS = ("RandomSampler", "SequentialSampler")


@dataclass(frozen=True)
class EpochShape:
    """The training loader's epochs inside the measured (steady) steps.

    ``restarts``: new ``iter(loader)`` calls inside the steady steps (epoch starts after the first);
    ``samples``: the samples of those steps; ``left_early``: the epochs end before the sampler runs out;
    ``worker_start_s``: seconds from creating a worker to its being ready to load, per ``start_basis``;
    ``serial_start``: workers start one after another (fork) rather than side by side (spawn, forkserver);
    ``rebuilt``: the script builds a new DataLoader every epoch, so ``persistent_workers`` cannot keep them;
    ``worker_stop_s``: seconds for a round of stopped workers (one per core) to exit once their batch is done,
    per ``stop_basis``; ``warmup_batches``: batches' worth of CPU a new worker spends on its first batches
    beyond its steady cost, per ``warmup_basis``.
    """
    restarts: int
    samples: int
    batch_size: int
    prefetch_factor: int
    persistent: bool
    left_early: bool
    worker_start_s: float
    serial_start: bool
    start_basis: str  # "measured", or how it was estimated: a typical fork or spawn, or torch's import time
    rebuilt: bool = False
    worker_stop_s: float = 0.0
    stop_basis: str = "measured"
    warmup_batches: float = 0.0
    warmup_basis: str = "measured"

    def warmup_share(self, workers: int) -> float:
        """The share of ``workers`` workers' CPU over the measured steps that was their restarts' warm-up
        (``warmup_batches`` each time a worker starts), where the workers were restarted; 0 with persistent ones.
        The model's per-sample costs are read from those steps, so ``build_model`` takes it out of them and
        ``epoch_cost`` adds it back at every restart of whatever worker count is priced."""
        if workers <= 0 or self.persistent or self.samples <= 0:
            return 0.0
        warming = self.restarts * workers * self.warmup_batches * self.batch_size
        return warming / (self.samples + warming)


def epoch_shape(session: Session, stats: StepStats, train: LoaderSummary | None,
                cpus: float = 1.0) -> EpochShape | None:
    """The shape of the training loader's epochs over the steady steps, on ``cpus`` usable CPUs; None where it
    cannot matter (no training loader, fewer than two steady steps, no epoch start inside them, no batch size)."""
    if train is None or len(stats.steady) < 2 or not stats.samples:
        return None
    t0, t1 = stats.steady[0].start_ns, stats.steady[-1].end_ns
    ids = set(train.ids)
    restarts = sum(1 for it in session.iters if it.loader_id in ids and t0 < it.start_ns < t1
                   and train.pid in (None, it.pid))
    config = train.config
    batch_size = config.get("batch_size")
    if restarts == 0 or not isinstance(batch_size, int) or batch_size <= 0:
        return None
    start_s, serial, basis = _worker_start(session, train, cpus)
    stop_s, stop_basis = _worker_stop(session, train, cpus)
    warmup, warmup_basis = _worker_warmup(session, train)
    rebuilt = len(train.ids) > 1
    return EpochShape(
        restarts=restarts, samples=int(stats.samples), batch_size=batch_size,
        prefetch_factor=int(config.get("prefetch_factor") or 2),
        persistent=bool(config.get("persistent_workers")) and not rebuilt,
        left_early=_left_early(session, train, batch_size), worker_start_s=start_s, serial_start=serial,
        start_basis=basis, rebuilt=rebuilt, worker_stop_s=stop_s, stop_basis=stop_basis,
        warmup_batches=warmup, warmup_basis=warmup_basis)


def _left_early(session: Session, train: LoaderSummary, batch_size: int) -> bool:
    """True when most epochs that ended stopped before the sampler ran out (the loop broke out). An epoch is
    ``len(loader)`` batches as recorded (a DistributedSampler's or a subset's share); older sessions know only the
    dataset's length, which is an epoch only for the samplers that walk all of it."""
    config = train.config
    full = config.get("batches_per_epoch")
    if not isinstance(full, int):
        length = config.get("dataset_len")
        if not isinstance(length, int) or config.get("iterable") or config.get("sampler") not in WHOLE_DATASET_SAMPLERS:
            return False
        full = length // batch_size if config.get("drop_last") else math.ceil(length / batch_size)
    if full <= 0:
        return False
    # the last epoch is cut by the run's end
    ended = [len(batches) for batches in epochs_of(session, train.ids, train.pid).values()][:-1]
    return bool(ended) and sum(1 for used in ended if used < full) > len(ended) / 2


def start_method(session: Session, config: dict) -> str:
    """The multiprocessing start method the loader's workers use (or would use): its own context, else the
    platform's default (fork on Linux up to Python 3.13, forkserver from 3.14, spawn on macOS and Windows)."""
    for key in ("start_method", "multiprocessing_context"):  # as recorded; the first is the newer, for 0 workers too
        chosen = str(config.get(key) or "default")
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


def _worker_start(session: Session, train: LoaderSummary, cpus: float) -> tuple[float, bool, str]:
    """(seconds to start one worker, started one after another, how the figure was obtained)."""
    method = start_method(session, train.config)
    serial = method == "fork"
    ids = set(train.ids)
    per_iter: dict[tuple[int, int], list[float]] = {}
    foreign = foreign_records(session, train.ids, train.pid)
    for w in session.worker_starts:
        if w.loader_id in ids and not foreign.has(w.pid, w.worker):
            per_iter.setdefault((w.loader_id, w.iter_id), []).append((w.ready_ns - w.created_ns) / 1e9)
    if per_iter:
        if serial:  # the last worker of a start was ready after all the forks before it
            each = [max(times) / len(times) for times in per_iter.values()]
        else:  # side by side, one round per core count: the last was ready after that many rounds
            each = [max(times) / math.ceil(len(times) / max(1.0, cpus)) for times in per_iter.values()]
        return sorted(each)[len(each) // 2], serial, "measured"
    if serial:
        rss = _resident_bytes(session)
        if rss is None:
            return TYPICAL_FORK_START_S, True, "typical fork"
        return FORK_BASE_S + FORK_S_PER_GIB * rss / 2**30, True, \
            f"typical fork of a {rss / 2**30:.1f} GiB training process"
    imported = train.config.get("torch_import_s")
    if isinstance(imported, (int, float)) and imported > 0:
        return float(imported), False, "as long as the training process took to import torch"
    return TYPICAL_SPAWN_START_S, False, f"typical {method} start"


def _own_fetches(session: Session, train: LoaderSummary) -> list:
    """The batches the training loader's own workers (or its process, worker -1) fetched: not those of another
    training process's loaders recorded in the same session."""
    ids = set(train.ids)
    foreign = foreign_records(session, train.ids, train.pid)
    return [f for f in session.fetches if f.loader_id in ids and not foreign.has(f.pid, f.worker)]


def _worker_warmup(session: Session, train: LoaderSummary) -> tuple[float, str]:
    """(batches' worth of CPU a new worker spends on its first two batches beyond its steady cost, how the figure
    was obtained).

    Measured from the loader's worker lives (one worker of one ``iter``) of at least ``WARMUP_MIN_FETCHES``
    batches: the CPU of its first two batches less their samples at the median CPU per sample of its later ones, in
    full batches at that cost; the median over the lives, none below 0. Anywhere a worker's first batch is
    recorded, inside the measured steps or not. Otherwise ``TYPICAL_WARMUP_BATCHES``."""
    lives: dict[tuple[int, int, int], list] = {}
    for f in _own_fetches(session, train):
        if f.worker >= 0:
            lives.setdefault((f.loader_id, f.iter_id, f.worker), []).append(f)
    each = []
    for fetches in lives.values():
        if len(fetches) < WARMUP_MIN_FETCHES or any(f.items <= 0 for f in fetches):
            continue
        fetches.sort(key=lambda f: f.start_ns)
        steady = statistics.median(f.cpu_ns / f.items for f in fetches[2:])
        batch = max(f.items for f in fetches)
        if steady <= 0:
            continue
        first = fetches[0].cpu_ns + fetches[1].cpu_ns - steady * (fetches[0].items + fetches[1].items)
        each.append(max(0.0, first / (steady * batch)))
    if each:
        return statistics.median(each), "measured"
    return TYPICAL_WARMUP_BATCHES, "typical of a new worker"


def spawned(shape: EpochShape, torch_import_s: float | None) -> EpochShape:
    """The same epochs with the workers started by ``spawn`` instead: new interpreters side by side, each importing
    the script's modules (priced as the training process's import of torch, else a typical spawn), and exiting in a
    third of that."""
    if isinstance(torch_import_s, (int, float)) and torch_import_s > 0:
        start, basis = float(torch_import_s), "as long as the training process took to import torch (spawn)"
    else:
        start, basis = TYPICAL_SPAWN_START_S, "typical spawn start"
    return replace(shape, worker_start_s=start, serial_start=False, start_basis=basis,
                   worker_stop_s=SPAWN_TEARDOWN_SHARE * start, stop_basis="a third of a spawned worker's start")


def _worker_stop(session: Session, train: LoaderSummary, cpus: float) -> tuple[float, str]:
    """(seconds for one round of stopped workers to exit after their last batch, how the figure was obtained).

    Measured from the run's stops of the loader's workers: each stop's wait less the time the workers were still
    finishing a batch (their fetches that ended inside it), over the rounds of as many workers as there are cores;
    the median. Otherwise estimated from how the workers are started (see ``TYPICAL_FORKED_STOP_S``)."""
    ids = set(train.ids)
    ends: dict[tuple[int, int], list[int]] = {}
    for f in _own_fetches(session, train):
        ends.setdefault((f.loader_id, f.iter_id), []).append(f.end_ns)
    each = []
    for stop in session.shutdowns:
        if stop.loader_id not in ids or stop.num_workers <= 0 or stop.pid != session.main_pid:
            continue
        finishing = max((end for end in ends.get((stop.loader_id, stop.iter_id), ()) if stop.start_ns < end),
                        default=stop.start_ns)
        exiting = max(0, stop.end_ns - min(finishing, stop.end_ns)) / 1e9
        each.append(exiting / math.ceil(stop.num_workers / max(1.0, cpus)))
    if each:
        return sorted(each)[len(each) // 2], "measured"
    if int(train.config.get("num_workers") or 0) > 0 and not train.config.get("persistent_workers") \
            and not any(stop.pid == session.main_pid for stop in session.shutdowns):
        # Restarted workers, and not one stop recorded: a session from before stops were, whose steps hold them
        # in their compute already (a recorder that records them records one at every restart).
        return 0.0, "in the measured steps' compute (recorded before stops were)"
    method = start_method(session, train.config)
    if method != "spawn":
        return TYPICAL_FORKED_STOP_S, f"typical exit of a worker started by {method}"
    imported = train.config.get("torch_import_s")
    if isinstance(imported, (int, float)) and imported > 0:
        return SPAWN_TEARDOWN_SHARE * float(imported), "a third of the training process's import of torch"
    return SPAWN_TEARDOWN_SHARE * TYPICAL_SPAWN_START_S, "typical spawned worker's exit"


def _resident_bytes(session: Session) -> int | None:
    """The training process's median resident memory over the run, where it was sampled."""
    series = session.system.processes.get(session.main_pid) if session.main_pid is not None else None
    values = sorted(v for v in series.rss_bytes if v) if series is not None else []
    return values[len(values) // 2] if values else None


@dataclass(frozen=True)
class EpochCost:
    """Seconds one epoch start costs beyond the steady rate, by part (``stop_s``: the previous epoch's workers
    exiting; ``warmup_s``: the new workers' first batches costing more than their steady ones)."""
    start_s: float
    fill_s: float
    dropped_s: float
    stop_s: float = 0.0
    warmup_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.start_s + self.fill_s + self.dropped_s + self.stop_s + self.warmup_s


def epoch_cost(model: ThroughputModel, shape: EpochShape, workers: int, persistent: bool,
               rate: float | None = None) -> EpochCost:
    """What each epoch start costs ``workers`` workers (none without workers: loading then restarts with nothing
    to refill). Start-up: ``workers x worker_start_s`` when forked one after another, else ``worker_start_s``
    once per round of as many workers as there are cores; stopping the previous epoch's, ``worker_stop_s`` per
    round; neither with persistent workers. Filling: one worker's batch at its per-sample cost, less the steady
    interval between batches. Warming up, for restarted workers: the first batch is later by what warming up
    costs one worker (``warmup_batches`` of its batches' CPU), or by what it costs all of them together on the
    cores they have, where they outnumber those; less what the steady interval leaves to spare. Dropped: the
    batches in flight when an epoch is left early, made by the workers side by side and no faster than the cores
    they have allow. The workers' costs are priced at the load ``workers`` put on the cores, as the steady rate
    is. ``rate``: the model's steady rate with ``workers``, where the caller has it already."""
    if workers <= 0:
        return EpochCost(0.0, 0.0, 0.0)
    cpu, blocked = model.at_load(workers).costs(None, workers)  # priced at that many workers' load, as the rate
    rate = model.rate(workers) if rate is None else rate
    rounds = math.ceil(workers / max(1.0, model.usable_cpus))
    if persistent:
        start = stop = 0.0
    else:
        start = workers * shape.worker_start_s if shape.serial_start else shape.worker_start_s * rounds
        stop = shape.worker_stop_s * rounds
    batch = shape.batch_size
    interval = batch / rate if rate > 0 else 0.0
    first = batch * (cpu + blocked)
    fill = max(0.0, first - interval)
    cores = max(1e-9, model.core_capacity(min(float(workers), model.usable_cpus)))
    warming = 0.0 if persistent else shape.warmup_batches * batch * cpu
    warmup = max(0.0, first + max(warming, workers * warming / cores) - interval) - fill
    dropped = 0.0
    if shape.left_early:
        # The batches in flight are finished and thrown away, by the workers in parallel and no faster than the
        # cores they have for the CPU part. Persistent workers finish all of them before the next epoch starts
        # (the iterator's reset waits for them); restarted ones the ones under way, one fewer in practice
        # (measured with 2 workers x prefetch 2: 4 and 3 per epoch).
        in_flight = workers * shape.prefetch_factor - (0 if persistent else 1)
        work = max(0, in_flight) * batch
        dropped = max(work * (cpu + blocked) / workers, work * cpu / cores)
    return EpochCost(start, fill, dropped, stop, warmup)


def rate_over_epochs(model: ThroughputModel, shape: EpochShape, workers: int, persistent: bool) -> float:
    """Samples/s over the steady steps' samples when each of their ``restarts`` epoch starts costs
    :func:`epoch_cost` on top of the model's steady rate."""
    rate = model.rate(workers)
    if rate <= 0:
        return 0.0
    seconds = shape.samples / rate + shape.restarts * epoch_cost(model, shape, workers, persistent, rate).total_s
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


def best_queue_over_epochs(model: ThroughputModel, shape: EpochShape, candidates: list[int], workers_now: int
                           ) -> tuple[int, bool, EpochShape, float]:
    """:func:`best_over_epochs`, and where the loop leaves its epochs early with a queue deeper than one batch per
    worker, the same with ``prefetch_factor=1``: every epoch start then drops one batch per worker instead of
    ``prefetch_factor`` of them. Taken where it gains ``SHALLOW_QUEUE_GAIN`` over the deeper queue's best (the
    speedups are both over the current setting). Returns (workers, persistent, the shape priced, whose
    ``prefetch_factor`` is the one advised, speedup)."""
    workers, keep, gain = best_over_epochs(model, shape, candidates, workers_now)
    if not shape.left_early or shape.prefetch_factor <= 1:
        return workers, keep, shape, gain
    shallow = replace(shape, prefetch_factor=1)
    baseline = rate_over_epochs(model, shape, workers_now, shape.persistent)
    shallow_workers, shallow_keep, _ = best_over_epochs(model, shallow, candidates, workers_now)
    shallow_gain = rate_over_epochs(model, shallow, shallow_workers, shallow_keep) / baseline if baseline > 0 else 1.0
    if shallow_gain >= SHALLOW_QUEUE_GAIN * gain:
        return shallow_workers, shallow_keep, shallow, shallow_gain
    return workers, keep, shape, gain
