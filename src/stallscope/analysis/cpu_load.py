"""The load a configuration puts on the usable cores, and what a CPU second costs under it, for the throughput model
(``capacity.ThroughputModel``; these functions are its methods of the same names, bound in ``capacity.py``).

A core's hardware threads (SMT, hyper-threading) are not cores: where the usable CPUs are ``physical_cores`` cores
with two or more hardware threads each, each busy thread beyond one per core adds only ``SMT_YIELD`` of a core
(``core_capacity``), so the budget, the workers' rate and the compute beside busy workers all count core capacity,
not CPUs.

A CPU second does not cost the same at every load. With every core busy the cores share caches, memory bandwidth
and a lower all-core clock (``ALL_CORES_BUSY_COST``); with more runnable threads than cores the kernel switches
between them, which costs work that takes fresh memory (a decode's new buffers, shared-memory segments) most and
work whose memory stays put little: the page faults each fetch took say which (``worker_sharing_cost``). The
training process's own work pays a little more for sharing its core (``COMPUTE_TIME_SHARING_COST``), and a worker's
CPU second costs more again while the training computes on the CPU beside it (``COMPUTE_NEIGHBOUR_COST``). A run
measures its costs under its own load only, so every rate prices the CPU work by ``load_cost`` of the threads that
configuration keeps busy over the load the run was recorded under (``load_costs``, ``at_load``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from stallscope.analysis.sample_costs import CPU_STAGES

if TYPE_CHECKING:
    from stallscope.analysis.capacity import ThroughputModel

#: Cores' worth of work a core's second hardware thread adds when both are busy: not measured, a vendors' figure
#: (calibration: cap-smt-yield).
SMT_YIELD = 0.25
#: How much more a CPU second costs with every core busy than with one (shared caches and memory bandwidth, a lower
#: all-core clock), reached in proportion as the busy cores go from one to all (calibration: cap-all-cores-busy).
ALL_CORES_BUSY_COST = 0.04
#: How much more a CPU second of work that streams through fresh memory costs once runnable threads outnumber the
#: cores, reached at one thread more: the slice sets how often the kernel switches, so more threads cost no more
#: (calibration: cap-time-sharing).
TIME_SHARING_COST = 0.08
#: The time-sharing cost of work whose memory stays put (a pure-Python tokenizer's pooled objects): the cost is the
#: fresh memory, not the cache footprint (calibration: cap-resident-time-sharing).
RESIDENT_TIME_SHARING_COST = 0.02
#: Minor page faults per CPU second of the workers' work at which their time-sharing cost is ``TIME_SHARING_COST``
#: (from ``RESIDENT_TIME_SHARING_COST`` at none, in proportion) (calibration: cap-fresh-pages).
FRESH_PAGES_FOR_FULL_SHARING_COST = 20_000.0
#: ``TIME_SHARING_COST`` for the training process's own CPU work: its weights, activations and optimizer state are
#: a working set the neighbour's work evicts at every switch (calibration: cap-compute-time-sharing).
COMPUTE_TIME_SHARING_COST = 0.1
#: How much more a worker's CPU second costs while the training computes on the CPU beside it, on another core,
#: reached as that computing goes from none of the time to all of it: a training step is a heavier neighbour for the
#: shared caches and memory than another worker's decode, and a 0-worker run never shows it (calibration:
#: cap-compute-neighbour).
COMPUTE_NEIGHBOUR_COST = 0.3
#: Passes that price a configuration's CPU work at its load and read the load again, at most: two or three agree to
#: a millionth for most configurations, up to eight for a heavy compute time-sharing its cores.
LOAD_PASSES = 12


def core_capacity(model: ThroughputModel, busy: float) -> float:
    """Cores' worth of work ``busy`` runnable threads get done at once: a core each up to the physical cores,
    ``SMT_YIELD`` for each further one, never more than the usable CPUs."""
    busy = max(0.0, min(busy, model.usable_cpus))
    cores = model.physical_cores
    if cores is None or cores >= model.usable_cpus:
        return busy
    return min(busy, cores) + SMT_YIELD * max(0.0, busy - cores)


def smt_speed(model: ThroughputModel, busy: float) -> float:
    """How fast each of ``busy`` runnable threads runs against a core of its own, from shared cores' hardware
    threads alone (time-sharing beyond the usable CPUs is not in it)."""
    running = min(busy, model.usable_cpus)
    return model.core_capacity(running) / running if running > 0 else 1.0


def busy_threads(model: ThroughputModel, workers: int, scale: dict[str, float] | None, rate: float) -> float:
    """Threads that want a core at ``rate`` samples/s, on average: the training process while it computes (without
    workers, its loading too), the workers for their CPU work, both stretched where cores are short, and the helpers.
    Continuous in the rate, so no worker count is priced all-busy on one side of a threshold and idle on the other."""
    cpu, blocked = model.costs(scale, workers)
    helper = rate * model.helper_cpu_per_sample_s
    if workers <= 0:
        return rate * (cpu + model.working_cpu_s()) + helper
    occupancy = max(0.0, min(model.main_occupancy, model.usable_cpus))
    on_cpu = cpu / (cpu + blocked) if cpu + blocked > 0 else 0.0
    demand = occupancy + workers * on_cpu
    stretch = max(1.0, demand / model.usable_cpus) if model.usable_cpus > 0 else 1.0
    computing = min(1.0, rate * model.compute_per_sample_s * (stretch if model.compute_on_cpu else 1.0))
    main = occupancy * computing + rate * model.receive_cpu_s()
    return main + min(workers * on_cpu, rate * cpu * stretch) + helper


def computing_share(model: ThroughputModel, workers: int, rate: float) -> float:
    """The share of the time the training process computes on the CPU beside busy workers at ``rate``: what makes
    their CPU seconds dearer (``COMPUTE_NEIGHBOUR_COST``). None without workers (loading and compute take turns), on
    a GPU, or on a single core (time-sharing and SMT price that); on a fraction of a second core in proportion."""
    if workers <= 0 or not model.compute_on_cpu or rate <= 0:
        return 0.0
    cores = min(model.physical_cores or model.usable_cpus, model.usable_cpus)
    beside = min(1.0, max(0.0, cores - 1.0))
    return min(1.0, rate * model.compute_per_sample_s) * beside


def load_cost(model: ThroughputModel, busy: float, compute: bool = False) -> float:
    """What a CPU second costs with ``busy`` threads wanting the usable CPUs, against one thread alone: the
    all-cores cost up to a thread per core, then the time-sharing cost (the training process's own, ``compute``)
    up to one thread more than CPUs."""
    cpus = model.usable_cpus
    if cpus <= 0:
        return 1.0
    # over the cores: a core's hardware threads share more than caches, which SMT_YIELD prices already
    cores = min(model.physical_cores or cpus, cpus)
    shared = min(1.0, max(0.0, (busy - 1.0) / (cores - 1.0))) if cores > 1.0 else 0.0
    sharing_cost = COMPUTE_TIME_SHARING_COST if compute else model.worker_sharing_cost()
    return 1.0 + ALL_CORES_BUSY_COST * shared + sharing_cost * min(1.0, max(0.0, busy / cpus - 1.0))


def worker_sharing_cost(model: ThroughputModel) -> float:
    """A worker's time-sharing cost from the fresh memory its work takes (page faults per CPU second); the full
    cost where the faults were not counted."""
    if model.fresh_pages_per_cpu_s is None:
        return TIME_SHARING_COST
    fresh = min(1.0, max(0.0, model.fresh_pages_per_cpu_s / FRESH_PAGES_FOR_FULL_SHARING_COST))
    return RESIDENT_TIME_SHARING_COST + (TIME_SHARING_COST - RESIDENT_TIME_SHARING_COST) * fresh


def cpu_slowed(model: ThroughputModel, factor: float, compute_factor: float | None = None) -> ThroughputModel:
    """The model with every CPU cost ``factor`` times as long (workers', shared-memory, rebuilding, helpers'), and
    the training process's own CPU and CPU compute, where measured, ``compute_factor`` times (``factor`` where not
    given). A GPU's compute, a given one and blocked time stay."""
    own = factor if compute_factor is None else compute_factor
    cost = {node: seconds * factor if node in CPU_STAGES else seconds for node, seconds in model.cost_s.items()}
    receive_cpu = model.receive_cpu_s()
    priced = model.compute_priced_apart
    compute = model.compute_per_sample_s * own if priced else model.compute_per_sample_s
    # the training process's CPU is its compute's and, with workers, its rebuilding of received batches
    main = model.main_cpu_per_sample_s
    main_own = max(0.0, main - receive_cpu) if model.workers > 0 else main
    main_cpu = main_own * (own if priced else factor) + (main - main_own) * factor
    return dataclasses.replace(
        model, cost_s=cost, compute_per_sample_s=compute,
        main_cpu_per_sample_s=main_cpu,
        helper_cpu_per_sample_s=model.helper_cpu_per_sample_s * factor,
        server_cpu_per_sample_s=model.server_cpu_per_sample_s * factor,
        shm_write_per_sample_s=model.shm_write_per_sample_s * factor,
        shm_read_per_sample_s=model.shm_read_per_sample_s * factor,
        receive_per_sample_s=model.receive_per_sample_s + receive_cpu * (factor - 1.0),
        receive_cpu_per_sample_s=receive_cpu * factor, recorded_load_cost=None, recorded_compute_load_cost=None,
        recorded_computing_share=None)


def load_costs(model: ThroughputModel, workers: int | None = None,
               scale: dict[str, float] | None = None) -> tuple[float, float]:
    """What a CPU second costs with ``workers`` (and ``scale``) against the recorded run, for the input work (with
    the compute beside the workers) and for the training process's own. The load is read at the rate the priced
    costs give (dearer CPU work slows the rate, which changes who waits), repeated until the two agree."""
    workers = model.workers if workers is None else workers
    if model.recorded_load_cost is None:
        return 1.0, 1.0
    recorded_compute = model.recorded_compute_load_cost or model.recorded_load_cost
    recorded_neighbour = 1.0 + COMPUTE_NEIGHBOUR_COST * (model.recorded_computing_share or 0.0)
    relative = (1.0, 1.0)
    for _ in range(LOAD_PASSES):
        priced_model = model if relative == (1.0, 1.0) else model.cpu_slowed(*relative)
        rate = priced_model._rate(workers, scale)
        busy = priced_model.busy_threads(workers, scale, rate)
        # the compute beside the workers: priced with their work, and with the training process's rebuilding
        # and mapping of their batches (``cpu_slowed``'s ``factor``), as memory-bound as the workers' collate
        neighbour = 1.0 + COMPUTE_NEIGHBOUR_COST * priced_model.computing_share(workers, rate)
        priced = (model.load_cost(busy) * neighbour / (model.recorded_load_cost * recorded_neighbour),
                  model.load_cost(busy, compute=True) / recorded_compute)
        if abs(priced[0] - relative[0]) < 1e-6 and abs(priced[1] - relative[1]) < 1e-6:
            break
        relative = priced
    return priced


def at_load(model: ThroughputModel, workers: int | None = None, scale: dict[str, float] | None = None,
            costs: tuple[float, float] | None = None) -> ThroughputModel:
    """The model with its CPU costs priced at the load ``workers`` (and ``scale``) put on the cores: what ``rate``
    uses, and what a plan reads where a configuration spends its time from. ``costs``: that load's ``load_costs``,
    where the caller has them already."""
    relative, compute = model.load_costs(workers, scale) if costs is None else costs
    if abs(relative - 1.0) < 1e-9 and abs(compute - 1.0) < 1e-9:
        return model
    return model.cpu_slowed(relative, compute)


def cpu_second_cost(model: ThroughputModel, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
    """What a CPU second of the workers' costs with ``workers`` (and ``scale``) against the recorded run."""
    return model.load_costs(workers, scale)[0]
