"""Project a recorded run to another machine: ``stallscope plan``.

A run measures what each sample costs at each stage (CPU seconds for decode, transform and collate,
blocked seconds for storage) and what the training process needs per sample. Those per-sample costs
travel; the cores, the GPUs and the step time do not. The plan keeps the costs, puts them on the
target machine through the same throughput model the run's own predictions use (``capacity.py``), and
asks: how many workers does each GPU's training process need to stay fed, which stage gives out
first when the cores cannot keep up, and which fix (packed data, reduced-size decode, uint8 to the
device) buys what then.

Each GPU is one training process (DDP, one rank per GPU) with its own DataLoader workers, and the
cores are shared evenly among them. Everything the projection cannot know is written into the plan's
``assumptions``, so a reader sees what the figures rest on.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.cpu_load import (
    ALL_CORES_BUSY_COST,
    COMPUTE_NEIGHBOUR_COST,
    COMPUTE_TIME_SHARING_COST,
    SMT_YIELD,
    TIME_SHARING_COST,
)
from stallscope.analysis.findings import StepStats
from stallscope.analysis.fixes import planned
from stallscope.analysis.gpu_timing import GpuTiming
from stallscope.analysis.plan_store import StoreNeed, StoreProbeLike, store_need
from stallscope.analysis.sample_costs import (
    CPU_STAGES,
    RECEIVED_BATCH_READS,
    oversubscription_cost,
    threads_outnumber_cpus,
)
from stallscope.analysis.throughput_rates import THREADED_OCCUPANCY
from stallscope.settings import MAX_WORKERS

if TYPE_CHECKING:
    from stallscope.analysis.findings import Analysis
    from stallscope.session import Session

#: A training process counts as fed when it waits for data at most this share of its step time.
FED_WAIT = 0.05
#: A fix is listed only for a stage that costs at least this share of a sample's input time.
MIN_STAGE_SHARE = 0.10
MAX_THREADS_PER_CORE = 8  # the most any CPU has had (IBM POWER); x86 has 1 or 2
#: Bounds past any real machine or job: beyond them a figure is a typo, and the arithmetic loses its meaning
#: (``--step-ms 1e308`` planned 0.0 samples/s and wrote NaN, which JSON parsers refuse).
MAX_CORES = 65536
MAX_GPUS = 4096
MAX_NODES = 65536
MAX_STEP_S = 86400.0  # a day per step
MAX_SAMPLES_PER_S = 1e9


class PlanError(ValueError):
    """The target is impossible (or the run holds nothing to project: ``NothingToPlan``)."""


class NothingToPlan(PlanError):
    """The run has no steady training steps fed by a DataLoader, or no sample counts to project."""


@dataclass(frozen=True)
class Target:
    """The machine to project to. ``step_s`` is one training step of one process; ``samples_per_s`` is the
    whole job's (all GPUs together); with neither, the recorded compute time per sample is kept. ``ranks``:
    training processes on the machine when not one per GPU (a CPU job under torchrun)."""

    cores: float
    gpus: int = 0
    step_s: float | None = None
    samples_per_s: float | None = None
    workers: int | None = None
    ranks: int | None = None
    threads_per_core: float | None = None  # hardware threads per core (SMT); None: as on the recorded machine
    #: the target's device this many times as fast as the recorded one at the device's share of compute
    #: (``device_share``: forward, backward and optimizer on a CPU run; the GPU's busy time on a GPU run); the
    #: step's own code on the host stays as recorded
    device_speedup: float | None = None
    device_share: float | None = None

    def __post_init__(self) -> None:
        if not (self.cores > 0 and math.isfinite(self.cores)):
            raise PlanError("--cores must be a positive number")
        if self.cores > MAX_CORES:
            raise PlanError(f"--cores must be at most {MAX_CORES}")
        if self.gpus < 0:
            raise PlanError("--gpus cannot be negative")
        if self.gpus > MAX_GPUS:
            raise PlanError(f"--gpus must be at most {MAX_GPUS} (the GPUs of one machine)")
        if self.step_s is not None and self.samples_per_s is not None:
            raise PlanError("give --step-ms or --samples-per-s, not both")
        if self.device_speedup is not None:
            if self.step_s is not None or self.samples_per_s is not None:
                raise PlanError("give --device-speedup, or the target's own --step-ms or --samples-per-s, not both")
            if not (self.device_speedup > 0 and math.isfinite(self.device_speedup)):
                raise PlanError("--device-speedup must be a positive number")
            if self.device_share is None:
                raise PlanError("--device-speedup needs the step split (forward, backward, optimizer), which this "
                                "run's recording does not have: record it again with this version")
        for name, value, most in (("--step-ms", self.step_s, MAX_STEP_S), ("--samples-per-s", self.samples_per_s,
                                                                             MAX_SAMPLES_PER_S)):
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise PlanError(f"{name} must be a positive number")
            if value is not None and value > most:
                shown = f"{most * 1000:.0f} (a day per step)" if name == "--step-ms" else f"{most:.0e}"
                raise PlanError(f"{name} must be at most {shown}")
        if self.workers is not None and not 0 <= self.workers <= MAX_WORKERS:
            raise PlanError(f"--workers must be between 0 and {MAX_WORKERS}")
        if self.ranks is not None and self.ranks < 1:
            raise PlanError("a job has at least one training process")
        if self.threads_per_core is not None and not 1 <= self.threads_per_core <= MAX_THREADS_PER_CORE:
            raise PlanError(f"--threads-per-core must be between 1 and {MAX_THREADS_PER_CORE}")
        if self.cores < self.processes:
            raise PlanError(f"{self.processes} training processes (one per GPU) on {self.cores:.4g} cores: each "
                            "needs at least a core of its own; give --cores at least the number of GPUs")

    @property
    def processes(self) -> int:
        return self.ranks if self.ranks is not None else max(1, self.gpus)

    @property
    def cores_per_process(self) -> float:
        return self.cores / self.processes


@dataclass(frozen=True)
class WorkerRow:
    """One worker count per training process on the target."""

    workers: int
    samples_per_s: float  # one training process
    total_samples_per_s: float  # all of them
    data_wait_fraction: float
    cores_wanted: float  # per process: workers' CPU at this rate plus the training process's own
    cpu_second_cost: float = 1.0  # a CPU second at this row's load against the recorded run's (estimated)
    compute_threads: int | None = None  # the compute's intra-op threads cut to this, where the row needs it
    compute_cpu_second_cost: float | None = None  # the same for a CPU compute's own work; None: on a GPU

    def to_dict(self) -> dict[str, float | int | None]:
        return {"workers": self.workers, "samples_per_s": round(self.samples_per_s, 2),
                "total_samples_per_s": round(self.total_samples_per_s, 2),
                "data_wait_fraction": round(self.data_wait_fraction, 4), "cores_wanted": round(self.cores_wanted, 2),
                "cpu_second_cost": round(self.cpu_second_cost, 3), "compute_threads": self.compute_threads,
                "compute_cpu_second_cost": (round(self.compute_cpu_second_cost, 3)
                                            if self.compute_cpu_second_cost is not None else None)}


@dataclass(frozen=True)
class PlanFix:
    """A change priced on the target, at its own best worker count."""

    id: str
    stage: str
    scale: dict[str, float]
    workers: int
    samples_per_s: float  # one training process
    gain: float  # over the best worker count without the change
    data_wait_fraction: float
    workers_needed: int | None  # to be fed with the change

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "stage": self.stage, "scale": self.scale, "workers": self.workers,
                "samples_per_s": round(self.samples_per_s, 2), "gain": round(self.gain, 2),
                "data_wait_fraction": round(self.data_wait_fraction, 4), "workers_needed": self.workers_needed}


@dataclass(frozen=True)
class Nodes:
    """The job over several nodes: its gradients' ring all-reduce priced on the link between them. In a ring over
    all ``ranks`` each node's link carries 2(n-1)/n of the gradients' bytes a step; ``sync_s`` is that transfer with
    none of it hidden (an upper bound), ``overlap_s`` the recorded backward per step that DDP overlaps its buckets
    with (the wait lies between ``sync_s - overlap_s`` and ``sync_s``)."""

    count: int
    link_gbps: float
    gradient_bytes: int
    ranks: int
    sync_s: float
    overlap_s: float
    recorded_sync_s: float

    def to_dict(self, per_node_samples_per_s: float) -> dict[str, object]:
        return {"nodes": self.count, "link_gbps": self.link_gbps, "ranks": self.ranks,
                "gradient_mb": round(self.gradient_bytes / 2**20, 3), "sync_ms_per_step": round(1e3 * self.sync_s, 3),
                "overlap_ms_per_step": round(1e3 * self.overlap_s, 3),
                "recorded_sync_ms_per_step": round(1e3 * self.recorded_sync_s, 3),
                "job_samples_per_s": round(per_node_samples_per_s * self.count, 2)}


def ring_sync_s(gradient_bytes: float, ranks: int, link_gbps: float) -> float:
    """Seconds a step for a ring all-reduce of ``gradient_bytes`` over ``ranks`` on links of ``link_gbps``."""
    return 2 * (ranks - 1) / ranks * gradient_bytes / (link_gbps * 1e9 / 8) if ranks > 1 else 0.0


@dataclass(frozen=True)
class Plan:
    target: Target
    recorded: dict[str, object]
    compute_samples_per_s: float  # what one training process's compute could take on the target
    rows: list[WorkerRow]
    workers_needed: int | None  # per process, to wait at most FED_WAIT; None when no worker count gets there
    best_workers: int  # the smallest worker count within 2% of the best rate
    limit: str  # "fed", "cores" (every usable core is busy), "workers" (more would still help), "no-worker-helps"
    saturates_first: str  # the input stage that costs the most per sample: it gives out first
    fixes: list[PlanFix] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    # what makes the recorded run a weak basis (too few steps, a crash, a stop): said first; also in the assumptions
    cautions: list[str] = field(default_factory=list)
    nodes: Nodes | None = None  # the job over several nodes (--nodes): the plan's rows are then per node
    store: StoreNeed | None = None  # the object store's requests in flight (--store-probe), where the run made any

    def row(self, workers: int) -> WorkerRow | None:
        return next((r for r in self.rows if r.workers == workers), None)


def _sharing_basis(model: ThroughputModel) -> str:
    """Why the workers' time-sharing cost is what it is: the page faults their work took, where counted."""
    if model.fresh_pages_per_cpu_s is None:
        return ""
    fresh = model.worker_sharing_cost() >= TIME_SHARING_COST
    return (f", as the workers' work takes {model.fresh_pages_per_cpu_s:,.0f} page faults per CPU second ("
            + ("fresh memory: the full cost)" if fresh else
               f"its memory mostly stays put; work on fresh memory pays up to {100 * TIME_SHARING_COST:.0f}%)"))


def _ceiling(model: ThroughputModel, cores: float) -> int:
    """Worker counts worth tabulating: past the cores only where blocked I/O dominates (it overlaps)."""
    cpu = sum(model.cost_s.get(n, 0.0) for n in CPU_STAGES)
    io_heavy = model.cost_s.get("storage", 0.0) > cpu
    return int(min(64, max(4 * cores, 8) if io_heavy else math.ceil(cores) + 2))


def split_threads(model: ThroughputModel, workers: int, scale: dict[str, float] | None = None) -> int | None:
    """The intra-op threads a CPU compute should keep beside ``workers`` busy workers, where its threads and the
    workers would want more cores than there are: as many as the cores the workers leave, at least one. A compute
    whose threads lose their cores to workers waits at every parallel region for the one that lost it, far past the
    model's one-core bound, so a row with workers is planned with the threads cut (``--set torch_threads``), also
    where the target has fewer cores than the recorded threads (calibration: plan-split-threads). None where nothing
    needs cutting: a compute on the GPU, one thread, threads not recorded, cores enough for all."""
    if workers <= 0 or not model.compute_on_cpu or not model.compute_threads:
        return None
    if not model.compute_priced:  # the step time was given for the target: no thread count changes it
        return None
    outnumbered = model.compute_threads > model.usable_cpus + 0.5  # they take turns on the cores even alone
    if model.main_occupancy <= THREADED_OCCUPANCY and not outnumbered:
        return None
    cpu, blocked = model.costs(scale, workers)
    wanted = workers * (cpu / (cpu + blocked) if cpu + blocked > 0 else 0.0)  # the cores the workers keep busy
    if model.core_capacity(model.main_occupancy + wanted) >= model.main_occupancy + wanted:
        return None  # a core each
    threads = max(1, math.floor(model.usable_cpus - wanted + 1e-9))
    return threads if threads < (model.compute_threads if outnumbered else model.main_occupancy) else None


def _rows(model: ThroughputModel, processes: int, ceiling: int,
          scale: dict[str, float] | None = None, only: int | None = None) -> list[WorkerRow]:
    rows = []
    recorded = model
    for workers in ([only] if only is not None else range(ceiling + 1)):
        threads = split_threads(recorded, workers, scale)
        model = recorded.with_compute_threads(threads) if threads else recorded
        costs = model.load_costs(workers, scale)
        priced = model.at_load(workers, scale, costs)  # the costs as that many workers' load prices them
        rate = priced.rate(workers=workers, scale=scale)
        cpu, _ = priced.costs(scale, workers)
        own = priced.compute_per_sample_s + priced.receive_s(workers, scale)
        wait = max(0.0, 1.0 - rate * own)
        if workers == 0:
            wanted = model.main_occupancy  # one process does everything, one step after another
        else:
            wanted = min(rate * (cpu + priced.main_cpu_per_sample_s + priced.helper_cpu_per_sample_s),
                         workers + model.main_occupancy)
        rows.append(WorkerRow(workers, rate, rate * processes, wait, wanted, costs[0], threads,
                              costs[1] if model.compute_priced_apart else None))
    return rows


def _fed(rows: list[WorkerRow]) -> int | None:
    """The fewest workers that wait at most FED_WAIT and run within 2% of the best rate (taking batches from
    workers costs the training process too: a row can wait for nothing and still be slower than the best); 0 where
    loading in the training process itself takes no more than that of its step."""
    top = max(r.samples_per_s for r in rows)
    return next((r.workers for r in rows if r.data_wait_fraction <= FED_WAIT and r.samples_per_s >= 0.98 * top),
                None)


def _best(rows: list[WorkerRow]) -> WorkerRow:
    top = max(r.samples_per_s for r in rows)
    return min((r for r in rows if r.samples_per_s >= 0.98 * top), key=lambda r: r.workers)


def _ms(seconds: float) -> str:
    """A per-sample time readable at any size: microseconds below a tenth of a millisecond."""
    return f"{1e6 * seconds:.0f} us" if seconds < 1e-4 else f"{1000 * seconds:.3f} ms"


def target_model(model: ThroughputModel, target: Target, samples_per_step: float,
                 sync_per_sample_s: float = 0.0) -> tuple[ThroughputModel, list[str]]:
    """The recorded model moved to the target machine, with what that move assumes. ``sync_per_sample_s``:
    the recorded wait for other ranks per sample, kept in the compute when the target's step time is not given."""
    notes: list[str] = []
    cores = target.cores_per_process
    if not model.compute_on_cpu and target.gpus == 0 and target.step_s is None and target.samples_per_s is None:
        raise PlanError("the run computed on a GPU: for a machine without one give --step-ms or --samples-per-s "
                        "(the step time on its CPU)")
    if target.step_s is not None:
        compute = target.step_s / samples_per_step
        notes.append(f"compute: {1000 * target.step_s:.1f} ms per step (given) of {samples_per_step:.4g} samples (the "
                     f"recorded steps' mean), {_ms(compute)} per sample")
    elif target.samples_per_s is not None:
        compute = target.processes / target.samples_per_s
        notes.append(f"compute: {target.samples_per_s:g} samples/s for the whole job (given), "
                     f"{_ms(compute)} per sample in each training process")
    elif target.device_speedup is not None and target.device_share is not None:
        share, faster = min(1.0, max(0.0, target.device_share)), target.device_speedup
        compute = model.compute_per_sample_s * ((1 - share) + share / faster) + sync_per_sample_s
        device = ("forward, backward and optimizer" if model.compute_on_cpu else "the GPU's busy time")
        notes.append(f"compute: {_ms(compute)} per sample: {device} ({100 * share:.0f}% of the recorded compute) "
                     f"{faster:g}x as fast, the rest of it (the step's own code on the host, "
                     f"{100 * (1 - share):.0f}%) as recorded")
    else:
        compute = model.compute_per_sample_s + sync_per_sample_s
        where = "on the CPU" if model.compute_on_cpu else "on the GPU"
        synced = f", {_ms(sync_per_sample_s)} of it waiting for other ranks" if sync_per_sample_s > 0 else ""
        notes.append(f"compute: {_ms(compute)} per sample, as recorded ({where}{synced}); give --step-ms or "
                     "--samples-per-s for the target's step time")
    if compute <= 0:
        raise PlanError("the recorded run has no compute time per sample: give --step-ms or --samples-per-s")
    threaded = None
    if target.gpus > 0:
        occupancy = 1.0
        # rebuilding the batches it receives is CPU; waiting for a worker to hand one over is not, and mapping
        # it again is counted by the model's CPU budget already
        main_cpu = compute + model.receive_cpu_s()
        notes.append(f"{target.gpus} GPU(s), {target.processes} training process(es), each keeping one core busy "
                     f"while its GPU computes (Python, kernel launches, waiting on the GPU); {cores:.3g} core(s) per "
                     "process")
    else:
        occupancy = min(model.main_occupancy, cores)
        ratio = compute / model.compute_per_sample_s if model.compute_per_sample_s > 0 else 1.0
        main_cpu = model.main_cpu_per_sample_s * ratio
        threaded = _threads_on_target(model, cores, compute, main_cpu,
                                      given=target.step_s is not None or target.samples_per_s is not None)
        if threaded is not None:
            occupancy, compute, main_cpu, said = threaded
            notes.append(said)
        else:
            notes.append(f"no GPU: {target.processes} training process(es) computing on the CPU, each keeping "
                         f"{occupancy:.2f} core(s) busy while it computes, as recorded; {cores:.3g} core(s) for each "
                         "and its workers")
    physical, smt_note = _target_cores(model, target, cores)
    notes.append(smt_note)
    given = target.step_s is not None or target.samples_per_s is not None  # the target's own figure: not priced
    # still more threads than CPUs there, priced so (``_threads_on_target``), or the same CPUs as recorded: a cut to the
    # CPUs is credited with their waits; elsewhere the recorded time is not taken apart
    oversubscribed = (model.compute_oversubscribed and target.gpus == 0 and not given
                      and threads_outnumber_cpus(model.compute_threads, cores)
                      and (threaded is not None or abs(cores - model.usable_cpus) < 0.5))
    moved = dataclasses.replace(model, usable_cpus=cores, compute_per_sample_s=compute, main_cpu_per_sample_s=main_cpu,
                                main_occupancy=occupancy, compute_on_cpu=target.gpus == 0, physical_cores=physical,
                                compute_priced=model.compute_priced and not given,
                                compute_oversubscribed=oversubscribed)
    cpu = sum(model.cost_s.get(n, 0.0) for n in CPU_STAGES)
    notes.append(f"input costs per sample as recorded: {_ms(cpu)} of CPU (decode, transform, collate) and "
                 f"{_ms(model.cost_s.get('storage', 0.0))} blocked on storage, on cores as fast as the recorded "
                 "machine's" + (", then priced at each worker count's load (below)"
                                if model.recorded_load_cost is not None else ""))
    if model.cost_s.get("storage", 0.0) > 0:
        notes.append("blocked storage time overlaps across workers without limit: the target's storage must serve "
                     "the total samples/s below; where two or more workers and the training process outnumber the "
                     "cores, a worker back from storage waits for a core in proportion to the threads it finds there "
                     "(a mean-value estimate, not measured)")
    if model.workers > 0 and (receive := moved.receive_s(model.workers)) > 0:
        own = compute + receive
        notes.append(f"with workers the training process also takes each batch from them: {_ms(receive)} per sample "
                     f"as recorded with {model.workers} (rebuilding it, waiting for the hand-over, mapping it), after "
                     f"its {_ms(compute)} of compute: about {1 / own:.1f} samples/s per training process with no wait "
                     "for data, before the load's pricing (the wait for a busy worker's hand-over shrinks as more "
                     "workers share the batches)")
    if model.worker_only_basis:
        notes.append(f"recorded with 0 workers: passing batches through shared memory is estimated "
                     f"({_ms(model.shm_write_per_sample_s)} per sample in a worker, "
                     f"{_ms(moved.shm_read_s())} in the training process"
                     + (f", whose CPU training step reads it {RECEIVED_BATCH_READS:g} times over"
                        if moved.compute_on_cpu else "") + "; per-byte cost "
                     f"{model.worker_only_basis}); pickling and descriptor passing are not")
    elif model.workers == 0:
        notes.append("recorded with 0 workers: what only workers cost (collate into shared memory, passing batches "
                     "to the training process) was not measured and is not in these figures")
    if model.recorded_load_cost is not None:
        notes.append(f"each CPU second is priced at the load of each worker count against the recorded run's "
                     f"(cpu_second_cost in each row): up to {100 * ALL_CORES_BUSY_COST:.0f}% more with every core "
                     f"busy than with one, up to {100 * moved.worker_sharing_cost():.0f}% more again once threads "
                     f"outnumber the cores{_sharing_basis(moved)}"
                     + (f" ({100 * COMPUTE_TIME_SHARING_COST:.0f}% for the compute's own work, whose "
                                    "working set the others evict: compute_cpu_second_cost; and the workers' up to "
                                    f"{100 * COMPUTE_NEIGHBOUR_COST:.0f}% more for the share of the time it computes "
                                    "on another core beside them)"
                                    if moved.compute_priced_apart else "")
                     + "; less than recorded where the target's cores are less busy "
                     "than the recorded run's (estimated, not measured: a run shows only its own load"
                     + ("; the given step time is taken as it is)" if given else ")"))
    notes.append("workers are persistent: their start-up is not counted")
    return moved, notes


def _threads_on_target(model: ThroughputModel, cores: float, compute: float, main_cpu: float,
                       given: bool) -> tuple[float, float, float, str] | None:
    """Where the training process's intra-op threads meet the target's cores differently than the recorded ones:
    its occupancy, compute and CPU per sample there, and the assumption in words.

    OpenMP's threads (libgomp, which torch's wheels use) wait for the next parallel region by spinning while the
    process has no more threads than the CPUs it may use, and hardly at all once it has more. So:

    - recorded with fewer CPUs than threads (a 1-core container), the compute kept only those CPUs busy, and each
      parallel region waited for the threads that had none: its time is its one-thread time and those waits
      (``ThroughputModel.one_thread_compute_s``); on a target with more, its threads take up to one CPU each while
      it computes, in the one-thread time over them (the parallel speed-up taken as ideal), and workers beside them
      hold them back (``ThroughputModel.shared_cores_rate``);
    - recorded with at least as many CPUs as threads, the threads spun: the training process's CPU counts them
      spinning while it computed and while it loaded batches itself. On a target with fewer CPUs than threads
      they do not spin, so its CPU is only the compute's work, which is at most the recorded compute time on
      each CPU it kept busy.

    None where neither holds (one thread, threads not recorded, a compute on the GPU). ``compute`` and ``main_cpu``:
    the target's so far; ``given``: the compute time is the target's own figure, which no thread count changes."""
    threads = model.compute_threads
    if not model.compute_on_cpu or not threads or threads <= 1:
        return None
    recorded_cpus = model.usable_cpus
    if recorded_cpus < threads - 0.5 and cores > recorded_cpus + 0.5 and not given:
        spread = min(float(threads), cores)
        held = max(model.main_occupancy, 1.0)
        if model.compute_oversubscribed:  # its recorded time held its threads' waits for a CPU
            one = model.one_thread_compute_s() * (compute / model.compute_per_sample_s)
            spread_compute = one / spread if threads <= cores else one * oversubscription_cost(threads, cores)
        else:
            spread_compute = compute * held / spread
        return (spread, spread_compute, main_cpu,
                f"no GPU: the training process computes on {threads} intra-op threads, recorded on "
                f"{recorded_cpus:.3g} CPU(s), where each parallel region waited for the threads that had no CPU: on "
                f"{cores:.3g} they keep up to {spread:.3g} core(s) busy while it computes, at best "
                f"{compute / spread_compute:.2f}x as fast ("
                + ("without those waits, " if model.compute_oversubscribed else "")
                + "at an ideal parallel speed-up: estimated, not measured); workers "
                "beside them hold it back to one core's speed at best, and threads that spin waiting for work take "
                "cores from the workers (not priced): with workers, fewer threads (torch.set_num_threads) leave them "
                "the cores")
    if recorded_cpus >= threads - 0.5 and cores < threads - 0.5:
        work = min(main_cpu, compute * model.main_occupancy + model.receive_cpu_s())
        return (min(model.main_occupancy, cores), compute, work,
                f"no GPU: the training process computes on {threads} intra-op threads, more than the {cores:.3g} "
                f"core(s) it has there: they do not spin waiting for work as they did on the recorded "
                f"{recorded_cpus:.3g}, so its CPU is its compute's ({_ms(work)} per sample, recorded {_ms(main_cpu)})")
    return None


def _target_cores(model: ThroughputModel, target: Target, cpus: float) -> tuple[float | None, str]:
    """The physical cores behind the target's ``cpus`` per process (None: a core each), and the assumption."""
    threads = target.threads_per_core if target.threads_per_core is not None else model.threads_per_core
    source = "given" if target.threads_per_core is not None else "as recorded"
    if threads <= 1.0:
        hint = "; --threads-per-core 2 for a target with hyper-threading" if target.threads_per_core is None else ""
        return None, f"each CPU a core of its own ({source}{hint})"
    return cpus / threads, (f"{cpus:.3g} CPU(s) per process are {cpus / threads:.3g} core(s) with {threads:.3g} "
                            f"hardware threads each ({source}): a thread on a core whose other thread is busy adds "
                            f"{100 * SMT_YIELD:.0f}% of a core (a typical figure for hyper-threading, not measured)")


def _fixes(model: ThroughputModel, target: Target, ceiling: int, best: WorkerRow,
           normalize_fraction: float | None) -> list[PlanFix]:
    total = sum(model.cost_s.values()) or 1.0
    fixes = []
    for fix in planned():  # the run's own recommendations price them the same way (``fixes.py``)
        if model.cost_s.get(fix.stage, 0.0) / total < MIN_STAGE_SHARE:
            continue
        if fix.id == "uint8-device-normalize" and (target.gpus == 0 or not normalize_fraction
                                                   or normalize_fraction <= 0.1):
            continue  # normalization moves to the GPU: only where there is one and normalization costs
        scale = fix.scaled(normalize_fraction or 0.0)
        rows = _rows(model, target.processes, ceiling, scale)
        chosen = _best(rows)
        fixes.append(PlanFix(fix.id, fix.stage, scale, chosen.workers, chosen.samples_per_s,
                             chosen.samples_per_s / best.samples_per_s, chosen.data_wait_fraction, _fed(rows)))
    return sorted(fixes, key=lambda f: -f.gain)


def project(model: ThroughputModel, target: Target, samples_per_step: float,
            normalize_fraction: float | None = None, sync_per_sample_s: float = 0.0) -> Plan:
    """The plan for ``target`` from a run's throughput model (``analysis.capacity.model``).
    ``samples_per_step`` (per optimizer step) turns a step time into a time per sample; ``normalize_fraction``
    is the share of the transform stage spent normalizing (prices moving it to the GPU)."""
    if samples_per_step <= 0:
        raise PlanError("the recorded run has no samples per step")
    moved, notes = target_model(model, target, samples_per_step, sync_per_sample_s)
    ceiling = _ceiling(moved, target.cores_per_process)
    rows = _rows(moved, target.processes, ceiling)
    if target.workers is not None and target.workers > ceiling:  # the asked count, beside the table
        rows.append(_rows(moved, target.processes, target.workers, only=target.workers)[0])
    needed = _fed(rows)
    best = _best(rows)
    if needed is not None:
        limit = "fed"
    elif best.workers == 0:
        limit = "no-worker-helps"
    elif best.cores_wanted >= 0.95 * moved.core_capacity(target.cores_per_process):  # cores' worth, SMT counted
        limit = "cores"
    else:
        limit = "workers"
    # Where the cores give out, the CPU stage that wants the most of them; elsewhere blocked storage counts too.
    stages = CPU_STAGES if limit in ("cores", "no-worker-helps") else (*CPU_STAGES, "storage")
    first = max(stages, key=lambda n: moved.cost_s.get(n, 0.0))
    first = "storage" if first == "storage_cpu" else first  # a node id: an object-store client's CPU is storage's
    fixes = [] if needed is not None else _fixes(moved, target, ceiling, best, normalize_fraction)
    recorded: dict[str, object] = {"cpus_free": model.usable_cpus, "workers": model.workers,
                                   "samples_per_s": model.measured_samples_per_s, "samples_per_step": samples_per_step,
                                   "compute_on_cpu": model.compute_on_cpu, "compute_threads": model.compute_threads,
                                   "threads_per_core": round(model.threads_per_core, 3)}
    at_best = moved.with_compute_threads(best.compute_threads) if best.compute_threads else moved
    compute = at_best.at_load(best.workers).compute_per_sample_s  # priced at the best row's load and threads
    return Plan(target, recorded, 1.0 / compute, rows, needed, best.workers, limit, first, fixes, notes)


def _best_total(plan: Plan) -> float:
    row = plan.row(plan.best_workers)
    return row.total_samples_per_s if row else 0.0


def plan_dict(plan: Plan, run_id: str | None, schema: str) -> dict[str, object]:
    """The ``stallscope.plan/1`` document."""
    t = plan.target
    chosen = plan.row(t.workers) if t.workers is not None else None
    return {
        "schema": schema,
        "run_id": run_id,
        "target": {"cores": t.cores, "gpus": t.gpus, "step_ms": None if t.step_s is None else round(1000 * t.step_s, 3),
                   "samples_per_s": t.samples_per_s, "workers": t.workers,
                   "cores_per_process": round(t.cores_per_process, 3), "processes": t.processes,
                   "threads_per_core": t.threads_per_core if t.threads_per_core is not None
                   else plan.recorded["threads_per_core"]},
        "recorded": plan.recorded,
        "compute_samples_per_s": round(plan.compute_samples_per_s, 2),
        "workers_needed_per_process": plan.workers_needed,
        "best_workers": plan.best_workers,
        "limit": plan.limit,
        "saturates_first": plan.saturates_first,
        "at_workers": chosen.to_dict() if chosen else None,
        "rows": [r.to_dict() for r in plan.rows],
        "fixes": [f.to_dict() for f in plan.fixes],
        "assumptions": plan.assumptions,
        "cautions": plan.cautions,
        "nodes": plan.nodes.to_dict(_best_total(plan)) if plan.nodes else None,
        "store": plan.store.to_dict() if plan.store else None,
    }


def plan_run(session: Session, *, cores: float | None = None, gpus: int | None = None, step_ms: float | None = None,
             samples_per_s: float | None = None, workers: int | None = None,
             analysis: Analysis | None = None, threads_per_core: float | None = None,
             device_speedup: float | None = None, nodes: int | None = None,
             link_gbps: float | None = None, store_probe: StoreProbeLike | None = None) -> Plan:
    """``stallscope plan``'s library twin: a recorded session projected to a machine with ``cores`` CPU cores and
    ``gpus`` GPUs (defaults: the recorded machine's usable CPUs, and its GPU count, one per rank), with the
    target's step time (``step_ms`` per step of one process) or job rate (``samples_per_s``) where known.
    ``nodes``: the job over that many such machines, its gradients' all-reduce priced on links of ``link_gbps``.
    ``store_probe``: ``doctor s3://...``'s measurement of the store the run read, for the requests in flight the
    planned rate needs. Raises PlanError when the run holds nothing to project or the target is impossible."""
    from stallscope.analysis.job import analyze, usable_cpus
    from stallscope.analysis.recommend import normalize_fraction
    from stallscope.analysis.steps import FEW_STEADY_STEPS

    analysis = analysis or analyze(session)
    model = analysis.capacity.model if analysis.capacity else None
    stats = analysis.steps
    if model is None or not stats.steady:
        raise NothingToPlan("this run has no steady training steps fed by a DataLoader to project from")
    if not stats.samples:
        raise NothingToPlan("the batches' sample counts are unknown (a batch type stallscope cannot size), so no time "
                        "per sample can be projected")
    host = next((r.host for r in analysis.ranks if r.pid == session.main_pid), None)
    ranks_here = sum(1 for r in analysis.ranks if r.host == host) if analysis.ranks else 0
    on_gpu = not model.compute_on_cpu
    if gpus is None:
        gpus = (ranks_here or 1) if on_gpu else 0
    target = Target(cores=float(cores if cores is not None else usable_cpus(session)), gpus=gpus,  # the host's
                    step_s=None if step_ms is None else step_ms / 1000, samples_per_s=samples_per_s,
                    workers=workers, ranks=ranks_here if ranks_here > 1 and gpus == 0 else None,
                    threads_per_core=threads_per_core, device_speedup=device_speedup,
                    device_share=device_share(stats, analysis.gpu_timing) if device_speedup is not None else None)
    train = next((ld for ld in analysis.loaders if ld.role == "train"), None)
    samples_per_step = stats.samples / len(stats.steady)
    sync_per_sample, spread = stats.sync_s / stats.samples, None
    if nodes is not None:
        spread = _over_nodes(session, stats, target, nodes, link_gbps)
        sync_per_sample = spread.sync_s / samples_per_step
        if target.step_s is not None:
            target = dataclasses.replace(target, step_s=target.step_s + spread.sync_s)
    plan = project(model, target, samples_per_step, normalize_fraction(train.pipeline if train else None),
                   sync_per_sample)
    if spread is not None:
        plan = dataclasses.replace(plan, nodes=spread, assumptions=[*plan.assumptions, _nodes_words(spread)])
    # the model's rate leaves out the workers' start-ups inside the steady steps; report's counts them
    recorded = {**plan.recorded, "samples_per_s_with_startups": analysis.samples_per_s,
                "steady_steps": len(stats.steady)}
    cautions = []
    if len(stats.steady) < FEW_STEADY_STEPS:
        cautions.append(f"the recorded run has {len(stats.steady)} steady step(s): too few for these figures to act "
                        "on; record a run of more steps (more data or epochs, or a larger --steps where one was given)")
    failure = analysis.failure
    if failure is not None:
        where = "a DataLoader worker" if failure.where == "worker" else "the script"
        how = f"exit code {failure.exit_code}" if failure.type == "exit" else f"{failure.type} in {where}"
        cautions.append(f"the recorded run did not end as the training would ({how}): the figures are of its "
                        f"{len(stats.steady)} steady step(s) before that")
    assumptions = [*cautions, *plan.assumptions]
    need = None
    if store_probe is not None:
        best = plan.row(plan.best_workers)
        requests = train.pipeline.requests if train and train.pipeline else None
        need = store_need(store_probe, requests, best.total_samples_per_s if best else 0.0,
                          max(1, plan.best_workers) * plan.target.processes, model.workers)
        if need is None:
            assumptions.append(f"the recorded run made no HTTP requests: the store probe ({store_probe.url}) is "
                               "not used")
    return dataclasses.replace(plan, recorded=recorded, assumptions=assumptions, cautions=cautions, store=need)


def _over_nodes(session: Session, stats: StepStats, target: Target, nodes: int, link_gbps: float | None) -> Nodes:
    """The recorded job spread over ``nodes`` machines like the target: its DDP gradients' ring all-reduce priced."""
    if not 1 <= nodes <= MAX_NODES:
        raise PlanError(f"--nodes must be between 1 and {MAX_NODES}")
    ranks = nodes * target.processes
    if ranks > 1 and link_gbps is None:
        raise PlanError("--nodes needs --link-gbps, the speed of each node's link to the others in Gb/s (100 for "
                        "100 Gb Ethernet, 400 for 4 InfiniBand NDR ports at 100 each, ...)")
    if link_gbps is not None and not (link_gbps > 0 and math.isfinite(link_gbps)):
        raise PlanError("--link-gbps must be a positive number")
    sizes = [f.get("parameter_bytes") or 0 for f in session.compute_facts if f.get("kind") == "ddp"]
    if not any(sizes):
        raise PlanError("--nodes prices the gradients' all-reduce from the DDP model's size, and this run has no "
                        "DistributedDataParallel model: record the job under torchrun with its DDP model")
    steps = len(stats.steady)
    backward = (stats.parts_s or {}).get("backward", 0.0) / steps
    return Nodes(nodes, float(link_gbps or 0.0), max(sizes), ranks,
                 ring_sync_s(max(sizes), ranks, link_gbps) if link_gbps else 0.0, backward, stats.sync_s / steps)


def _nodes_words(n: Nodes) -> str:
    return (f"{n.count} node(s) like this one, {n.ranks} training processes in all: the DDP gradients "
            f"({n.gradient_bytes / 2**20:.3g} MiB) are all-reduced in one ring over all of them, each node's link "
            f"carrying 2(n-1)/n of them a step at {n.link_gbps:g} Gb/s: {1e3 * n.sync_s:.2f} ms a step (bandwidth "
            "only: per-message latency and the ranks' skew are not counted), with "
            f"none of it hidden behind the backward (an upper bound: DDP overlaps its buckets with the backward, "
            f"{1e3 * n.overlap_s:.2f} ms a step here); it replaces the recorded wait for other ranks "
            f"({1e3 * n.recorded_sync_s:.2f} ms a step); links inside a node are taken to be faster than the ring's "
            "slowest (NVLink, or one machine's memory)")


def device_share(stats: StepStats, timing: GpuTiming | None) -> float | None:
    """The share of the recorded compute a faster device shrinks: on a GPU run, the GPU's busy time per step over
    the host's compute per step (a host-bound job's GPU sits idle: a faster one gains it little); on a CPU run,
    forward, backward and optimizer (the step's own code stays). None where neither was recorded."""
    steps = len(stats.steady)
    if not steps or stats.compute_s <= 0:
        return None
    if timing is not None and timing.steps:
        return min(1.0, timing.busy_ms_median / 1e3 / (stats.compute_s / steps))
    if stats.parts_s is None:
        return None
    return (stats.parts_s["forward"] + stats.parts_s["backward"] + stats.parts_s["optimizer"]) / stats.compute_s
