"""The samples/s the throughput model (``capacity.ThroughputModel``) predicts for a configuration: the bounds it is
the lowest of, the phases of cores shared in time, and the workers' wait for a core. These functions are the
model's methods of the same names (bound in ``capacity.py``).

Training runs at the lowest of three rates: the workers' ``W / (cpu_cost + blocked_cost)``; the training process's
``1 / (compute_per_sample + receive_per_sample)``, as it takes each batch serially; and the CPU budget, every
sample's CPU work (workers', the training process's, its helpers') over the usable cores. With ``num_workers=0``
nothing overlaps and the costs add up.

When the workers cannot keep up, the cores are shared in time, not pooled (``shared_cores_rate``): while the
training process computes it keeps ``main_occupancy`` cores busy and the busy workers want a core each for their CPU
work; if together they want more than there are, everyone runs at ``cores / demand`` of full speed, and a step is
the compute phase (slowed, where it is on the CPU) plus the wait for what the workers could not finish during it. A
compute with intra-op threads fares worse than its fair share: each parallel region waits for the thread that lost
its core, so it runs at about one core's speed whenever workers run beside it. A 0-worker run, where nothing ran
beside the training process, cannot show this: the pooled budget over-predicts every CPU-bound job that also
computes on the CPU.

Workers that wait on storage wake at moments nothing paces, so two or more of them with the training process collide
on cores they outnumber even when the cores are idle on average (``queued_rate``: a closed queueing system's
mean-value estimate, which Linux's slower hand-over of a woken core still exceeds; calibration: cap-queued-rate).
One worker is paced by the training process's batches, which the shared-cores phases price.

Workers whose batch times are uneven deliver less than their mean rate, because batches are handed over in order
(``in_order``): the pooled bound is scaled by the share they deliver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stallscope.analysis.in_order import in_order_share

if TYPE_CHECKING:
    from stallscope.analysis.capacity import ThroughputModel

#: Above this many cores busy while it computes, the training process runs intra-op threads in parallel regions;
#: one thread reads a little over 1 from the interpreter's and allocator's own threads (calibration:
#: cap-threaded-occupancy).
THREADED_OCCUPANCY = 1.2
#: Mean-value passes in ``queued_cpu_s`` at most, which stops once the stretch moves by under a billionth: each
#: pass shrinks the error by about the share of a core the others take, so the busiest cases want a hundred or so.
QUEUE_PASSES = 400


def cpu_rate(model: ThroughputModel, scale: dict[str, float] | None = None, workers: int | None = None) -> float:
    """The CPU budget: the usable cores' capacity over every sample's CPU work."""
    cpu, _ = model.costs(scale, workers)
    workers = model.workers if workers is None else workers
    mapping = model.shm_read_s() if workers > 0 else 0.0  # the training process's, estimated
    demand = cpu + model.main_cpu_per_sample_s + model.helper_cpu_per_sample_s + mapping
    return model.core_capacity(model.usable_cpus) / demand if demand > 0 else float("inf")


def pipeline_rate(model: ThroughputModel, workers: int | None = None, scale: dict[str, float] | None = None,
                  within_budget: bool = True) -> float:
    """The workers' rate, their CPU slowed on shared cores' hardware threads, within the CPU budget (or, with
    ``within_budget=False``, as if each worker had what it wants of the cores)."""
    workers = model.workers if workers is None else workers
    cpu, blocked = model.costs(scale, workers)
    if cpu + blocked <= 0:
        return float("inf")
    if workers <= 0:
        return 1.0 / (cpu + blocked)
    speed = model.smt_speed(workers * cpu / (cpu + blocked))  # busy workers sharing cores' hardware threads
    alone = workers / (cpu / speed + blocked)
    return min(alone, model.cpu_rate(scale, workers)) if within_budget else alone


def compute_rate(model: ThroughputModel, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
    """The training process's rate: its own step time plus receiving each batch, serially."""
    own = model.compute_per_sample_s + model.receive_s(workers, scale)
    return 1.0 / own if own > 0 else float("inf")


def rate(model: ThroughputModel, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
    """Samples/s with ``workers`` and the stage costs scaled by ``scale``, every CPU cost priced at the load that
    configuration puts on the cores against the load it was recorded under (``at_load``)."""
    workers = model.workers if workers is None else workers
    return model.at_load(workers, scale)._rate(workers, scale)


def rate_at_own_costs(model: ThroughputModel, workers: int, scale: dict[str, float] | None) -> float:
    """The rate with the model's costs as they stand (no load pricing): the lowest of the bounds."""
    if workers <= 0:
        cpu, blocked = model.costs(scale, workers)
        return 1.0 / (cpu + blocked + model.compute_per_sample_s)
    # Handed over in order, workers that wait idle for a slow batch leave their cores to the others: the loss is
    # priced on the workers' own rate and the CPU budget still bounds what they deliver.
    alone, compute = model.pipeline_rate(workers, scale, within_budget=False), model.compute_rate(workers, scale)
    handed = min(alone, compute) * in_order_share(model.batch_time_shape, workers, model.prefetch_factor, alone,
                                                  compute)
    pooled = min(handed, model.cpu_rate(scale, workers))
    shared = model.shared_cores_rate(workers, scale)
    bound = pooled if shared is None else min(pooled, shared)
    queued = model.queued_rate(workers, scale, bound)
    return bound if queued is None else min(bound, queued)


def speedup(model: ThroughputModel, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
    """The rate of a configuration over the recorded one's, both from the model: how every prediction is stated."""
    return model.rate(workers, scale) / model.rate()


def shared_cores_rate(model: ThroughputModel, workers: int, scale: dict[str, float] | None = None) -> float | None:
    """The rate when the workers and a CPU compute want more cores than there are (see the module's docstring);
    None when they do not (the pooled budget holds)."""
    cpu, blocked = model.costs(scale, workers)
    if workers <= 0 or cpu <= 0:
        return None
    cores = model.usable_cpus
    on_cpu = cpu / (cpu + blocked)  # the share of a busy worker's time that wants a core
    occupancy = max(0.0, min(model.main_occupancy, cores))
    demand = occupancy + workers * on_cpu
    if model.core_capacity(demand) >= demand:  # a core each: no sharing
        return None
    beside = model.core_capacity(demand) / demand  # everyone's speed while the training computes beside busy workers
    alone = min(1.0, model.core_capacity(workers * on_cpu) / (workers * on_cpu))  # the workers' while it waits
    # Intra-op threads that cannot all hold a CPU (time-shared, not merely on a shared core): each parallel
    # region waits for the thread that lost its CPU, so the compute runs at one core's speed at best.
    held_back = model.compute_on_cpu and occupancy > THREADED_OCCUPANCY and demand > cores
    if not model.compute_on_cpu:
        slowdown = 1.0
    elif held_back:
        slowdown = max(occupancy, 1.0 / beside)
    else:
        slowdown = 1.0 / beside
    receive = model.receive_s(workers, scale)
    handover = model.handover_wait_s(workers, scale)  # the training process waits off-core: the workers run alone
    compute = model.compute_per_sample_s * slowdown + receive - handover
    made_while_computing = compute * workers / (blocked + cpu / beside) + handover * workers / (blocked + cpu / alone)
    if made_while_computing >= 1.0:
        # The workers keep up. A single-threaded compute is slowed only while they run (the pooled
        # budget covers that); threads held back at every batch's wake-up stay slow all along.
        return 1.0 / (compute + handover) if held_back else None
    waiting = (1.0 - made_while_computing) * (blocked + cpu / alone) / workers
    return 1.0 / (compute + handover + waiting)


def queued_rate(model: ThroughputModel, workers: int, scale: dict[str, float] | None = None,
                upper: float | None = None) -> float | None:
    """The workers' rate when their CPU bursts arrive at random and wait for a core (see the module's docstring),
    found by bisection below ``upper`` (the other bounds' rate); None where the workers never wait on storage
    (always runnable: the budget and the shared-cores phases price them) or fit a core each beside the training."""
    cpu, blocked = model.costs(scale, workers)
    if workers <= 1 or cpu <= 0 or blocked <= 0 or upper is None or upper <= 0 or upper == float("inf") \
            or model.blocked_holds_core_waits:
        return None
    cores = model.usable_cpus
    occupancy = max(0.0, min(model.main_occupancy, cores))
    if cores <= 0 or workers + occupancy <= cores:
        return None

    def sustained(rate: float) -> float:
        return workers / (blocked + model.queued_cpu_s(workers, cpu, rate))

    if sustained(upper) >= upper:
        return upper
    low, high = 0.0, upper
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if sustained(mid) >= mid else (low, mid)
    return low


def queued_cpu_s(model: ThroughputModel, workers: int, cpu: float, rate: float) -> float:
    """A worker's CPU work per sample stretched by the threads it finds wanting a core when it wakes, by mean-value
    iteration: the arrival sees the others, not itself (one worker beside a training process on two cores never
    waits). Hardware threads are priced by the workers' rate and the budget; counted here too, SMT advice vanished."""
    main = rate * model.main_cpu_per_sample_s
    helper = rate * model.helper_cpu_per_sample_s
    per_worker = rate / workers
    main_threads = max(model.main_occupancy, 1.0)

    def slowed(n: float) -> float:  # how much longer a CPU second takes among ``n`` threads wanting the CPUs
        return max(1.0, n / model.usable_cpus) if model.usable_cpus > 0 else 1.0

    stretched = cpu
    for _ in range(QUEUE_PASSES):
        on_core = min(1.0, per_worker * stretched)  # one worker's share of time on a core or waiting for one
        main_found = min(main * slowed(main_threads + workers * on_core), main_threads)
        found = (workers - 1) * on_core + main_found + helper
        previous, stretched = stretched, cpu * slowed(1.0 + found)
        if abs(stretched - previous) <= 1e-9 * stretched:
            break
    return stretched


def stage_capacity(model: ThroughputModel) -> dict[str, float | None]:
    """Samples/s each stage could sustain alone with the workers and cores it has now."""
    workers = max(1, model.workers)
    cores = model.core_capacity(min(workers, model.usable_cpus)) if model.workers > 0 else 1.0
    out: dict[str, float | None] = {}
    for stage in ("decode", "transform", "loader", "storage"):
        cost = model.cost_s.get(stage, 0.0) + (model.cost_s.get("storage_cpu", 0.0) if stage == "storage" else 0.0)
        parallel = workers if stage == "storage" else cores
        out[stage] = parallel / cost if cost > 0 else None
    out["compute"] = model.compute_rate() if model.compute_per_sample_s > 0 else None
    return out
