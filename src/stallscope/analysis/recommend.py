"""Ranked changes, each with the exact edit and a speedup predicted by the throughput model.

Predictions are ratios of the model's rates (new configuration over current), so a constant bias
of the model cancels. The model is in ``capacity.py``. A recommendation is data: its id, stage,
predicted speedup, the ``--set`` overrides when it is a configuration change, and the figures behind
it; ``render/words/recommendations.py`` says it in words.
"""

from __future__ import annotations

import dataclasses
import math

from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.epochs import (
    EpochShape,
    best_over_epochs,
    best_queue_over_epochs,
    epoch_cost,
    rate_over_epochs,
    spawned,
)
from stallscope.analysis.findings import (
    LoaderSummary,
    NotRecommended,
    Recommendation,
    StepStats,
    WorkerPipeline,
)
from stallscope.analysis.fixes import FIXES, MAX_NORMALIZE_CUT, advise
from stallscope.analysis.sample_costs import OVERSUBSCRIBED_THREAD_COST, RECEIVED_BATCH_READS
from stallscope.analysis.store_requests import BACKGROUND_SHARE, NETWORK_SHARE, RequestStats
from stallscope.analysis.system_metrics import OTHER_LOAD_NOTABLE_CPUS
from stallscope.analysis.throughput_rates import THREADED_OCCUPANCY

MIN_GAIN = 1.05
#: Code changes are predicted under an assumption (the stage gets twice as cheap); a configuration change
#: is predicted from measured costs alone. Ranking discounts the former so a comparable measured fix wins.
SPECULATIVE_DISCOUNT = 0.8
#: The most threads advised for fetching one batch's objects at once: past a few, the worker's interpreter (the
#: client's CPU runs one thread at a time) and the store's per-client limits decide, not the latency.
MAX_REQUEST_THREADS = 8
#: The connections fsspec's S3 client keeps by default (aiobotocore's ``max_pool_connections``): how many of a
#: batch's objects one ``fs.cat(paths)`` reads at once.
FSSPEC_CONNECTIONS = 10
#: More threads are advised for a batch's requests only where they would be this many times those a fetch already
#: overlaps (a pool the dataset runs itself).
NEW_THREADS_MARGIN = 1.5
#: Shards at most this many times larger, and no larger than this (MosaicML Streaming's default ``size_limit`` is
#: 64 MiB): a larger shard is a longer first wait and a coarser shuffle.
MAX_SHARD_FACTOR, MAX_SHARD_BYTES = 16, 1 << 27
#: A shard large enough that reading its body takes this many times its latency.
LATENCY_FACTOR = 4
#: CPU seconds a client or a server spends per byte of a body (reading it from a socket, writing it to a file or
#: another socket): the rest of their CPU is paid per request, and larger shards divide that part (calibration:
#: req-cpu-per-byte).
CPU_S_PER_BODY_BYTE = 0.2e-9
NORMALIZE_CALLS = ("ToTensor", "Normalize", "ConvertImageDtype", "ToDtype", "F.to_tensor", "F.normalize")


def waits_on_storage(model: ThroughputModel) -> bool:
    """Workers spend more of a sample blocked on storage than on everything else: more of them than cores pay."""
    return model.cost_s.get("storage", 0.0) > sum(v for k, v in model.cost_s.items() if k != "storage")


def worker_candidates(model: ThroughputModel, usable_cpus: float) -> list[int]:
    """Worker counts worth predicting: up to the cores and two more, far more when waiting on storage dominates."""
    ceiling = int(min(32, max(4 * usable_cpus, 8) if waits_on_storage(model) else usable_cpus + 2))
    return list(range(1, ceiling + 1))


def _load_facts(model: ThroughputModel, workers: int) -> dict[str, float]:
    """What a CPU second is estimated to cost with ``workers`` against the recorded run, the threads per usable
    CPU that load is (above one, they take turns on the cores) and the share of the time the training computes on
    the CPU beside the workers."""
    costs = model.load_costs(workers)
    priced = model.at_load(workers, costs=costs)
    rate = priced.rate(workers)
    busy = priced.busy_threads(workers, None, rate)
    facts = {"cpu_second_cost": round(costs[0], 3),
             "busy_threads_per_cpu": round(busy / model.usable_cpus, 2) if model.usable_cpus > 0 else 0.0,
             # the share of the time the training computes on the CPU beside the workers (COMPUTE_NEIGHBOUR_COST)
             "computing_beside_workers": round(priced.computing_share(workers, rate), 2)}
    if model.compute_priced_apart:  # the training process's own CPU work (COMPUTE_TIME_SHARING_COST)
        facts["compute_cpu_second_cost"] = round(costs[1], 3)
    return facts


def best_worker_count(model: ThroughputModel, usable_cpus: float,
                      candidates: list[int] | None = None) -> tuple[int, float]:
    """The smallest worker count within 2% of the best predicted rate (among ``candidates``, by default
    ``worker_candidates``), and its speedup."""
    rates = {w: model.rate(workers=w) for w in (candidates or worker_candidates(model, usable_cpus))}
    top = max(rates.values())
    choice = min(w for w, r in rates.items() if r >= 0.98 * top)
    return choice, rates[choice] / model.rate()


def recommend(verdict: str, stats: StepStats, train: LoaderSummary | None, seconds: dict[str, float],
              usable_cpus: int, startup_s: float = 0.0, model: ThroughputModel | None = None,
              transfer_unpinned_fraction: float | None = None, epochs: EpochShape | None = None,
              other_cpus: float = 0.0, connection_before_fork: bool = False) -> list[Recommendation]:
    """``epochs``: how the training loader's epochs fall in the measured steps, where they start inside them
    (``epochs.py``); worker counts are then predicted over those epoch starts, not at the steady rate alone.
    ``other_cpus``: the CPUs other programs kept busy (``model`` has them taken off already), said where they are
    why no change helps. ``connection_before_fork``: forked workers used a connection the training process opened
    (pitfall ``connection-before-fork``): more than one worker is advised spawned, each with its own client, and
    priced with spawn's start-up."""
    recs: list[Recommendation] = []
    if verdict == "compute-bound":
        total = sum(seconds.values()) or 1.0
        sync, compute = seconds.get("sync", 0.0) / total, seconds.get("compute", 0.0) / total
        recs.append(advise("no-input-fix", None,
                           facts={"data_wait_fraction": stats.data_wait_fraction,
                                  **({"sync_share": round(sync, 4)} if sync > compute else {})}))
    if train is None or verdict == "unknown":
        return recs
    config = train.config
    workers = int(config.get("num_workers") or 0)
    pipeline = train.pipeline
    input_side = verdict != "compute-bound"
    best_workers = workers
    if model is not None and input_side:
        best_workers, gain = best_worker_count(model, model.usable_cpus)
        change: dict[str, object] = {"num_workers": best_workers}
        over_epochs: dict[str, object] = {}
        if epochs is not None:
            shape = spawned(epochs, config.get("torch_import_s")) if connection_before_fork else epochs
            best_workers, keep_alive, priced, gain = best_queue_over_epochs(
                model, shape, worker_candidates(model, model.usable_cpus), workers)
            if shape is not epochs:  # against the epochs as they are started now
                gain = (rate_over_epochs(model, priced, best_workers, keep_alive)
                        / max(rate_over_epochs(model, epochs, workers, epochs.persistent), 1e-9))
            change = {"num_workers": best_workers}
            if keep_alive and not epochs.persistent:
                change["persistent_workers"] = True
            if priced.prefetch_factor != epochs.prefetch_factor:
                change["prefetch_factor"] = priced.prefetch_factor
            cost = epoch_cost(model, priced, best_workers, keep_alive)
            now = epoch_cost(model, epochs, workers, epochs.persistent)
            over_epochs = {"epoch_starts": epochs.restarts, "epoch_cost_s": cost.total_s,
                           "epoch_cost_now_s": now.total_s, "epoch_start_now_s": now.start_s,
                           "epoch_stop_now_s": now.stop_s,
                           "epoch_start_s": cost.start_s, "epoch_fill_s": cost.fill_s,
                           "epoch_dropped_s": cost.dropped_s, "epoch_stop_s": cost.stop_s,
                           "epoch_warmup_s": cost.warmup_s, "warmup_batches": epochs.warmup_batches,
                           "warmup_basis": epochs.warmup_basis,
                           "worker_start_s": epochs.worker_start_s, "worker_start_basis": epochs.start_basis,
                           "worker_stop_s": epochs.worker_stop_s, "worker_stop_basis": epochs.stop_basis,
                           "left_early": epochs.left_early, "prefetch_factor": priced.prefetch_factor,
                           "prefetch_factor_now": epochs.prefetch_factor,
                           "steady_speedup": round(model.speedup(best_workers), 2)}
        if connection_before_fork and best_workers > 1:
            change["multiprocessing_context"] = "spawn"
            over_epochs["connection_before_fork"] = True
        if best_workers != workers and gain >= MIN_GAIN:
            recs.append(advise(
                "num-workers", round(gain, 2), change,
                {**over_epochs,
                 "workers": workers, "usable_cpus": usable_cpus, "loader_s_per_sample": sum(model.cost_s.values()),
                 "blocked_s_per_sample": model.cost_s.get("storage", 0.0),
                 "compute_s_per_sample": model.compute_per_sample_s,
                 **({"shared_memory_s_per_sample": model.shm_write_per_sample_s + model.shm_read_s(),
                     "shared_memory_basis": model.worker_only_basis,
                     "shared_memory_reads": RECEIVED_BATCH_READS if model.compute_on_cpu else 1.0}
                    if model.worker_only_basis else {}),
                 **({"threads_per_core": round(model.threads_per_core, 2)} if model.physical_cores else {}),
                 **_load_facts(model, best_workers)}))
        elif workers > usable_cpus + 1 and best_workers < workers:
            recs.append(advise("fewer-workers", round(max(gain, 1.0), 2), {"num_workers": best_workers},
                               {"workers": workers, "usable_cpus": usable_cpus}))
        split = _split_the_cores(model, workers, epochs, max(gain, 1.0) if best_workers != workers else 1.0)
        if split is not None:
            recs.append(split)
    if input_side and pipeline is not None and workers > 0:
        rebuilt = len(train.ids) > 1  # a new DataLoader every epoch: persistent_workers cannot keep its workers
        persistent_advised = any(r.overrides.get("persistent_workers") for r in recs if r.id != "split-the-cores")
        if epochs is not None and model is not None and not rebuilt:
            # Kept alive, the workers still refill their queue at every epoch and finish what was in flight when
            # the loop broke out: priced over the same epoch starts as the worker counts above, so the two agree.
            gain = (rate_over_epochs(model, epochs, workers, True)
                    / max(rate_over_epochs(model, epochs, workers, False), 1e-9))
            wanted = not config.get("persistent_workers") and gain >= MIN_GAIN
        else:
            gain = stats.wall_s / max(stats.wall_s - startup_s, 1e-9)
            wanted = ((rebuilt or not config.get("persistent_workers")) and train.epochs > 1
                      and startup_s / max(stats.wall_s, 1e-9) > 0.03)
        if wanted and not persistent_advised:
            per_start = sum(pipeline.startup_s) / max(1, len(pipeline.startup_s))
            facts = {"startup_s_per_worker": per_start, "epochs": train.epochs, "restart_wait_s": startup_s}
            if rebuilt:
                recs.append(advise("build-loader-once", round(gain, 2),
                                   facts={**facts, "loaders": len(train.ids), "site": train.site}))
            else:
                recs.append(advise("persistent-workers", round(gain, 2),
                                   {"persistent_workers": True}, facts))
        if model is not None and (pipeline.empty_queue_fraction or 0) > 0.25 \
                and model.pipeline_rate() > 1.15 * model.compute_rate() and model.measured_samples_per_s:
            depth = 2 * int(config.get("prefetch_factor") or 2)
            gain = model.rate() / model.measured_samples_per_s
            if gain >= MIN_GAIN:
                recs.append(advise(
                    "prefetch", round(gain, 2), {"prefetch_factor": depth},
                    {"empty_queue_fraction": pipeline.empty_queue_fraction,
                     "pipeline_samples_per_s": model.pipeline_rate(), "compute_samples_per_s": model.compute_rate()}))
        discarded = _discarded_prefetch(train, model, workers)
        if discarded is not None:
            recs.append(discarded)
    waiting_for_fds = stats.unpickle_s - stats.unpickle_cpu_s
    if input_side and workers > 0 and stats.steady and waiting_for_fds > 0.15 * stats.wall_s \
            and config.get("sharing_strategy", "file_descriptor") != "file_system":
        recs.append(advise("sharing-strategy", None, {"sharing_strategy": "file_system"},
                           {"fd_wait_s": waiting_for_fds, "batches": sum(s.batches for s in stats.steady),
                            "step_time_s": stats.wall_s}))
    if transfer_unpinned_fraction is not None and transfer_unpinned_fraction > 0.5 and seconds.get("transfer", 0) > 0:
        step = sum(seconds.values())
        gain = step / max(step - seconds["transfer"] / 2, 1e-9)
        if gain >= MIN_GAIN:
            recs.append(advise("pin-memory", round(gain, 2), {"pin_memory": True},
                               {"unpinned_fraction": transfer_unpinned_fraction}))
    if verdict == "input-bound" and pipeline is not None:
        recs.extend(r for r in _stage_fixes(seconds, train, model, workers)
                    if r.predicted_speedup is None or r.predicted_speedup >= MIN_GAIN)
    if model is not None and not any(r.id == "split-the-cores" for r in recs):  # that split cuts the threads too
        if (threads_cut := _threads_for_the_cpus(model, workers)) is not None:
            recs.append(threads_cut)
    if input_side and model is not None and not recs:
        recs.append(_no_predicted_gain(model, workers, epochs, other_cpus, usable_cpus))
    # what no change can do first; but a compute-bound job's own threads' waits before "no input fix"
    first = {"compute-threads": 0} if verdict == "compute-bound" else {}
    recs.sort(key=lambda r: (first.get(r.id, 1 if r.id in ("no-input-fix", "no-predicted-gain") else 2),
                             -_rank_value(r)))
    return recs


def whole_cpus(usable_cpus: float) -> int:
    """The CPUs a worker count is held to, counted whole: the usable CPUs (less what other programs kept busy),
    where others took no more than a quarter of a CPU counted as the whole CPU; at least 1."""
    return max(1, math.floor(usable_cpus + 0.25))


def _split_the_cores(model: ThroughputModel, workers: int, epochs: EpochShape | None,
                     workers_alone: float) -> Recommendation | None:
    """A compute on the CPU that runs intra-op threads on most cores leaves none to workers, and workers beside it
    hold its threads back at every parallel region: fewer threads for the compute (``torch_threads``) and workers
    on the cores it gives up. Recommended where the best such split is predicted to gain 5% over the current
    setting and 5% over the best worker count alone (``workers_alone``, its speedup)."""
    threads = model.compute_threads
    if not model.compute_on_cpu or not threads or threads < 2 or model.main_occupancy <= THREADED_OCCUPANCY:
        return None
    if model.main_occupancy > threads + 0.5:  # more cores busy than torch's threads: another library's threads
        return None
    candidates = worker_candidates(model, model.usable_cpus)
    io_heavy = waits_on_storage(model)
    now = rate_over_epochs(model, epochs, workers, epochs.persistent) if epochs is not None else model.rate()
    best: tuple[float, int, int, bool, ThroughputModel] | None = None
    for fewer in reversed(range(1, min(threads, math.ceil(model.main_occupancy)))):
        split = model.with_compute_threads(fewer)
        # no more workers than CPUs, unless they mostly wait on storage: a split shares the cores out, and torch
        # itself warns of more workers than CPUs (a single compute thread beside them only takes turns). The CPUs
        # counted whole: other programs' few percent of a CPU (1.97 of 2 usable) do not take a worker's place.
        within = candidates if io_heavy else [c for c in candidates if c <= whole_cpus(model.usable_cpus)]
        if epochs is not None:
            count, keep, _ = best_over_epochs(split, epochs, within, workers)
            rate = rate_over_epochs(split, epochs, count, keep)
        else:
            count, _ = best_worker_count(split, split.usable_cpus, within)
            keep, rate = False, split.rate(count)
        if best is None or rate > 1.02 * best[0]:  # fewer threads only where they gain: the compute keeps more
            best = (rate, fewer, count, keep, split)
    if best is None or now <= 0:
        return None
    rate, fewer, count, keep, split = best
    gain = rate / now
    if count <= 0 or gain < MIN_GAIN or gain < MIN_GAIN * workers_alone:
        return None
    change: dict[str, object] = {"torch_threads": fewer, "num_workers": count}
    if keep and epochs is not None and not epochs.persistent:
        change["persistent_workers"] = True
    return advise("split-the-cores", round(gain, 2), change, {
        "torch_threads": threads, "main_occupancy": round(model.main_occupancy, 2),
        "usable_cpus": round(model.usable_cpus, 2), "workers": workers,
        "compute_s_per_sample": model.compute_per_sample_s, "split_compute_s_per_sample": split.compute_per_sample_s,
        "workers_alone_speedup": round(workers_alone, 2), **_load_facts(split, count)})


def _threads_for_the_cpus(model: ThroughputModel, workers: int) -> Recommendation | None:
    """A CPU compute recorded with more intra-op threads than usable CPUs (torch counts the machine's cores, not a
    container's share of them) waits at every parallel region for the threads that have no CPU
    (``OVERSUBSCRIBED_THREAD_COST``): as many threads as whole CPUs, with the workers as they are, where that is
    predicted to gain 5%. Where the cores are also to be split with workers, ``_split_the_cores`` says it."""
    threads = model.compute_threads
    if not model.compute_oversubscribed or not model.compute_on_cpu or not threads:
        return None
    fewer = whole_cpus(model.usable_cpus)
    now = model.rate()
    if fewer >= threads or now <= 0:
        return None
    cut = model.with_compute_threads(fewer)
    gain = cut.rate() / now
    if gain < MIN_GAIN:
        return None
    return advise("compute-threads", round(gain, 2), {"torch_threads": fewer}, {
        "torch_threads": threads, "usable_cpus": round(model.usable_cpus, 2), "workers": workers,
        "compute_s_per_sample": model.compute_per_sample_s, "cut_compute_s_per_sample": cut.compute_per_sample_s,
        "oversubscribed_thread_cost": OVERSUBSCRIBED_THREAD_COST})


def _no_predicted_gain(model: ThroughputModel, workers: int, epochs: EpochShape | None = None,
                       other_cpus: float = 0.0, cpus: int = 0) -> Recommendation:
    """Input-side time was found but no change is predicted to gain 5%: say why (``workers_cause``), so the user is
    not left with a verdict and no next step."""
    return advise("no-predicted-gain", None,
                  facts=workers_cause(model, workers, epochs, other_cpus, cpus))


def workers_cause(model: ThroughputModel, workers: int, epochs: EpochShape | None = None, other_cpus: float = 0.0,
                  cpus: int = 0) -> dict[str, object]:
    """Why no worker count is advised, as facts: ``reason`` ``epoch-starts`` (workers would gain in the steady
    state, but the measured steps start so many epochs that starting and filling them again costs more),
    ``other-load`` (other programs kept ``OTHER_LOAD_NOTABLE_CPUS`` or more of the ``cpus`` busy, and on the CPUs
    they left no count gains, where on a quiet machine one would: ``quiet_workers``, ``quiet_speedup``),
    ``compute-takes-the-cores`` (the training process keeps most cores busy itself: a worker would take its core
    from the compute), ``cpu-budget`` (every core is busy with loading and training already), or
    ``no-better-setting``; with the best count and its predicted speedup."""
    best, gain = best_worker_count(model, model.usable_cpus)
    extra: dict[str, object] = {}
    over_epochs = best_over_epochs(model, epochs, [best], workers) if epochs is not None else None
    quiet = _on_a_quiet_machine(model, cpus) if other_cpus >= OTHER_LOAD_NOTABLE_CPUS else None
    quiet_best = best_worker_count(quiet, quiet.usable_cpus) if quiet is not None else None
    if epochs is not None and over_epochs is not None and gain >= MIN_GAIN and over_epochs[2] < MIN_GAIN:
        cost = epoch_cost(model, epochs, best, over_epochs[1])
        reason = "epoch-starts"
        extra = {"epoch_starts": epochs.restarts, "epoch_cost_s": cost.total_s, "epoch_start_s": cost.start_s,
                 "epoch_fill_s": cost.fill_s, "epoch_dropped_s": cost.dropped_s, "epoch_stop_s": cost.stop_s,
                 "epoch_warmup_s": cost.warmup_s, "samples_per_epoch": epochs.samples / (epochs.restarts + 1)}
    elif quiet_best is not None and quiet_best[1] >= MIN_GAIN:
        reason = "other-load"
        extra = {"other_cpus": round(other_cpus, 2), "cpus": cpus, "quiet_workers": quiet_best[0],
                 "quiet_speedup": round(quiet_best[1], 2)}
    elif model.compute_on_cpu and model.main_occupancy >= 0.75 * model.usable_cpus:
        reason = "compute-takes-the-cores"
    elif workers > 0 and model.cpu_rate() <= 1.05 * model.rate():
        reason = "cpu-budget"
    else:
        reason = "no-better-setting"
    return {"reason": reason, "workers": workers, "best_workers": best, "best_speedup": round(gain, 2),
            "main_occupancy": round(model.main_occupancy, 2), "usable_cpus": round(model.usable_cpus, 2),
            "loader_cpu_s_per_sample": sum(v for k, v in model.cost_s.items() if k != "storage"),
            "compute_s_per_sample": model.compute_per_sample_s, **extra}


def _on_a_quiet_machine(model: ThroughputModel, cpus: int) -> ThroughputModel | None:
    """The model with all ``cpus`` the job's, as if other programs kept none busy (an estimate: the costs stay as
    measured under their load). None where it had them all already."""
    if cpus <= model.usable_cpus:
        return None
    cores = model.physical_cores * cpus / model.usable_cpus if model.physical_cores else None
    return dataclasses.replace(model, usable_cpus=float(cpus), physical_cores=cores)


def not_recommended(verdict: str, train: LoaderSummary | None, model: ThroughputModel | None,
                    recs: list[Recommendation], seconds: dict[str, float], cpus: int, other_cpus: float = 0.0,
                    epochs: EpochShape | None = None) -> list[NotRecommended]:
    """The likely fixes ``recs`` leave out, each with why: more DataLoader workers where the job loads in the
    training process or leaves CPUs without one (``workers_cause``; not where ``no-predicted-gain`` says it
    already), and the limiting input stages' own fixes predicted to gain under ``MIN_GAIN``."""
    if train is None or verdict in ("compute-bound", "unknown"):
        return []
    found: list[NotRecommended] = []
    workers = int(train.config.get("num_workers") or 0)
    said = any("num_workers" in r.overrides or r.id == "no-predicted-gain" for r in recs)
    if model is not None and workers < whole_cpus(cpus) and not said:
        facts = workers_cause(model, workers, epochs, other_cpus, cpus)
        found.append(NotRecommended("num-workers", FIXES["num-workers"].stage, str(facts.pop("reason")), facts))
    if verdict == "input-bound" and train.pipeline is not None:
        given = {r.id for r in recs}
        for fix in _stage_fixes(seconds, train, model, workers):
            gain = fix.predicted_speedup
            if fix.id not in given and gain is not None and gain < MIN_GAIN:
                found.append(NotRecommended(fix.id, fix.node, "below-min-gain",
                                            {**fix.facts, "predicted_speedup": gain, "min_gain": MIN_GAIN}))
    return found


def _discarded_prefetch(train: LoaderSummary, model: ThroughputModel | None, workers: int) -> Recommendation | None:
    """Batches the workers loaded that the script never took: a loop that leaves each epoch early
    (``break`` after N batches) makes the next ``iter(loader)`` drop every batch already in flight,
    ``num_workers * prefetch_factor`` of them, so that much loading is thrown away at every epoch."""
    pipeline = train.pipeline
    prefetch = int(train.config.get("prefetch_factor") or 2)
    if pipeline is None or model is None or prefetch <= 1 or train.epochs < 2 or not train.batches:
        return None
    in_flight = workers * prefetch  # the last epoch's queue, left when the run ended: not a recurring loss
    wasted = pipeline.batches - train.batches - in_flight
    if wasted < 0.1 * pipeline.batches:
        return None
    old = pipeline.batches / train.batches  # batches loaded per batch used
    new = (train.batches + (wasted + in_flight) / prefetch) / train.batches  # waste shrinks with the queue
    stages = ("decode", "transform", "loader", "storage")
    gain = model.rate(scale=dict.fromkeys(stages, new)) / model.rate(scale=dict.fromkeys(stages, old))
    if gain < MIN_GAIN:
        return None
    return advise(
        "discarded-prefetch", round(gain, 2), {"prefetch_factor": 1},
        {"loaded_batches": pipeline.batches, "used_batches": train.batches, "dropped_batches": wasted,
         "restarts": train.epochs - 1, "in_flight": in_flight, "workers": workers, "prefetch_factor": prefetch})


def _rank_value(rec: Recommendation) -> float:
    gain = rec.predicted_speedup or 0.0
    return gain if rec.overrides else gain * SPECULATIVE_DISCOUNT


def normalize_fraction(pipeline: WorkerPipeline | None) -> float:
    """The share of the transform stage spent converting and normalizing (what uint8-to-device removes)."""
    if pipeline is None:
        return 0.0
    transform_s = pipeline.node_s.get("transform", 0.0) or 1e-9
    return sum(v for k, v in pipeline.by_call.items() if k in NORMALIZE_CALLS) / transform_s


def calls_of(pipeline: WorkerPipeline, node: str) -> list[str]:
    """The timed calls of one stage, costliest first: what a stage's advice may cite (a decode call is no
    augmentation to make cheaper, however costly)."""
    return [name for name in pipeline.by_call if pipeline.call_node.get(name) == node]


def _gain(model: ThroughputModel | None, workers: int, scale: dict[str, float], fallback: float) -> float:
    if model is None:
        return fallback
    return round(model.rate(workers=workers, scale=scale) / model.rate(), 2)


def _stage_fixes(seconds: dict[str, float], train: LoaderSummary, model: ThroughputModel | None,
                 workers: int) -> list[Recommendation]:
    """The fixes of the two costliest input stages, each priced by the catalogue's scale of its stage."""
    pipeline = train.pipeline
    assert pipeline is not None  # both callers check it first
    total = sum(seconds.values()) or 1.0
    ranked = sorted(("storage", "decode", "transform", "loader"), key=lambda n: -seconds.get(n, 0.0))
    recs: list[Recommendation] = []

    def priced(fix_id: str, halved: float, facts: dict[str, object], normalize: float = 0.0) -> Recommendation:
        fix = FIXES[fix_id]
        return fix.advise(_gain(model, workers, fix.scaled(normalize), halved), facts=facts)

    for node in ranked[:2]:
        share = seconds.get(node, 0.0) / total
        if share < 0.15:
            continue
        halved = round(1.0 / (1.0 - share / 2), 2)
        if node == "decode":
            crop = train.config.get("crop")
            recs.append(priced("reduced-size-decode", halved, {"share": share, **({"crop": crop} if crop else {})}))
        elif node == "transform":
            cut = min(MAX_NORMALIZE_CUT, normalize_fraction(pipeline))
            if cut > 0.1:
                recs.append(priced("uint8-device-normalize", halved, {"normalize_fraction": cut}, cut))
            # transform's time is its timed calls' (torchvision's transforms, image operations) or, outside any, the
            # dataset's own Python: the advice follows whichever holds most of it
            transform_calls = calls_of(pipeline, node)
            transform_s = pipeline.node_s.get(node, 0.0)
            in_calls = min(1.0, sum(pipeline.by_call[c] for c in transform_calls) / transform_s) if transform_s else 0.0
            if in_calls < 0.5:
                recs.append(priced("dataset-code", halved, {"share": share, "transform_in_calls_fraction": in_calls}))
            else:
                recs.append(priced("cheaper-transforms", halved,
                                   {"share": share, "costliest_calls": transform_calls[:3]}))
        elif node == "storage":
            requests = pipeline.requests
            if requests is not None and requests.network_share >= NETWORK_SHARE:
                advice = network_fix(requests, model, workers, share)
                if advice is not None:
                    recs.append(advice)
            else:
                recs.append(priced("pack-dataset", halved, {"share": share, "blocked_s": pipeline.blocked_s}))
        else:
            recs.append(priced("cheaper-collate", halved, {"share": share}))
    return recs


def network_fix(requests: RequestStats, model: ThroughputModel | None, workers: int,
                share: float) -> Recommendation | None:
    """Storage that is requests: a download library's shards where its threads made them, else more requests in
    flight from the dataset's own calls (threads the dataset starts itself, a pool in ``__getitems__``, included)."""
    if requests.background_share >= BACKGROUND_SHARE and requests.library:
        return _larger_shards(requests, model, workers, share)
    return _requests_in_flight(requests, model, workers, share)


def _requests_in_flight(requests: RequestStats, model: ThroughputModel | None, workers: int,
                        share: float) -> Recommendation | None:
    """Data on the network (an object store): more requests in flight from each worker, a batch's objects fetched
    on threads, priced by cutting the requests' latency and body time (not the client's CPU, which the threads
    share) by the thread count; packing files into shards is not the advice for data that lives in a bucket.
    Through fsspec (s3fs, gcsfs) the batch is one ``fs.cat(paths)``: all its objects at once, as many as the client's
    connection pool holds (each object's requests, a HEAD and its GET, one after the other)."""
    batch = requests.per_sample * (requests.samples / max(1, requests.batches))
    threads = max(2, min(MAX_REQUEST_THREADS, math.floor(batch)))
    if requests.client == "fsspec":
        objects = (requests.bodies or requests.requests) / max(1, requests.batches)
        threads = max(2, min(FSSPEC_CONNECTIONS, math.floor(objects)))
    if batch < 2:
        return None
    network_s = requests.first_byte_s + requests.connect_s + requests.body_s
    # the fetches' whole wait for their requests: blocked, and the CPU of the pool's threads meanwhile
    blocked_s = (model.cost_s.get("storage", 0.0) * requests.samples + requests.download_cpu_s
                 if model is not None else 0.0)
    # requests a fetch already overlaps (a pool of the dataset's own): the threads advised add only the rest
    concurrent = max(1.0, network_s / blocked_s) if blocked_s > 0 else max(1.0, requests.in_flight)
    if threads < NEW_THREADS_MARGIN * concurrent:
        return None
    kept = 1.0 - (network_s / concurrent) * (1 - concurrent / threads) / blocked_s if blocked_s > 0 else 1.0
    scale = {"storage": max(0.0, kept), "storage_cpu": 1.0}
    fallback = round(1.0 / (1.0 - share * (1 - concurrent / threads)), 2)
    facts = {"threads": threads, "requests_per_sample": requests.per_sample, "latency_ms": 1e3 * requests.latency_s,
             "request_ms": 1e3 * requests.request_s, "in_flight": requests.in_flight, "bound": requests.bound,
             "share": share, "client": requests.client, "connections": threads, "concurrent": concurrent}
    return advise("requests-in-flight", _gain(model, workers, scale, fallback), facts=facts)


def _after_fewer_requests(cpu_s: float, body_bytes: float, factor: float) -> float:
    """``cpu_s`` (per sample) with its per-request part divided by ``factor``; its per-body-byte part stays."""
    per_byte = min(cpu_s, CPU_S_PER_BODY_BYTE * body_bytes)
    return per_byte + (cpu_s - per_byte) / factor


def _larger_shards_cpu(model: ThroughputModel, requests: RequestStats, factor: float, kept: float,
                       scale: dict[str, float]) -> tuple[ThroughputModel, dict[str, float]]:
    """The CPU larger shards leave: the client's and the local servers' per-request work divided by the size factor
    (their per-byte work stays), and the download threads' CPU the batches waited on waited on as much less as the
    latency (their thread then works ahead of the batches, on a core beside them: out of the worker's own time, still
    in the CPU budget)."""
    body_per_sample = requests.body_bytes / requests.samples
    client = model.cost_s.get("storage_cpu", 0.0)
    after = _after_fewer_requests(client, body_per_sample, factor)
    downloads = min(client, requests.download_cpu_s / requests.samples) * (after / client if client > 0 else 0.0)
    waited = downloads * (1.0 - kept)
    if client > 0:
        scale = {**scale, "storage_cpu": max(0.0, after - waited) / client}
    servers = model.server_cpu_per_sample_s
    servers_after = _after_fewer_requests(servers, body_per_sample, factor)
    helper = model.helper_cpu_per_sample_s - servers + servers_after + waited
    return dataclasses.replace(model, helper_cpu_per_sample_s=helper, server_cpu_per_sample_s=servers_after), scale


def _larger_shards(requests: RequestStats, model: ThroughputModel | None, workers: int,
                   share: float) -> Recommendation | None:
    """Downloads on a streaming library's own threads (one shard at a time per worker, as MosaicML Streaming's
    are): threads in the dataset would not add requests in flight, more workers do (``num-workers``), and each
    request's latency is paid once a shard, so larger shards cut it. Priced by the requests' latency seconds cut
    by the size factor, their bodies unchanged; None where the requests are not latency-bound."""
    if requests.bound != "latency" or requests.requests <= 0 or requests.body_bytes <= 0:
        return None
    size = requests.bytes_per_body  # a shard's size: a HEAD before each download has no body
    rate = requests.body_bytes_per_s or size / max(requests.request_s, 1e-9)
    # a request whose body takes LATENCY_FACTOR times its latency pays the latency on a fifth of its time
    factor = max(2, min(MAX_SHARD_FACTOR, math.ceil(LATENCY_FACTOR * requests.latency_s * rate / size),
                        math.floor(MAX_SHARD_BYTES / size)))
    if size * 2 > MAX_SHARD_BYTES:  # already as large as advised
        return None
    latency_s = requests.first_byte_s + requests.connect_s
    blocked_s = model.cost_s.get("storage", 0.0) * requests.samples if model is not None else 0.0
    kept = max(0.0, 1.0 - (latency_s * (1 - 1 / factor)) / blocked_s if blocked_s > 0 else 1.0)
    scale = {"storage": kept, "storage_cpu": 1.0}
    priced = model
    if model is not None and requests.samples:
        priced, scale = _larger_shards_cpu(model, requests, factor, kept, scale)
    fallback = round(1.0 / (1.0 - share * (1 - 1 / factor)), 2)
    facts = {"factor": factor, "shard_bytes": size, "target_bytes": size * factor, "library": requests.library,
             "latency_ms": 1e3 * requests.latency_s, "request_ms": 1e3 * requests.request_s,
             "background_share": requests.background_share, "in_flight": requests.in_flight, "share": share}
    gain = fallback if model is None or priced is None else round(priced.rate(workers, scale) / model.rate(), 2)
    return advise("larger-shards", gain, facts=facts)
