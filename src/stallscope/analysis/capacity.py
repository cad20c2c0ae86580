"""The throughput model: per-stage capacity, and the rate a change of workers, costs or threads would give.

Each input stage costs a measured number of worker-seconds per sample (``sample_costs``). Training runs at the lowest
of three rates (``throughput_rates``): the workers', the training process's (its step plus taking each batch from the
workers, serially) and the CPU budget that every sample's CPU work shares; where the workers and a CPU compute want
more cores than there are, the cores are shared in time and a step is the compute phase plus the wait for the
workers. Every CPU cost is priced at the load the configuration puts on the cores against the load the run was
recorded under (``cpu_load``). The model is built from a run's measurements by ``model_from_run.build_model``.

``ThroughputModel`` holds the measured figures; its methods are pure functions of it, kept in those modules by what
they answer and bound here, so ``model.rate(workers=3)`` reads as before. Every prediction is a ratio of the model's
own rates (``speedup``), so what the model gets wrong about the recorded run cancels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stallscope.analysis import cpu_load, sample_costs, throughput_rates


@dataclass(frozen=True)
class ThroughputModel:
    """What a run measured per sample, and the cores it had: every rate and price is a pure function of it."""

    cost_s: dict[str, float]  # worker-seconds per sample, per stage
    compute_per_sample_s: float  # wall time of the training process's own work per sample
    main_cpu_per_sample_s: float  # CPU the training process burns per sample once loading is moved out
    workers: int
    usable_cpus: float
    measured_samples_per_s: float | None = None
    receive_per_sample_s: float = 0.0  # taking batches from workers (rebuild + descriptor waits), training process
    helper_cpu_per_sample_s: float = 0.0  # the training process's other child processes (not workers)
    # the part of helper_cpu_per_sample_s that servers on this machine answering the job's requests used (a local
    # store, a proxy): it follows the requests a change leaves, where the other helpers' follows the samples
    server_cpu_per_sample_s: float = 0.0
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
    # the training loader's batch times, each over their mean, as quantiles (``in_order.batch_time_shape``); empty:
    # not known, and handing batches over in order is priced as losing nothing
    batch_time_shape: tuple[float, ...] = ()
    prefetch_factor: int = 2  # batches each worker has in flight

    # The model's questions, answered by the functions of the modules named, bound here as its methods.
    # What a sample costs (sample_costs.py)
    costs = sample_costs.stage_costs
    receive_s = sample_costs.receive_s
    shm_read_s = sample_costs.shm_read_s
    receive_cpu_s = sample_costs.receive_cpu_s
    handover_wait_s = sample_costs.handover_wait_s
    working_cpu_s = sample_costs.working_cpu_s
    one_thread_compute_s = sample_costs.one_thread_compute_s
    with_compute_threads = sample_costs.with_compute_threads

    # The load on the cores and what a CPU second costs under it (cpu_load.py)
    core_capacity = cpu_load.core_capacity
    smt_speed = cpu_load.smt_speed
    busy_threads = cpu_load.busy_threads
    computing_share = cpu_load.computing_share
    load_cost = cpu_load.load_cost
    worker_sharing_cost = cpu_load.worker_sharing_cost
    cpu_slowed = cpu_load.cpu_slowed
    load_costs = cpu_load.load_costs
    at_load = cpu_load.at_load
    cpu_second_cost = cpu_load.cpu_second_cost

    # Samples/s (throughput_rates.py)
    rate = throughput_rates.rate
    _rate = throughput_rates.rate_at_own_costs
    speedup = throughput_rates.speedup
    cpu_rate = throughput_rates.cpu_rate
    pipeline_rate = throughput_rates.pipeline_rate
    compute_rate = throughput_rates.compute_rate
    shared_cores_rate = throughput_rates.shared_cores_rate
    queued_rate = throughput_rates.queued_rate
    queued_cpu_s = throughput_rates.queued_cpu_s
    stage_capacity = throughput_rates.stage_capacity

    @property
    def compute_priced_apart(self) -> bool:
        """Whether the training process's own work is priced at its own load cost (``COMPUTE_TIME_SHARING_COST``):
        it computes on the CPU and its time was measured, not given for the target (plan --step-ms)."""
        return self.compute_on_cpu and self.compute_priced

    @property
    def threads_per_core(self) -> float:
        """Hardware threads per core of the usable CPUs (1 where each is a core of its own)."""
        return self.usable_cpus / self.physical_cores if self.physical_cores else 1.0


@dataclass(frozen=True)
class CapacityReport:
    model: ThroughputModel | None
    stage_samples_per_s: dict[str, float | None] = field(default_factory=dict)
    pipeline_samples_per_s: float | None = None
    predicted_samples_per_s: float | None = None


def capacity_report(model: ThroughputModel | None) -> CapacityReport:
    if model is None:
        return CapacityReport(None)
    return CapacityReport(model, model.stage_capacity(), model.pipeline_rate(), model.rate())
