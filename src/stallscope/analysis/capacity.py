"""Per-stage capacity and a throughput model that predicts the effect of a change.

Each input stage costs a measured number of worker-seconds per sample: CPU seconds for decode,
transform and loader (collate), blocked seconds for storage. Within one worker the stages run one
after another, so W workers sustain ``W / total_cost`` samples/s; blocking I/O overlaps across
workers for free, CPU work does not. Training runs at the lowest of three rates:

- the workers' rate ``W / (cpu_cost + blocked_cost)``;
- the training process's rate ``1 / (compute_per_sample + receive_per_sample)``: its own step
  time plus taking each batch from the workers (rebuilding it, and waiting for a busy worker to hand over
  its tensors' file descriptors), which it does serially;
- the CPU budget ``usable_cpus / (cpu_cost + training_process_cpu_per_sample + helper_cpu_per_sample)``:
  every sample's CPU work, in workers, in the training process and in helper processes it started
  (a local data server, say), shares the same cores.

With ``num_workers=0`` nothing overlaps and the costs add up instead.

When the workers cannot keep up, the cores are shared in time, not pooled: while the training process
computes it keeps ``main_occupancy`` cores busy (its CPU over its compute time: 1 for one thread, up to
the cores it has for intra-op threads), and the busy workers want a core each for the CPU part of their
work. If together they want more than the usable cores, everyone runs at ``cores / demand`` of full
speed (the kernel shares the cores fairly), so compute on the CPU slows down and the workers with it;
while the training process waits for a batch, the workers have the cores to themselves. A step is
then the compute phase (slowed) plus the wait for what the workers could not finish during it. A
compute with intra-op threads (occupancy above one core) fares worse than its fair share: each parallel
region waits for the thread that lost its core, so it runs at about one core's speed (its CPU time per
sample) whenever workers run beside it, and workers that wake for every batch keep it there. This
is what a 0-worker run, where nothing ran beside the training process, cannot show: the pooled budget
above over-predicts every CPU-bound job whose training also computes on the CPU. Compute on a GPU is
not slowed (its process still takes its cores).

Workers that wait on storage wake at moments nothing paces: two or more of them, with the training process,
collide on cores they outnumber even when the cores are idle on average. A worker back from storage then waits for
the threads it finds wanting a core (``queued_rate``: a closed queueing system's mean-value estimate, where an
arrival sees the others as they are without it, and each thread beyond the cores slows everyone by its share). On
the 2-core development VM, 3 workers that wait 40 ms and compute 7.4 ms per sample, on one core beside a 4 ms
compute, were planned at 61/s without it and 55/s with it, and measured 50-51/s (their run-queue wait 8.8-11.5 ms per
sample; this estimate's, 7 ms: Linux's wake-up is slower to hand a core over than the estimate). One worker is
paced by the training process's batches (it starts the next as one is taken), which the shared-cores phases price.

A core's hardware threads (SMT, hyper-threading) are not cores: where the usable CPUs are ``physical_cores``
cores with two or more hardware threads each, each busy thread beyond one per core adds only ``SMT_YIELD`` of a
core (``core_capacity``). Every thread on such a core then runs slower, so the budget, the workers' rate and the
compute beside busy workers all count core capacity, not CPUs. Workers recorded with more threads busy than cores
measured their CPU costs slowed the same way; ``build_model`` takes that out first.

A CPU second does not cost the same at every load. With every core busy, the cores share caches, memory bandwidth
and a lower all-core clock; with more runnable threads than cores, the kernel switches between them every few
milliseconds. The switches cost work that takes fresh memory (a decode's new buffers, the shared-memory segments a
batch is collated into) most and work whose memory stays put (a Python tokenizer's pooled objects) little, whatever
its cache footprint: the page faults each fetch took say which (``worker_sharing_cost``). A run measures its costs
under its own load only: a 0-worker run under one busy thread. So every rate prices the CPU work (workers', the
training process's, a CPU compute's) by ``load_cost`` of the threads that configuration keeps busy, over the load
the run was recorded under (``recorded_load_cost``); both terms are estimates, stated where they are used. The
training process's own work pays a little more for sharing its core than the workers' does
(``COMPUTE_TIME_SHARING_COST``): its working set is evicted at every switch. And a worker's CPU second costs more
again while the training computes on the CPU beside it, on another core (``COMPUTE_NEIGHBOUR_COST``, for the share
of the time it does, ``computing_share``): a training step is a heavier neighbour for the shared caches and memory
than another worker's decode, and a 0-worker run, whose loading and compute took turns, never shows it.

Some costs exist only with workers: a worker collates each batch into a fresh shared-memory segment and
the training process maps it again, both paying page faults an in-process batch never does. A run with
workers measures them (in the workers' collate and the receive); from a 0-worker run they are estimated
from the batch's bytes per sample and a per-byte cost the recorder measured at exit on the same machine
(``recorder/shm_cost.py``), or this machine's typical figure when it could not (``worker_only_basis``). A training
step on the CPU reads its batch more than once, so its side is that one pass's cost times ``RECEIVED_BATCH_READS``:
without it, "add workers" from a 0-worker run was over-predicted by 10-19% on average, which a dearer CPU second at
every load had hidden while it under-predicted adding workers to a run that had them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from stallscope.analysis.findings import LoaderSummary, StepStats, WorkerPipeline

CPU_STAGES = ("decode", "transform", "loader")
#: Above this many cores busy while it computes, the training process runs intra-op threads in parallel regions.
#: One thread reads 1.00-1.05 (the interpreter's and the allocator's own threads, the sampler's rounding): a
#: single-threaded compute measured at 1.003 was taken for a threaded one and predicted to slow to 0.67x beside
#: a second, nearly idle worker (measured 0.88-1.06x).
THREADED_OCCUPANCY = 1.2
#: Cores' worth of work a core's second hardware thread adds when both are busy. Not measured here (the development
#: machine shows no SMT siblings): vendors quote up to 30% more throughput from hyper-threading, least for dense
#: floating point, most for integer and memory-bound work such as JPEG decoding and resizing.
SMT_YIELD = 0.25
#: Seconds per byte to fill a fresh shared-memory segment and to map it again, read it and free it, over
#: ordinary memory; used where the recorder could not measure them (2-core development VM, 2026-12-01: 0.75 and
#: 0.3 ms per MiB for batches of 2-18 MiB).
TYPICAL_SHM_WRITE_S_PER_BYTE = 0.72e-9
TYPICAL_SHM_READ_S_PER_BYTE = 0.29e-9
#: How much more a CPU second of work costs with every core busy than with one (caches and memory bandwidth shared
#: between cores, a lower all-core clock), reached in proportion as the busy cores go from one to all. Estimated: a
#: run shows only the load it ran with. Measured on the 2-core development VM in the runs' own CPU per sample, a
#: worker's going from 1 to 2 workers on 2 cores (saved ``benchmarks/transfer.py`` runs, sessions 17-20, 11 pairs
#: each): median +3% for 500x400 JPEGs, +1% for 2000x1500 ones, +1% for Python tokenizing; the training step's own
#: CPU +2-3%.
#: Vendors' all-core clocks run 10-25% below their one-core clocks, which a busier machine than this VM would show.
ALL_CORES_BUSY_COST = 0.04
#: How much more a CPU second costs once runnable threads outnumber the cores, reached at one thread more than
#: cores: the kernel switches between them every few milliseconds, and the work pays for it in the memory it maps
#: afresh (below). More threads do not switch more often (the scheduler's slice sets that), so the cost stops there.
#: Estimated; measured on the 2-core VM in the same runs: a worker's CPU per sample with 3 workers on 2 cores +8% over
#: 1 worker for JPEGs (+1% tokenizing), with 2 and 3 workers on 1 core +5% and +10%.
#: This is the cost for work that streams through fresh memory (``FRESH_PAGES_FOR_FULL_SHARING_COST``).
TIME_SHARING_COST = 0.08
#: The time-sharing cost of work whose memory stays put: a pure-Python tokenizer's objects are reused from the
#: interpreter's own pools and take almost no page faults. Measured on the 2-core VM (2026-12-04, plain DataLoader on
#: one core, 2 rounds): the tokenize scenario's worker CPU per sample with 2 and 3 workers +1-3% and +4% over 1 worker
#: (2 page faults per sample), where 500x400 JPEGs paid +6-9% and +14% (170 faults per sample, 60,000 per CPU second)
#: and 2000x1500 JPEGs +1-9% and +6-10% (450-600 per sample, 30,000 per CPU second). A synthetic worker that reuses
#: one 600 KB or 4 MB array paid nothing (145 us per item with 1, 2 or 3 processes on the core); the same work
#: allocating its array afresh each time (261 faults per item) paid +6% and +7%. So the cost is the fresh memory, not
#: the cache footprint, and the fault rate the recorder counts in each fetch (``FetchRecord.minflt``) says which.
RESIDENT_TIME_SHARING_COST = 0.02
#: Minor page faults per CPU second of the workers' work at which their time-sharing cost is ``TIME_SHARING_COST``
#: (from ``RESIDENT_TIME_SHARING_COST`` at none, in proportion): both JPEG pipelines above paid it in full at 30,000
#: and more; the tokenizer, at under 1,000, the resident figure. Where it is crossed between is not measured.
FRESH_PAGES_FOR_FULL_SHARING_COST = 20_000.0
#: A memory page: what a fresh shared-memory segment takes a fault for (x86-64 and most arm64 Linux kernels).
PAGE_BYTES = 4096
#: ``TIME_SHARING_COST`` for the training process's own CPU work where it computes on the CPU: its weights,
#: activations and optimizer state are a working set the neighbour's work evicts at every switch, where a decode
#: streams through its image. Measured on the 2-core VM in the same runs: the training step's own CPU per sample with
#: 1, 2 and 3 workers on one core (time-shared) within 3-8% of the same on two. Sessions 18-20 priced it at 40%
#: from a step's CPU beside workers against the same step without them; that difference is the batches coming from
#: another process (``RECEIVED_BATCH_READS``), which stays the same at every worker count. Estimated.
COMPUTE_TIME_SHARING_COST = 0.1
#: How much more a worker's CPU second costs while the training process computes on the CPU beside it, on another
#: core, reached as that computing goes from none of the time to all of it: a training step streams its
#: activations and weights through the caches and memory the cores share, a heavier neighbour than another
#: worker's decode (which ``ALL_CORES_BUSY_COST`` prices). A 0-worker run never shows it: its loading and its compute
#: took turns on one thread. Measured on the 2-core development VM (2026-12-03): the same 500x400 JPEG pipeline's
#: decode and transform CPU per sample in 1 or 2 workers beside the reference training, over the same in-process,
#: 1.08-1.42x (median 1.17; 15 pairs of saved ``demo`` and ``benchmarks/predictions.py`` runs), where the load terms
#: gave 1.04-1.06x, with the training computing 30-50% of the time; without a compute beside them (the training
#: process idle between batches), 1 and 2 workers measured within 5% of in-process. The collate into shared memory
#: rose likewise: 1.14-2.4x its calibration at exit. Estimated.
COMPUTE_NEIGHBOUR_COST = 0.3
#: How many times a training step that computes on the CPU pays the calibrated cost of reading a batch that a worker
#: wrote into shared memory (``recorder/shm_cost.py`` times one pass), estimated for a run recorded without workers.
#: Measured on the 2-core VM: the step's own CPU per sample with workers over the same step loading in-process, against
#: the calibrated one pass (saved ``benchmarks/transfer.py`` runs, sessions 17-20): 2.7-6.9x (median 4.1x, 22 pairs)
#: for the reference training with one intra-op thread, 0.6-3.8x (median 2.4x) with two. A step passes over its input
#: more than once and each pass over pages mapped from another process costs more than over its own; which of these
#: dominates was not measured. On a GPU the batch is read once, by the copy to the device, so the factor is 1 there.
RECEIVED_BATCH_READS = 4.0
#: How much longer a CPU compute takes, in units of its one-thread time, for each intra-op thread beyond the CPUs the
#: process may use: each parallel region waits for the threads that lost their CPU, so more threads than CPUs run
#: slower than one. Measured on the 2-core development VM (2026-12-04, the reference training, 40 steps, 0 workers):
#: on one CPU, 1 thread 0.74-0.81 ms per sample, 2 threads 1.19-1.23 (+0.55 of one thread's time), 3 threads
#: 1.80-1.91 (+0.7 each), 4 threads 2.49 (+0.75 each); on two CPUs, 3 threads 1.04 and 4 threads 1.66 against one
#: thread's 0.76 (+0.37, +0.59 each; median of all +0.59). Estimated from these; only a run recorded with more
#: threads than CPUs (``compute_oversubscribed``) is credited with it, where a change cuts them to the CPUs.
OVERSUBSCRIBED_THREAD_COST = 0.55
#: Threads beyond the CPUs counted at most: the measurements above went to 3 (4 threads on one CPU). A compute recorded
#: with more (torch's default threads in a container whose quota is a few of the host's CPUs) is credited no more
#: than measured: a cut to its CPUs is predicted to gain less than it may.
OVERSUBSCRIBED_THREADS_PRICED = 3.0
#: Passes that price a configuration's CPU work at its load and read the load again at the priced rate, at most: they
#: stop once the workers' and the compute's prices agree to a millionth, which takes two or three passes for most
#: configurations and up to eight for a heavy compute time-sharing its cores (the compute's dearer price moves the
#: load).
LOAD_PASSES = 12
#: At most this many mean-value passes in ``queued_cpu_s``, which stops once the stretch moves by under a billionth:
#: each pass shrinks the error by about the share of a core the others take, so the busiest cases want a hundred or so.
QUEUE_PASSES = 400


@dataclass(frozen=True)
class ThroughputModel:
    cost_s: dict[str, float]  # worker-seconds per sample, per stage
    compute_per_sample_s: float  # wall time of the training process's own work per sample
    main_cpu_per_sample_s: float  # CPU the training process burns per sample once loading is moved out
    workers: int
    usable_cpus: float
    measured_samples_per_s: float | None = None
    receive_per_sample_s: float = 0.0  # taking batches from workers (rebuild + descriptor waits), training process
    helper_cpu_per_sample_s: float = 0.0  # the training process's other child processes (not workers)
    main_occupancy: float = 1.0  # cores the training process keeps busy while it computes
    compute_on_cpu: bool = True  # the training computes on the CPU (no GPU): it slows when cores are shared
    # Costs only workers bring, estimated for a run recorded without them (0 when measured in the run):
    shm_write_per_sample_s: float = 0.0  # a worker's collate into shared memory (worker CPU)
    shm_read_per_sample_s: float = 0.0  # mapping the batch again and reading it once, in the training process
    worker_only_basis: str | None = None  # "measured at exit" or "typical" where estimated; None when not
    # the CPU part of receive_per_sample_s (rebuilding); the rest waited on a busy worker. None: all of it CPU
    receive_cpu_per_sample_s: float | None = None
    # cores that usable_cpus are hardware threads of (SMT); None: every usable CPU is a core of its own
    physical_cores: float | None = None
    # what a CPU second cost under the recorded run's own load (``load_cost``); None: no load correction
    recorded_load_cost: float | None = None
    # the same for the training process's own CPU work (``load_cost(..., compute=True)``); None: as the workers'
    recorded_compute_load_cost: float | None = None
    # the share of the time the training process computed on the CPU beside busy workers in the recorded run
    # (``computing_share``); None: not priced
    recorded_computing_share: float | None = None
    # False where the compute is the user's figure for the target (plan --step-ms): not priced at any load
    compute_priced: bool = True
    # the training process's intra-op threads (torch.get_num_threads()) where recorded
    compute_threads: int | None = None
    # the compute was recorded with more intra-op threads than usable CPUs: its time holds their waits for a CPU
    compute_oversubscribed: bool = False
    # the kernel did not report run-queue waits: the workers' blocked time holds their waits for a core already
    blocked_holds_core_waits: bool = False
    # minor page faults per CPU second of the workers' work (fresh memory they touch, with the shared-memory
    # segments a 0-worker run's batches would be collated into); None: not counted (``worker_sharing_cost``)
    fresh_pages_per_cpu_s: float | None = None

    @property
    def compute_priced_apart(self) -> bool:
        """Whether the training process's own work is priced at its own load cost (``COMPUTE_TIME_SHARING_COST``):
        it computes on the CPU and its time was measured, not given for the target (plan --step-ms)."""
        return self.compute_on_cpu and self.compute_priced

    def core_capacity(self, busy: float) -> float:
        """Cores' worth of work ``busy`` runnable threads get done at once: a core each up to the physical cores,
        ``SMT_YIELD`` for each further one (on a core's second or later hardware thread), never more than the usable
        CPUs."""
        busy = max(0.0, min(busy, self.usable_cpus))
        cores = self.physical_cores
        if cores is None or cores >= self.usable_cpus:
            return busy
        return min(busy, cores) + SMT_YIELD * max(0.0, busy - cores)

    @property
    def threads_per_core(self) -> float:
        """Hardware threads per core of the usable CPUs (1 where each is a core of its own)."""
        return self.usable_cpus / self.physical_cores if self.physical_cores else 1.0

    def smt_speed(self, busy: float) -> float:
        """How fast each of ``busy`` runnable threads runs against a core of its own, from shared cores' hardware
        threads alone (time-sharing beyond the usable CPUs is not in it): 1 without SMT or up to the cores."""
        running = min(busy, self.usable_cpus)
        return self.core_capacity(running) / running if running > 0 else 1.0

    def costs(self, scale: dict[str, float] | None, workers: int | None = None) -> tuple[float, float]:
        scale = scale or {}
        workers = self.workers if workers is None else workers
        cpu = sum(self.cost_s.get(n, 0.0) * scale.get(n, 1.0) for n in CPU_STAGES)
        if workers > 0:
            cpu += self.shm_write_per_sample_s * scale.get("loader", 1.0)
        blocked = self.cost_s.get("storage", 0.0) * scale.get("storage", 1.0)
        return cpu, blocked

    def receive_s(self, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
        """What the training process spends per sample taking batches from workers (none without them): rebuilding
        them (CPU, per sample), waiting for the sender to hand them over (``handover_wait_s``) and mapping them."""
        workers = self.workers if workers is None else workers
        if workers <= 0:
            return 0.0
        return self.receive_cpu_s() + self.handover_wait_s(workers, scale) + self.shm_read_s()

    def shm_read_s(self) -> float:
        """The training process's side of passing a batch through shared memory, per sample, where estimated for a
        run recorded without workers: the one-pass read, ``RECEIVED_BATCH_READS`` times where the training step
        computes on the CPU (a copy to a GPU reads it once). Read from ``compute_on_cpu`` where priced, so a CPU
        recording planned for a GPU (``plan --gpus``) pays one pass."""
        return self.shm_read_per_sample_s * (RECEIVED_BATCH_READS if self.compute_on_cpu else 1.0)

    def receive_cpu_s(self) -> float:
        """The CPU part of receiving a batch, per sample (rebuilding it)."""
        recorded = self.receive_cpu_per_sample_s
        return self.receive_per_sample_s if recorded is None else min(recorded, self.receive_per_sample_s)

    def handover_wait_s(self, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
        """The waiting part of ``receive_s``: for the sending worker to hand over the batch's descriptors.

        A worker does that only once it lets go of the GIL: one inside a long call (a tokenizer's batch encode)
        answers at that call's end. The wait is for a busy worker; with more workers each makes a smaller share of
        the batches and is that much less often busy when asked, so the wait measured with W workers is taken to
        scale as W / W' with W' of them (a 1-worker tokenizing run waited 4.8 ms per sample, the same with 2 workers
        1.5 ms), and with each worker's CPU work per sample where a fix changes it (``scale``): a worker with half
        the work is busy half as long."""
        workers = self.workers if workers is None else workers
        if workers <= 0:
            return 0.0
        waited = max(0.0, self.receive_per_sample_s - self.receive_cpu_s())
        if self.workers > 0:
            waited *= self.workers / workers
        if scale:
            recorded, _ = self.costs(None, self.workers)
            changed, _ = self.costs(scale, self.workers)
            waited *= changed / recorded if recorded > 0 else 1.0
        return waited

    def cpu_rate(self, scale: dict[str, float] | None = None, workers: int | None = None) -> float:
        cpu, _ = self.costs(scale, workers)
        workers = self.workers if workers is None else workers
        mapping = self.shm_read_s() if workers > 0 else 0.0  # the training process's, estimated
        demand = cpu + self.main_cpu_per_sample_s + self.helper_cpu_per_sample_s + mapping
        return self.core_capacity(self.usable_cpus) / demand if demand > 0 else float("inf")

    def pipeline_rate(self, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
        workers = self.workers if workers is None else workers
        cpu, blocked = self.costs(scale, workers)
        if cpu + blocked <= 0:
            return float("inf")
        if workers <= 0:
            return 1.0 / (cpu + blocked)
        speed = self.smt_speed(workers * cpu / (cpu + blocked))  # busy workers sharing cores' hardware threads
        return min(workers / (cpu / speed + blocked), self.cpu_rate(scale, workers))

    def compute_rate(self, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
        own = self.compute_per_sample_s + self.receive_s(workers, scale)
        return 1.0 / own if own > 0 else float("inf")

    def rate(self, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
        """Samples/s with ``workers`` and the stage costs scaled by ``scale``, with every CPU cost priced at the
        load that configuration puts on the cores (``load_cost``) against the load it was recorded under."""
        workers = self.workers if workers is None else workers
        return self.at_load(workers, scale)._rate(workers, scale)

    def at_load(self, workers: int | None = None, scale: dict[str, float] | None = None,
                costs: tuple[float, float] | None = None) -> ThroughputModel:
        """The model with its CPU costs priced at the load ``workers`` (and ``scale``) put on the cores: what
        ``rate`` uses, and what the time a configuration spends where (a plan's data wait) is read from. ``costs``:
        that load's ``load_costs``, where the caller has them already."""
        relative, compute = self.load_costs(workers, scale) if costs is None else costs
        if abs(relative - 1.0) < 1e-9 and abs(compute - 1.0) < 1e-9:
            return self
        return self.cpu_slowed(relative, compute)

    def cpu_second_cost(self, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
        """What a CPU second of the workers' costs with ``workers`` (and ``scale``) against the recorded run
        (``load_costs``' first figure)."""
        return self.load_costs(workers, scale)[0]

    def load_costs(self, workers: int | None = None, scale: dict[str, float] | None = None) -> tuple[float, float]:
        """What a CPU second costs with ``workers`` (and ``scale``) against the recorded run: ``load_cost`` of the
        threads that configuration keeps busy, over the recorded run's own, for the input work (and dearer again
        by the compute beside the workers, ``computing_share``, over the recorded run's) and for the training
        process's own. The load is read at the rate the priced costs give (dearer CPU work slows the rate, which
        changes who waits), repeated until the two agree."""
        workers = self.workers if workers is None else workers
        if self.recorded_load_cost is None:
            return 1.0, 1.0
        recorded_compute = self.recorded_compute_load_cost or self.recorded_load_cost
        recorded_neighbour = 1.0 + COMPUTE_NEIGHBOUR_COST * (self.recorded_computing_share or 0.0)
        relative = (1.0, 1.0)
        for _ in range(LOAD_PASSES):
            model = self if relative == (1.0, 1.0) else self.cpu_slowed(*relative)
            rate = model._rate(workers, scale)
            busy = model.busy_threads(workers, scale, rate)
            # the compute beside the workers: priced with their work, and with the training process's rebuilding
            # and mapping of their batches (``cpu_slowed``'s ``factor``), as memory-bound as the workers' collate
            neighbour = 1.0 + COMPUTE_NEIGHBOUR_COST * model.computing_share(workers, rate)
            priced = (self.load_cost(busy) * neighbour / (self.recorded_load_cost * recorded_neighbour),
                      self.load_cost(busy, compute=True) / recorded_compute)
            if abs(priced[0] - relative[0]) < 1e-6 and abs(priced[1] - relative[1]) < 1e-6:
                break
            relative = priced
        return priced

    def busy_threads(self, workers: int, scale: dict[str, float] | None, rate: float) -> float:
        """Threads that want a core, on average, at ``rate`` samples/s: each counted while it runs or waits for a
        core. The training process for the share of the time it computes (without workers, its loading too), the
        workers for their CPU work, both stretched by the wait for a core where more threads want one than there
        are CPUs (the demand ``shared_cores_rate`` counts), never more than the workers there are; and the helper
        processes. Continuous in the rate: a worker count near the point where the compute takes over the pace is
        not priced as all-busy on one side and idle on the other."""
        cpu, blocked = self.costs(scale, workers)
        helper = rate * self.helper_cpu_per_sample_s
        if workers <= 0:
            return rate * (cpu + self.working_cpu_s()) + helper
        occupancy = max(0.0, min(self.main_occupancy, self.usable_cpus))
        on_cpu = cpu / (cpu + blocked) if cpu + blocked > 0 else 0.0
        demand = occupancy + workers * on_cpu
        stretch = max(1.0, demand / self.usable_cpus) if self.usable_cpus > 0 else 1.0
        computing = min(1.0, rate * self.compute_per_sample_s * (stretch if self.compute_on_cpu else 1.0))
        main = occupancy * computing + rate * self.receive_cpu_s()
        return main + min(workers * on_cpu, rate * cpu * stretch) + helper

    def computing_share(self, workers: int, rate: float) -> float:
        """The share of the time the training process computes on the CPU beside busy workers, at ``rate``
        samples/s: what makes their CPU seconds dearer (``COMPUTE_NEIGHBOUR_COST``; a step time given for a CPU
        target, ``plan --step-ms``, is such a compute too). None of it without workers (the training process then
        loads and computes in turn), with the compute on a GPU, and on a single core, where the two take turns on
        it (``TIME_SHARING_COST`` prices that) or share it as its hardware threads (``SMT_YIELD`` does); on a
        fraction of a second core (a quota) in proportion."""
        if workers <= 0 or not self.compute_on_cpu or rate <= 0:
            return 0.0
        cores = min(self.physical_cores or self.usable_cpus, self.usable_cpus)
        beside = min(1.0, max(0.0, cores - 1.0))
        return min(1.0, rate * self.compute_per_sample_s) * beside

    def working_cpu_s(self) -> float:
        """The training process's CPU per sample that is work when it loads its batches itself (0 workers): its
        compute's, on no more cores than it kept busy and no more than its intra-op threads. Those threads, with a
        core each, spun waiting for work while the process loaded batches (OpenMP's wait): that CPU is in
        ``main_cpu_per_sample_s`` (and in an occupancy read from it) but loads the cores no more than an idle one,
        so it does not count as their load (``busy_threads``). Rebuilding received batches is not there either:
        without workers nothing is received."""
        if not self.compute_on_cpu:
            return self.main_cpu_per_sample_s
        cores = min(self.main_occupancy, float(self.compute_threads)) if self.compute_threads else self.main_occupancy
        return min(self.main_cpu_per_sample_s, self.compute_per_sample_s * max(1.0, cores))

    def load_cost(self, busy: float, compute: bool = False) -> float:
        """What a CPU second costs with ``busy`` threads wanting the usable CPUs, against one thread alone:
        ``ALL_CORES_BUSY_COST`` reached as the busy threads go from one to a thread per core, and the workers'
        ``worker_sharing_cost`` (``COMPUTE_TIME_SHARING_COST`` for the training process's own work, ``compute``) as
        they go on to one thread more than CPUs."""
        cpus = self.usable_cpus
        if cpus <= 0:
            return 1.0
        # over the cores: a core's hardware threads share more than caches, which SMT_YIELD prices already
        cores = min(self.physical_cores or cpus, cpus)
        shared = min(1.0, max(0.0, (busy - 1.0) / (cores - 1.0))) if cores > 1.0 else 0.0
        sharing_cost = COMPUTE_TIME_SHARING_COST if compute else self.worker_sharing_cost()
        return 1.0 + ALL_CORES_BUSY_COST * shared + sharing_cost * min(1.0, max(0.0, busy / cpus - 1.0))

    def worker_sharing_cost(self) -> float:
        """What a worker's CPU second costs more once threads outnumber the cores: ``TIME_SHARING_COST`` for work
        that takes fresh memory at ``FRESH_PAGES_FOR_FULL_SHARING_COST`` page faults per CPU second or more,
        ``RESIDENT_TIME_SHARING_COST`` for work that takes none, in proportion between; the full cost where the
        faults were not counted."""
        if self.fresh_pages_per_cpu_s is None:
            return TIME_SHARING_COST
        fresh = min(1.0, max(0.0, self.fresh_pages_per_cpu_s / FRESH_PAGES_FOR_FULL_SHARING_COST))
        return RESIDENT_TIME_SHARING_COST + (TIME_SHARING_COST - RESIDENT_TIME_SHARING_COST) * fresh

    def one_thread_compute_s(self) -> float:
        """The compute's time per sample on one thread, for a compute recorded with more threads than usable CPUs:
        the recorded time less what its threads beyond the CPUs cost (``OVERSUBSCRIBED_THREAD_COST``). The recorded
        time where it was not recorded so."""
        if not (self.compute_oversubscribed and self.compute_threads):
            return self.compute_per_sample_s
        return self.compute_per_sample_s / oversubscription_cost(self.compute_threads, self.usable_cpus)

    def with_compute_threads(self, threads: int) -> ThroughputModel:
        """The model with a CPU compute on ``threads`` intra-op threads instead of the recorded ``compute_threads``
        (``--set torch_threads``): fewer threads leave cores to workers, and a compute that keeps no more threads
        than its cores busy is not held back by them (``shared_cores_rate``). Its CPU work stays: it keeps at most
        ``threads`` cores busy and its time grows by what it loses of its recorded occupancy. That occupancy counts
        whatever the threads spent waiting at each parallel region's end, and no parallel overhead is credited
        back, so fewer threads are predicted no faster than that. But a compute recorded with more threads than CPUs
        (``compute_oversubscribed``) cut to no more than the CPUs loses their waits for a CPU: it is its one-thread
        time (``one_thread_compute_s``) over the threads. Unchanged where the compute is on a GPU, its threads were
        not recorded, or ``threads`` is not fewer than it kept busy."""
        occupancy = self.main_occupancy
        if not self.compute_on_cpu or self.compute_threads is None or threads <= 0:
            return self
        if self.compute_oversubscribed and threads < self.compute_threads and threads <= self.usable_cpus + 1e-9:
            compute = self.one_thread_compute_s() / threads  # no more threads than CPUs: ideal speed-up, as above
            main_cpu = min(self.main_cpu_per_sample_s, compute * threads + self.receive_cpu_s())
            return dataclasses.replace(self, compute_per_sample_s=compute, main_cpu_per_sample_s=main_cpu,
                                       main_occupancy=float(threads), compute_threads=threads,
                                       compute_oversubscribed=False)
        if threads >= occupancy:
            return self
        compute = self.compute_per_sample_s * occupancy / threads
        # ``threads`` threads computing for ``compute`` seconds burn no more CPU than that: what the recorded threads
        # burned beyond it was theirs waiting for work (OpenMP's spin), gone with them
        main_cpu = min(self.main_cpu_per_sample_s, compute * threads + self.receive_cpu_s())
        return dataclasses.replace(self, compute_per_sample_s=compute, main_cpu_per_sample_s=main_cpu,
                                   main_occupancy=float(threads), compute_threads=threads)

    def cpu_slowed(self, factor: float, compute_factor: float | None = None) -> ThroughputModel:
        """The model with every CPU cost ``factor`` times as long: the workers' CPU stages and their shared-memory
        writes, the training process's rebuilding of received batches (and the mapping of them estimated for a
        0-worker run), the helpers'; and the training process's own CPU and its compute where it runs on the CPU
        (and was measured, not given) ``compute_factor`` times (``factor`` where not given; a recorded mapping is
        part of that CPU). A GPU's compute, a given one and blocked time stay."""
        own = factor if compute_factor is None else compute_factor
        cost = {node: seconds * factor if node in CPU_STAGES else seconds for node, seconds in self.cost_s.items()}
        receive_cpu = self.receive_cpu_s()
        priced = self.compute_priced_apart
        compute = self.compute_per_sample_s * own if priced else self.compute_per_sample_s
        # the training process's CPU is its compute's and, with workers, its rebuilding of received batches
        main = self.main_cpu_per_sample_s
        main_own = max(0.0, main - receive_cpu) if self.workers > 0 else main
        main_cpu = main_own * (own if priced else factor) + (main - main_own) * factor
        return dataclasses.replace(
            self, cost_s=cost, compute_per_sample_s=compute,
            main_cpu_per_sample_s=main_cpu,
            helper_cpu_per_sample_s=self.helper_cpu_per_sample_s * factor,
            shm_write_per_sample_s=self.shm_write_per_sample_s * factor,
            shm_read_per_sample_s=self.shm_read_per_sample_s * factor,
            receive_per_sample_s=self.receive_per_sample_s + receive_cpu * (factor - 1.0),
            receive_cpu_per_sample_s=receive_cpu * factor, recorded_load_cost=None, recorded_compute_load_cost=None,
            recorded_computing_share=None)

    def _rate(self, workers: int, scale: dict[str, float] | None) -> float:
        if workers <= 0:
            cpu, blocked = self.costs(scale, workers)
            return 1.0 / (cpu + blocked + self.compute_per_sample_s)
        pooled = min(self.pipeline_rate(workers, scale), self.compute_rate(workers, scale))
        shared = self.shared_cores_rate(workers, scale)
        rate = pooled if shared is None else min(pooled, shared)
        queued = self.queued_rate(workers, scale, rate)
        return rate if queued is None else min(rate, queued)

    def queued_rate(self, workers: int, scale: dict[str, float] | None = None,
                    upper: float | None = None) -> float | None:
        """The workers' rate when their CPU bursts arrive at random and wait for a core (see the module's
        docstring); None where the workers never wait on storage (always runnable: the budget and the shared-cores
        phases price them) or fit a core each beside the training process.

        Found by bisection below ``upper`` (the other bounds' rate): the rate that the workers' cycle, blocked time
        plus CPU work stretched by what they find running, sustains."""
        cpu, blocked = self.costs(scale, workers)
        if workers <= 1 or cpu <= 0 or blocked <= 0 or upper is None or upper <= 0 or upper == float("inf") \
                or self.blocked_holds_core_waits:
            return None
        cores = self.usable_cpus
        occupancy = max(0.0, min(self.main_occupancy, cores))
        if cores <= 0 or workers + occupancy <= cores:
            return None

        def sustained(rate: float) -> float:
            return workers / (blocked + self.queued_cpu_s(workers, cpu, rate))

        if sustained(upper) >= upper:
            return upper
        low, high = 0.0, upper
        for _ in range(40):
            mid = (low + high) / 2
            low, high = (mid, high) if sustained(mid) >= mid else (low, mid)
        return low

    def queued_cpu_s(self, workers: int, cpu: float, rate: float) -> float:
        """A worker's CPU work per sample, stretched by the threads it finds wanting a core when it wakes: the
        other workers for the share of the time they are on a core or waiting for one, the training process for
        its CPU per sample at ``rate`` (its threads' CPU: each counts), the helpers. ``n`` threads wanting the
        CPUs run at ``CPUs / n`` of full speed each beyond them (time-shared), the training process's work likewise
        beside the workers it finds; the arrival sees the others, not itself (a closed system's arrival theorem), so
        one worker beside a training process on two cores never waits. Mean-value iteration to its fixed point.
        Hardware threads sharing a core are not priced here: the workers' rate and the budget price them
        (``smt_speed``, ``core_capacity``), and counting them again made a 2-thread core's advice vanish."""
        main = rate * self.main_cpu_per_sample_s
        helper = rate * self.helper_cpu_per_sample_s
        per_worker = rate / workers
        main_threads = max(self.main_occupancy, 1.0)

        def slowed(n: float) -> float:  # how much longer a CPU second takes among ``n`` threads wanting the CPUs
            return max(1.0, n / self.usable_cpus) if self.usable_cpus > 0 else 1.0

        stretched = cpu
        for _ in range(QUEUE_PASSES):
            on_core = min(1.0, per_worker * stretched)  # one worker's share of time on a core or waiting for one
            main_found = min(main * slowed(main_threads + workers * on_core), main_threads)
            found = (workers - 1) * on_core + main_found + helper
            previous, stretched = stretched, cpu * slowed(1.0 + found)
            if abs(stretched - previous) <= 1e-9 * stretched:
                break
        return stretched

    def shared_cores_rate(self, workers: int, scale: dict[str, float] | None = None) -> float | None:
        """The rate when the workers and a CPU compute want more cores than there are (see the module's
        docstring); None when they do not (the pooled budget holds)."""
        cpu, blocked = self.costs(scale, workers)
        if workers <= 0 or cpu <= 0:
            return None
        cores = self.usable_cpus
        on_cpu = cpu / (cpu + blocked)  # the share of a busy worker's time that wants a core
        occupancy = max(0.0, min(self.main_occupancy, cores))
        demand = occupancy + workers * on_cpu
        if self.core_capacity(demand) >= demand:  # a core each: no sharing
            return None
        beside = self.core_capacity(demand) / demand  # everyone's speed while the training computes beside busy workers
        alone = min(1.0, self.core_capacity(workers * on_cpu) / (workers * on_cpu))  # the workers' while it waits
        # Intra-op threads that cannot all hold a CPU (time-shared, not merely on a shared core): each parallel
        # region waits for the thread that lost its CPU, so the compute runs at one core's speed at best.
        held_back = self.compute_on_cpu and occupancy > THREADED_OCCUPANCY and demand > cores
        if not self.compute_on_cpu:
            slowdown = 1.0
        elif held_back:
            slowdown = max(occupancy, 1.0 / beside)
        else:
            slowdown = 1.0 / beside
        receive = self.receive_s(workers, scale)
        handover = self.handover_wait_s(workers, scale)  # the training process waits off-core: the workers run alone
        compute = self.compute_per_sample_s * slowdown + receive - handover
        made_while_computing = compute * workers / (blocked + cpu / beside) + handover * workers / (blocked + cpu / alone)
        if made_while_computing >= 1.0:
            # The workers keep up. A single-threaded compute is slowed only while they run (the pooled
            # budget covers that); threads held back at every batch's wake-up stay slow all along.
            return 1.0 / (compute + handover) if held_back else None
        waiting = (1.0 - made_while_computing) * (blocked + cpu / alone) / workers
        return 1.0 / (compute + handover + waiting)

    def speedup(self, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
        return self.rate(workers, scale) / self.rate()

    def stage_capacity(self) -> dict[str, float | None]:
        """Samples/s each stage could sustain alone with the workers and cores it has now."""
        workers = max(1, self.workers)
        cores = self.core_capacity(min(workers, self.usable_cpus)) if self.workers > 0 else 1.0
        out: dict[str, float | None] = {}
        for stage in (*CPU_STAGES, "storage"):
            cost = self.cost_s.get(stage, 0.0)
            parallel = workers if stage == "storage" else cores
            out[stage] = parallel / cost if cost > 0 else None
        out["compute"] = self.compute_rate() if self.compute_per_sample_s > 0 else None
        return out


@dataclass(frozen=True)
class CapacityReport:
    model: ThroughputModel | None
    stage_samples_per_s: dict[str, float | None] = field(default_factory=dict)
    pipeline_samples_per_s: float | None = None
    predicted_samples_per_s: float | None = None


def threads_outnumber_cpus(threads: int | None, cpus: float) -> bool:
    """Whether a compute's intra-op threads are more than the CPUs it may use (by half a CPU: a quota of 1.97 CPUs
    is two), so that its parallel regions wait for the threads without one (``OVERSUBSCRIBED_THREAD_COST``)."""
    return threads is not None and threads > cpus + 0.5


def oversubscription_cost(threads: float, cpus: float) -> float:
    """How many one-thread times a CPU compute on ``threads`` intra-op threads takes on ``cpus`` CPUs where they
    outnumber them (``OVERSUBSCRIBED_THREAD_COST`` for each beyond, up to ``OVERSUBSCRIBED_THREADS_PRICED``); 1 where
    they do not."""
    extra = min(max(0.0, threads - cpus), OVERSUBSCRIBED_THREADS_PRICED)
    return 1.0 + OVERSUBSCRIBED_THREAD_COST * extra


def _fresh_pages_per_cpu_s(pipeline: WorkerPipeline, shm_write_per_sample_s: float,
                           bytes_per_sample: float | None) -> float | None:
    """Minor page faults per CPU second of the fetches' work; for a 0-worker run with the shared-memory segments
    workers would collate its batches into (a page each ``PAGE_BYTES`` of a batch, and their estimated CPU) added.
    None where the fetches did not count their faults."""
    if pipeline.fresh_pages is None or pipeline.cpu_s <= 0:
        return None
    pages, cpu = float(pipeline.fresh_pages), pipeline.cpu_s
    if pipeline.num_workers == 0 and bytes_per_sample:
        pages += pipeline.samples * bytes_per_sample / PAGE_BYTES
        cpu += pipeline.samples * shm_write_per_sample_s
    return pages / cpu


def build_model(stats: StepStats, train: LoaderSummary | None, usable_cpus: float,
                main_cpu_s: float | None, startup_s: float = 0.0,
                helper_cpu_s: float | None = None, compute_on_cpu: bool = True,
                bytes_per_sample: float | None = None,
                shm_calibration: dict | None = None,
                physical_cores: float | None = None, warmup_share: float = 0.0) -> ThroughputModel | None:
    """``main_cpu_s``: CPU seconds the training process used over the steady steps (from the sampler);
    ``helper_cpu_s``: those of its child processes that are not DataLoader workers; ``compute_on_cpu``:
    False when the training computes on a GPU; ``bytes_per_sample`` of the batches the loader returns and
    the recorder's ``shm_calibration`` (``Session.calibrations``) price the costs only workers bring;
    ``physical_cores``: the cores ``usable_cpus`` are hardware threads of, where fewer (SMT);
    ``warmup_share``: the share of the workers' CPU that restarted workers spent warming up
    (``EpochShape.warmup_share``), taken out of their steady costs: the epochs' own cost prices it."""
    pipeline = train.pipeline if train else None
    steady = stats.steady
    if pipeline is None or not steady or pipeline.samples <= 0 or not stats.samples:
        return None
    cost = {node: seconds / pipeline.samples for node, seconds in pipeline.node_cpu_s.items() if node != "storage"}
    cost["storage"] = (pipeline.blocked_s + pipeline.node_cpu_s.get("storage", 0.0)) / pipeline.samples
    workers = pipeline.num_workers
    if workers > 0 and 0.0 < warmup_share < 1.0:
        cost = {node: seconds * (1.0 - warmup_share) if node in CPU_STAGES else seconds
                for node, seconds in cost.items()}
    compute = (stats.compute_s + stats.transfer_s) / stats.samples
    if main_cpu_s is None:
        main_cpu = compute  # one busy core while computing
    else:
        main_cpu = main_cpu_s / stats.samples
        if workers == 0:  # the training process also did the loading: that part moves to workers
            main_cpu = max(0.0, main_cpu - sum(v for k, v in cost.items() if k in CPU_STAGES))
    measured = stats.samples / max(stats.wall_s - startup_s, 1e-9)
    # Taking a batch from a worker is serial time in the training process: rebuilding it (CPU) and waiting for
    # the worker to hand over each tensor's descriptor (a worker inside a long call that holds the GIL
    # answers late). Both are measured, per batch, in the run's next() calls.
    receive = stats.unpickle_s / stats.samples
    receive_cpu = stats.unpickle_cpu_s / stats.samples
    helper = (helper_cpu_s or 0.0) / stats.samples
    # Cores the training keeps busy while it computes: its own CPU (less rebuilding received batches)
    # over its compute time; one core when the sampler was off.
    occupancy = (max(0.0, main_cpu - receive_cpu) / compute if main_cpu_s is not None and compute > 0 else 1.0)
    write = read = 0.0
    basis = None
    if workers == 0 and bytes_per_sample:  # a CPU step reads it RECEIVED_BATCH_READS times over (shm_read_s)
        write, read, basis = _worker_only_costs(bytes_per_sample, shm_calibration)
    threads = train.config.get("torch_threads") if train else None
    model = ThroughputModel(cost, compute, main_cpu, workers, float(usable_cpus), measured, receive, helper,
                            receive_cpu_per_sample_s=min(receive, receive_cpu),
                            main_occupancy=min(occupancy, float(usable_cpus)), compute_on_cpu=compute_on_cpu,
                            shm_write_per_sample_s=write, shm_read_per_sample_s=read, worker_only_basis=basis,
                            physical_cores=physical_cores if physical_cores and physical_cores < usable_cpus else None,
                            compute_threads=threads if isinstance(threads, int) and threads > 0 else None,
                            compute_oversubscribed=(compute_on_cpu and isinstance(threads, int)
                                                    and threads_outnumber_cpus(threads, usable_cpus)),
                            blocked_holds_core_waits=pipeline.runqueue_s is None,
                            fresh_pages_per_cpu_s=_fresh_pages_per_cpu_s(pipeline, write, bytes_per_sample))
    model = _at_full_core_speed(model)
    # The costs were measured under the run's own load: priced at the model's rate for it, so that the recorded
    # configuration predicts what the model says for it, and every other configuration is priced against it.
    rate = model._rate(workers, None)
    recorded = model.busy_threads(workers, None, rate)
    return dataclasses.replace(model, recorded_load_cost=model.load_cost(recorded),
                               recorded_compute_load_cost=model.load_cost(recorded, compute=True),
                               recorded_computing_share=model.computing_share(workers, rate))


def _at_full_core_speed(model: ThroughputModel) -> ThroughputModel:
    """The model with its CPU costs as a core of its own would run them. Workers that kept more threads busy than
    there are cores measured every CPU second slowed by shared cores' hardware threads (``smt_speed`` of the busy
    CPUs on average: the CPU the job used per second of the steady steps); the model applies that slowdown again
    wherever it counts the workers' and the training process's CPU (the budget, the workers' rate, the shared-cores
    phase). The compute's wall time stays as measured, and a run without workers is taken as measured: its loading
    and its compute took turns on one thread."""
    if model.physical_cores is None or not model.measured_samples_per_s or model.workers <= 0:
        return model
    worker_cpu, _ = model.costs(None)
    busy = model.measured_samples_per_s * (worker_cpu + model.main_cpu_per_sample_s + model.helper_cpu_per_sample_s)
    speed = model.smt_speed(busy)
    if speed >= 1.0:
        return model
    cost = {node: seconds * speed if node in CPU_STAGES else seconds for node, seconds in model.cost_s.items()}
    return dataclasses.replace(model, cost_s=cost, main_cpu_per_sample_s=model.main_cpu_per_sample_s * speed,
                               helper_cpu_per_sample_s=model.helper_cpu_per_sample_s * speed)


def _worker_only_costs(bytes_per_sample: float, calibration: dict | None) -> tuple[float, float, str]:
    """Seconds per sample to write a batch into shared memory and to map it again, and their basis."""
    nbytes = (calibration or {}).get("nbytes") or 0
    if nbytes > 0:
        write = calibration.get("write_extra_ns", 0) / 1e9 / nbytes
        read = calibration.get("read_extra_ns", 0) / 1e9 / nbytes
        basis = "measured at exit"
    else:
        write, read, basis = TYPICAL_SHM_WRITE_S_PER_BYTE, TYPICAL_SHM_READ_S_PER_BYTE, "typical"
    return bytes_per_sample * write, bytes_per_sample * read, basis


def capacity_report(model: ThroughputModel | None) -> CapacityReport:
    if model is None:
        return CapacityReport(None)
    return CapacityReport(model, model.stage_capacity(), model.pipeline_rate(), model.rate())
