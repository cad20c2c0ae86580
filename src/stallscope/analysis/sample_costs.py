"""What one sample costs the throughput model (``capacity.ThroughputModel``): its input stages, its hand-over from a
worker to the training process, the shared-memory costs only workers bring, and a CPU compute's intra-op threads.

Each input stage costs a measured number of worker-seconds per sample: CPU seconds for decode, transform and loader
(collate), blocked seconds for storage. Taking a batch from a worker is serial time in the training process:
rebuilding it (CPU) and waiting for the worker to hand over its tensors' file descriptors. A worker collates each
batch into a fresh shared-memory segment that the training process maps again, both paying page faults an
in-process batch never does: a run with workers measures them, a 0-worker run has them estimated from its batches'
bytes (``worker_only_costs``). These functions are the model's methods of the same names (bound in ``capacity.py``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stallscope.analysis.capacity import ThroughputModel

#: The input stages that burn a worker's CPU; ``storage`` is the time it spends blocked, ``storage_cpu`` the CPU of
#: storage's own calls (an object-store client signing requests, parsing answers, checksumming bodies), scaled with
#: ``storage`` unless a scale names it.
CPU_STAGES = ("decode", "transform", "loader", "storage_cpu")
#: Seconds per byte to fill a fresh shared-memory segment, and to map it again, read it once and free it, over
#: ordinary memory: for a run whose recorder could not measure them at exit (calibration: cap-shm-typical).
TYPICAL_SHM_WRITE_S_PER_BYTE = 0.72e-9
TYPICAL_SHM_READ_S_PER_BYTE = 0.29e-9
#: Times a training step on the CPU pays the one-pass cost of reading a batch that a worker wrote into shared memory:
#: it passes over its input more than once, and over another process's pages dearly (calibration:
#: cap-received-batch-reads). A copy to a GPU reads the batch once.
RECEIVED_BATCH_READS = 4.0
#: One-thread times a CPU compute takes longer for each intra-op thread beyond the CPUs it may use: each parallel
#: region waits for the threads that lost their CPU (calibration: cap-oversubscribed-thread).
OVERSUBSCRIBED_THREAD_COST = 0.55
#: Threads beyond the CPUs priced at most, as far as measured: a compute recorded with more is credited no more
#: (calibration: cap-oversubscribed-threads-priced).
OVERSUBSCRIBED_THREADS_PRICED = 3.0


def stage_costs(model: ThroughputModel, scale: dict[str, float] | None,
                workers: int | None = None) -> tuple[float, float]:
    """A worker's CPU and blocked seconds per sample, the stages scaled by ``scale``; the collate into shared
    memory estimated for a 0-worker run counts only where there are workers."""
    scale = scale or {}
    workers = model.workers if workers is None else workers
    cpu = sum(model.cost_s.get(n, 0.0) * scale.get(n, scale.get("storage", 1.0) if n == "storage_cpu" else 1.0)
              for n in CPU_STAGES)
    if workers > 0:
        cpu += model.shm_write_per_sample_s * scale.get("loader", 1.0)
    blocked = model.cost_s.get("storage", 0.0) * scale.get("storage", 1.0)
    return cpu, blocked


def receive_s(model: ThroughputModel, workers: int | None = None, scale: dict[str, float] | None = None) -> float:
    """The training process's serial time per sample taking batches from workers (none without them): rebuilding
    them, waiting for the sender to hand them over, and mapping them."""
    workers = model.workers if workers is None else workers
    if workers <= 0:
        return 0.0
    return model.receive_cpu_s() + model.handover_wait_s(workers, scale) + model.shm_read_s()


def shm_read_s(model: ThroughputModel) -> float:
    """The training process's side of a batch passed through shared memory, per sample, where estimated for a
    0-worker run. Read from ``compute_on_cpu`` as priced, so a CPU recording planned for a GPU pays one pass."""
    return model.shm_read_per_sample_s * (RECEIVED_BATCH_READS if model.compute_on_cpu else 1.0)


def receive_cpu_s(model: ThroughputModel) -> float:
    """The CPU part of receiving a batch, per sample (rebuilding it)."""
    recorded = model.receive_cpu_per_sample_s
    return model.receive_per_sample_s if recorded is None else min(recorded, model.receive_per_sample_s)


def handover_wait_s(model: ThroughputModel, workers: int | None = None,
                    scale: dict[str, float] | None = None) -> float:
    """The waiting part of ``receive_s``: a worker hands over a batch's descriptors only once it lets go of the GIL,
    so the wait is for a busy worker. It scales as W / W' with W' workers (each is asked less often), and with a
    worker's CPU work where ``scale`` changes it (calibration: cap-handover-wait)."""
    workers = model.workers if workers is None else workers
    if workers <= 0:
        return 0.0
    waited = max(0.0, model.receive_per_sample_s - model.receive_cpu_s())
    if model.workers > 0:
        waited *= model.workers / workers
    if scale:
        recorded, _ = model.costs(None, model.workers)
        changed, _ = model.costs(scale, model.workers)
        waited *= changed / recorded if recorded > 0 else 1.0
    return waited


def working_cpu_s(model: ThroughputModel) -> float:
    """The training process's CPU per sample that loads the cores when it loads its batches itself (0 workers): its
    compute's, on no more cores than it kept busy nor than its intra-op threads. What those threads spun waiting
    for work while the process loaded (OpenMP's wait) is in ``main_cpu_per_sample_s`` but loads no core."""
    if not model.compute_on_cpu:
        return model.main_cpu_per_sample_s
    cores = min(model.main_occupancy, float(model.compute_threads)) if model.compute_threads else model.main_occupancy
    return min(model.main_cpu_per_sample_s, model.compute_per_sample_s * max(1.0, cores))


def threads_outnumber_cpus(threads: int | None, cpus: float) -> bool:
    """Whether a compute's intra-op threads are more than the CPUs it may use (by half a CPU: a quota of 1.97 CPUs
    is two), so that its parallel regions wait for the threads without one (``OVERSUBSCRIBED_THREAD_COST``)."""
    return threads is not None and threads > cpus + 0.5


def oversubscription_cost(threads: float, cpus: float) -> float:
    """How many one-thread times a CPU compute on ``threads`` intra-op threads takes on ``cpus`` CPUs (1 where they
    do not outnumber them)."""
    extra = min(max(0.0, threads - cpus), OVERSUBSCRIBED_THREADS_PRICED)
    return 1.0 + OVERSUBSCRIBED_THREAD_COST * extra


def one_thread_compute_s(model: ThroughputModel) -> float:
    """The compute's time per sample on one thread, for a compute recorded with more threads than usable CPUs
    (``compute_oversubscribed``); the recorded time otherwise."""
    if not (model.compute_oversubscribed and model.compute_threads):
        return model.compute_per_sample_s
    return model.compute_per_sample_s / oversubscription_cost(model.compute_threads, model.usable_cpus)


def with_compute_threads(model: ThroughputModel, threads: int) -> ThroughputModel:
    """The model with a CPU compute on ``threads`` intra-op threads (``--set torch_threads``): its CPU work stays, so
    fewer threads take longer by the occupancy they lose, except that one recorded with more threads than CPUs and
    cut to them loses its waits for a CPU. Unchanged on a GPU, unrecorded, or for no fewer threads than it used."""
    occupancy = model.main_occupancy
    if not model.compute_on_cpu or model.compute_threads is None or threads <= 0:
        return model
    if model.compute_oversubscribed and threads < model.compute_threads and threads <= model.usable_cpus + 1e-9:
        compute = model.one_thread_compute_s() / threads  # no more threads than CPUs: ideal speed-up
        main_cpu = min(model.main_cpu_per_sample_s, compute * threads + model.receive_cpu_s())
        return dataclasses.replace(model, compute_per_sample_s=compute, main_cpu_per_sample_s=main_cpu,
                                   main_occupancy=float(threads), compute_threads=threads,
                                   compute_oversubscribed=False)
    if threads >= occupancy:
        return model
    compute = model.compute_per_sample_s * occupancy / threads
    # ``threads`` threads computing for ``compute`` seconds burn no more CPU than that: what the recorded threads
    # burned beyond it was theirs waiting for work (OpenMP's spin), gone with them
    main_cpu = min(model.main_cpu_per_sample_s, compute * threads + model.receive_cpu_s())
    return dataclasses.replace(model, compute_per_sample_s=compute, main_cpu_per_sample_s=main_cpu,
                               main_occupancy=float(threads), compute_threads=threads)


def worker_only_costs(bytes_per_sample: float, calibration: dict | None) -> tuple[float, float, str]:
    """Seconds per sample to write a batch into shared memory and to map it again, and their basis: the recorder's
    figures measured at the run's exit (``Session.calibrations``), or the typical ones."""
    calibration = calibration or {}
    nbytes = calibration.get("nbytes") or 0
    if nbytes > 0:
        write = calibration.get("write_extra_ns", 0) / 1e9 / nbytes
        read = calibration.get("read_extra_ns", 0) / 1e9 / nbytes
        basis = "measured at exit"
    else:
        write, read, basis = TYPICAL_SHM_WRITE_S_PER_BYTE, TYPICAL_SHM_READ_S_PER_BYTE, "typical"
    return bytes_per_sample * write, bytes_per_sample * read, basis
