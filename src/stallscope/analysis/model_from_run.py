"""The throughput model (``capacity.ThroughputModel``) built from what a run measured: its steady steps, its input
pipeline's per-stage costs, the training process's CPU, and the shared-memory figures the recorder took at exit.

The costs are taken at full core speed (workers that kept more threads busy than cores measured them slowed by
shared hardware threads, ``_at_full_core_speed``) and stamped with the load they were measured under, so that the
recorded configuration predicts what the model says for it and every other one is priced against it.
"""

from __future__ import annotations

import dataclasses

from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.findings import LoaderSummary, StepStats, WorkerPipeline
from stallscope.analysis.sample_costs import CPU_STAGES, threads_outnumber_cpus, worker_only_costs

#: A memory page: what a fresh shared-memory segment takes a fault for (x86-64 and most arm64 Linux kernels).
PAGE_BYTES = 4096


def build_model(stats: StepStats, train: LoaderSummary | None, usable_cpus: float,
                main_cpu_s: float | None, startup_s: float = 0.0,
                helper_cpu_s: float | None = None, compute_on_cpu: bool = True,
                bytes_per_sample: float | None = None,
                shm_calibration: dict | None = None,
                physical_cores: float | None = None, warmup_share: float = 0.0,
                batch_time_shape: tuple[float, ...] = (), server_cpu_s: float = 0.0) -> ThroughputModel | None:
    """``main_cpu_s``: CPU seconds the training process used over the steady steps (from the sampler);
    ``helper_cpu_s``: those of its child processes that are not DataLoader workers; ``compute_on_cpu``:
    False when the training computes on a GPU; ``bytes_per_sample`` of the batches the loader returns and
    the recorder's ``shm_calibration`` (``Session.calibrations``) price the costs only workers bring;
    ``physical_cores``: the cores ``usable_cpus`` are hardware threads of, where fewer (SMT);
    ``warmup_share``: the share of the workers' CPU that restarted workers spent warming up
    (``EpochShape.warmup_share``), taken out of their steady costs: the epochs' own cost prices it;
    ``batch_time_shape``: the training loader's batch times over their mean (``in_order.batch_time_shape``);
    ``server_cpu_s``: the part of ``helper_cpu_s`` that local servers of the job's requests used."""
    pipeline = train.pipeline if train else None
    steady = stats.steady
    if pipeline is None or not steady or pipeline.samples <= 0 or not stats.samples:
        return None
    cost = {node: seconds / pipeline.samples for node, seconds in pipeline.node_cpu_s.items() if node != "storage"}
    cost["storage"] = pipeline.blocked_s / pipeline.samples
    if pipeline.node_cpu_s.get("storage", 0.0) > 0:  # a client's CPU in storage's calls takes a core like decoding
        cost["storage_cpu"] = pipeline.node_cpu_s["storage"] / pipeline.samples
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
        write, read, basis = worker_only_costs(bytes_per_sample, shm_calibration)
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
                            fresh_pages_per_cpu_s=_fresh_pages_per_cpu_s(pipeline, write, bytes_per_sample),
                            batch_time_shape=batch_time_shape,
                            server_cpu_per_sample_s=server_cpu_s / stats.samples,
                            prefetch_factor=int(train.config.get("prefetch_factor") or 2) if train else 2)
    model = _at_full_core_speed(model)
    # The costs were measured under the run's own load: priced at the model's rate for it, so that the recorded
    # configuration predicts what the model says for it, and every other configuration is priced against it.
    rate = model._rate(workers, None)
    recorded = model.busy_threads(workers, None, rate)
    return dataclasses.replace(model, recorded_load_cost=model.load_cost(recorded),
                               recorded_compute_load_cost=model.load_cost(recorded, compute=True),
                               recorded_computing_share=model.computing_share(workers, rate))


def _at_full_core_speed(model: ThroughputModel) -> ThroughputModel:
    """The model with its CPU costs as a core of its own would run them: workers that kept more threads busy than
    cores measured them slowed by shared hardware threads, which the model applies again wherever it counts CPU. The
    compute's wall time stays, and a run without workers is taken as measured (loading and compute took turns)."""
    if model.physical_cores is None or not model.measured_samples_per_s or model.workers <= 0:
        return model
    worker_cpu, _ = model.costs(None)
    busy = model.measured_samples_per_s * (worker_cpu + model.main_cpu_per_sample_s + model.helper_cpu_per_sample_s)
    speed = model.smt_speed(busy)
    if speed >= 1.0:
        return model
    cost = {node: seconds * speed if node in CPU_STAGES else seconds for node, seconds in model.cost_s.items()}
    return dataclasses.replace(model, cost_s=cost, main_cpu_per_sample_s=model.main_cpu_per_sample_s * speed,
                               helper_cpu_per_sample_s=model.helper_cpu_per_sample_s * speed,
                               server_cpu_per_sample_s=model.server_cpu_per_sample_s * speed)


def _fresh_pages_per_cpu_s(pipeline: WorkerPipeline, shm_write_per_sample_s: float,
                           bytes_per_sample: float | None) -> float | None:
    """Minor page faults per CPU second of the fetches' work (``cpu_load.worker_sharing_cost``); for a 0-worker
    run with the shared-memory segments workers would collate its batches into added, a page each ``PAGE_BYTES``.
    None where the fetches did not count their faults."""
    if pipeline.fresh_pages is None or pipeline.cpu_s <= 0:
        return None
    pages, cpu = float(pipeline.fresh_pages), pipeline.cpu_s
    if pipeline.num_workers == 0 and bytes_per_sample:
        pages += pipeline.samples * bytes_per_sample / PAGE_BYTES
        cpu += pipeline.samples * shm_write_per_sample_s
    return pages / cpu
