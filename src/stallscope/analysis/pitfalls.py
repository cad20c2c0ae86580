"""Known DataLoader pitfalls, each raised only on evidence from this run.

Every pitfall carries the numbers that triggered it (``facts``; ``render/words/pitfalls.py`` says it in words).
None fires on configuration alone when the measurement says it did no harm, except those that break
jobs outright (CUDA in forked workers).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from stallscope.analysis.findings import LoaderSummary
from stallscope.analysis.pipeline import foreign_records
from stallscope.analysis.shm import shm_exhaustion
from stallscope.analysis.system_metrics import SystemSummary
from stallscope.session import Session

MIB = 1 << 20


@dataclass(frozen=True)
class Pitfall:
    id: str
    node: str
    facts: dict[str, Any] = field(default_factory=dict)


def find_pitfalls(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                  usable_cpus: int) -> list[Pitfall]:
    found: list[Pitfall] = []
    for check in (_rss_growth, _shm_headroom, _workers_above_cores, _thread_oversubscription, _unpinnable_batch,
                  _cuda_in_forked_worker, _lmdb_before_fork, _connection_before_fork, _out_of_order_waits,
                  _loader_stalled, _shm_exhausted, _streaming_cache_limit):
        found.extend(check(session, loaders, system, usable_cpus))
    if any(p.id == "shm-exhausted" for p in found):  # the same cause, seen failing: said once
        found = [p for p in found if p.id != "shm-headroom"]
    return found


def agreeing_with(pitfalls: list[Pitfall], recommendations: list[Any]) -> list[Pitfall]:
    """A pitfall whose fix is a worker count takes it from the first recommendation that sets ``num_workers`` (the
    throughput model's count for this job on these CPUs): one owner for the number, so the pitfall and the next
    step never name two counts. Without such a recommendation the pitfall keeps its rule of thumb (the CPUs)."""
    advised = next((r.overrides["num_workers"] for r in recommendations if "num_workers" in r.overrides), None)
    if advised is None:
        return pitfalls
    return [replace(p, facts={**p.facts, "advised_workers": advised}) if p.id == "workers-above-cores" else p
            for p in pitfalls]


def _rss_growth(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                cpus: int) -> list[Pitfall]:
    """Private memory (USS, read every few seconds) shows copy-on-read; resident memory (RSS, read every
    tick) shows plain growth such as a per-worker cache. Either must still be climbing late in the run."""
    by_uss = [w for w in system.workers if w.private_start is not None and w.private_end is not None
              and w.private_end - w.private_start > 64 * MIB and w.private_end > 1.2 * w.private_start
              and (w.private_late_growth or 0) > 32 * MIB]
    by_rss = [w for w in system.workers if w.rss_start is not None and w.rss_end is not None
              and w.rss_end - w.rss_start > 128 * MIB and (w.rss_late_growth or 0) > 64 * MIB]
    if not by_uss and not by_rss:
        return []
    if by_uss:
        worst = max(by_uss, key=lambda w: (w.private_end or 0) - (w.private_start or 0))  # both present, as filtered
        facts = {"memory": "private", "pid": worst.pid, "start_bytes": worst.private_start,
                 "end_bytes": worst.private_end, "growth_bytes_per_min": worst.private_growth_per_min}
    else:
        worst = max(by_rss, key=lambda w: (w.rss_end or 0) - (w.rss_start or 0))
        facts = {"memory": "resident", "pid": worst.pid, "start_bytes": worst.rss_start, "end_bytes": worst.rss_end}
    grown = {w.pid for w in by_uss} | {w.pid for w in by_rss}
    return [Pitfall("worker-memory-growth", "loader", {"workers_grown": len(grown), **facts})]


def _shm_headroom(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                  cpus: int) -> list[Pitfall]:
    free = None
    for check in session.checks:
        if check.get("id") == "shm":
            free = (check.get("data") or {}).get("free_bytes") or (check.get("data") or {}).get("size_bytes")
    out = []
    for info in session.batch_info:
        loader = next((ld for ld in loaders if ld.loader_id == info["loader_id"]), None)
        if loader is None or not free:
            continue
        workers = int(loader.config.get("num_workers") or 0)
        in_flight = workers * int(loader.config.get("prefetch_factor") or 2) * int(info.get("nbytes") or 0)
        if workers and in_flight > 0.5 * free:
            out.append(Pitfall("shm-headroom", "loader", {
                "loader_id": loader.loader_id, "workers": workers,
                "prefetch_factor": loader.config.get("prefetch_factor"),
                "batch_bytes": info["nbytes"], "in_flight_bytes": in_flight, "shm_free_bytes": free}))
    return out


def _shm_exhausted(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                   cpus: int) -> list[Pitfall]:
    """The run failed because /dev/shm had no room for a batch (``shm.shm_exhaustion``): the cause and its fix,
    with the loader's batches in flight where they are known."""
    found = shm_exhaustion(session)
    if found is None:
        return []
    with_workers = [ld for ld in loaders if int(ld.config.get("num_workers") or 0) > 0]
    loader = next((ld for ld in with_workers if found["loader_id"] in ld.ids), None) or next(iter(with_workers), None)
    facts: dict[str, Any] = {**found, "loader_id": loader.loader_id if loader else found["loader_id"]}
    if loader is not None:
        workers = int(loader.config.get("num_workers") or 0)
        prefetch = int(loader.config.get("prefetch_factor") or 2)
        batch = max((int(i.get("nbytes") or 0) for i in session.batch_info if i["loader_id"] in loader.ids),
                    default=0)
        facts.update(workers=workers, prefetch_factor=prefetch, batch_bytes=batch or None,
                     in_flight_bytes=workers * prefetch * batch or None)
    return [Pitfall("shm-exhausted", "loader", facts)]


def _workers_above_cores(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                         cpus: int) -> list[Pitfall]:
    out = []
    for ld in loaders:
        p = ld.pipeline
        workers = int(ld.config.get("num_workers") or 0)
        if p is None or workers <= cpus or not p.busy_s:
            continue
        waiting = (p.runqueue_s or 0.0) / p.busy_s
        if waiting > 0.15:
            out.append(Pitfall("workers-above-cores", "loader",
                               {"workers": workers, "usable_cpus": cpus, "runqueue_fraction": waiting}))
    return out


def _thread_oversubscription(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                             cpus: int) -> list[Pitfall]:
    by_loader: dict[int, list[tuple[int, dict]]] = defaultdict(list)
    for w in session.worker_starts:
        by_loader[w.loader_id].append((w.worker, w.threads))
    out = []
    for loader_id, starts in by_loader.items():
        workers = len({worker for worker, _ in starts})
        threads = [t for _, t in starts]
        per_worker = max(_threads_of(t) for t in threads)
        if per_worker > 1 and per_worker * workers > cpus:
            out.append(Pitfall("thread-oversubscription", "transform", {
                "loader_id": loader_id, "threads_per_worker": per_worker, "workers": workers, "usable_cpus": cpus,
                "thread_settings": threads[0]}))
    return out


def _threads_of(settings: dict) -> int:
    values = [settings.get("torch") or 1, settings.get("cv2") or 1]
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        try:
            values.append(int(settings.get(key) or 1))
        except ValueError:
            pass
    return max(values)


def _unpinnable_batch(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                      cpus: int) -> list[Pitfall]:
    out = []
    for info in session.batch_info:
        loader = next((ld for ld in loaders if ld.loader_id == info["loader_id"]), None)
        if loader and loader.config.get("pin_memory") and not info.get("pinnable", True):
            out.append(Pitfall("unpinnable-batch", "transfer", {
                "loader_id": loader.loader_id, "types": list(info["unpinnable"]), "tensors": info.get("tensors", 0)}))
    return out


def _cuda_in_forked_worker(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                           cpus: int) -> list[Pitfall]:
    hits = [e for e in session.errors if "re-initialize CUDA in forked subprocess" in e.message]
    if not hits:
        return []
    return [Pitfall("cuda-in-forked-worker", "loader", {"type": hits[0].type, "message": hits[0].message[:200]})]


def _lmdb_before_fork(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                      cpus: int) -> list[Pitfall]:
    main = session.main_pid
    main_opens = [o for o in session.lmdb_opens if o["pid"] == main]
    if not main_opens:
        return []
    forked = [ld for ld in loaders if int(ld.config.get("num_workers") or 0) > 0
              and ld.config.get("multiprocessing_context") in ("fork", "default", None)]
    worker_pids = {w.pid for w in session.worker_starts}
    reopened = any(o["pid"] in worker_pids for o in session.lmdb_opens)
    first_iter = min((it.start_ns for it in session.iters if it.num_workers > 0), default=None)
    if forked and not reopened and first_iter is not None and main_opens[0]["t_ns"] < first_iter:
        return [Pitfall("lmdb-before-fork", "storage", {"path": main_opens[0]["path"]})]
    return []


def _connection_before_fork(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                            cpus: int) -> list[Pitfall]:
    """Requests sent over a connection another process opened: a client the training process built and used before
    forking its workers, inherited by them with its open socket. Workers that share it can read each other's
    answers; one worker alone cannot yet, but more workers (what the advice may be) would."""
    by_opener: dict[tuple[int, str], set[int]] = defaultdict(set)
    for used in session.shared_connections:
        by_opener[(used["opened_by"], used["address"])].add(used["pid"])
    if not by_opener:
        return []
    (opener, address), users = max(by_opener.items(), key=lambda item: len(item[1]))
    iterator_of = {w.pid: (w.loader_id, w.iter_id) for w in session.worker_starts}
    together: dict[object, int] = defaultdict(int)  # the workers of one iterator run at once; restarted ones do not
    for pid in users:
        together[iterator_of.get(pid, pid)] += 1
    return [Pitfall("connection-before-fork", "storage",
                    {"address": address, "opened_by": "training process" if opener == session.main_pid else opener,
                     "processes": len(users), "workers": len(users & iterator_of.keys()),
                     "at_once": max(together.values()),
                     "loader_workers": max((int(ld.config.get("num_workers") or 0) for ld in loaders), default=0)})]


def _streaming_cache_limit(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                           cpus: int) -> list[Pitfall]:
    """A streaming dataset whose local cache is smaller than its shards: each epoch evicts the coldest shards and
    downloads them again, so the data comes from the store every epoch instead of the first only."""
    found = []
    for ld in loaders:
        cache = ld.config.get("streaming_cache") or {}
        limit, size = cache.get("cache_limit"), cache.get("dataset_bytes")
        if limit and size and size > limit:
            found.append(Pitfall("streaming-cache-limit", "storage",
                                 {"cache_limit": limit, "dataset_bytes": size, "shards": cache.get("shards"),
                                  "loader": ld.role}))
    return found[:1]


def _out_of_order_waits(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                        cpus: int) -> list[Pitfall]:
    """Waiting for one slow worker's batch while others' are ready (in-order delivery)."""
    out = []
    for ld in loaders:
        foreign = foreign_records(session, ld.ids, ld.pid)
        fetches = [f for f in session.fetches
                   if f.loader_id in ld.ids and f.worker >= 0 and not foreign.has(f.pid, f.worker)]
        workers = {f.worker for f in fetches}
        if len(workers) < 2 or not ld.config.get("in_order", True):
            continue
        per_worker = {w: statistics.median(f.end_ns - f.start_ns for f in fetches if f.worker == w) for w in workers}
        slowest, fastest = max(per_worker.values()), min(per_worker.values())
        if fastest > 0 and slowest / fastest > 2.0 and (ld.pipeline and (ld.pipeline.empty_queue_fraction or 0) > 0.2):
            slow = max(per_worker, key=lambda w: per_worker[w])
            out.append(Pitfall("slow-worker", "loader", {
                "worker": slow, "slowest_batch_ns": slowest, "fastest_batch_ns": fastest,
                "empty_queue_fraction": ld.pipeline.empty_queue_fraction}))
    return out


#: A blocked next() is a stall when it lasted this long, and this many times the median step.
STALL_MIN_S = 1.0
STALL_STEPS = 10


def _loader_stalled(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                    cpus: int) -> list[Pitfall]:
    """A ``next()`` that never returned: workers hung (a deadlock, a blocked read) or a ``timeout`` fired.
    A short wait cut by Ctrl-C is not one; a worker's exception re-raised in ``next()`` is the failure."""
    out = []
    for ld in loaders:
        # loader ids are numbered per process: a spawned worker that runs the script's module code again builds
        # a loader 0 of its own, which is not the training process's
        stalls = [s for s in session.stalls if s.loader_id in ld.ids and ld.pid in (None, s.pid)]
        if not stalls:
            continue
        steps = [n for n in session.nexts if n.loader_id in ld.ids and n.pid == stalls[0].pid]
        gaps = [b.start_ns - a.start_ns for a, b in zip(steps, steps[1:], strict=False)]
        typical = statistics.median(gaps) / 1e9 if gaps else 0.0
        foreign = foreign_records(session, ld.ids, ld.pid)
        worker_errors = {e.type for e in session.errors
                         if e.where == "worker" and e.loader_id in ld.ids and not foreign.has(e.pid, e.worker)}
        for stall in stalls:
            seconds = (stall.end_ns - stall.start_ns) / 1e9
            timed_out = "timed out" in (stall.message or "")
            if stall.how in worker_errors and stall.how != "KeyboardInterrupt":  # a worker's error, re-raised
                continue
            if timed_out or seconds >= max(STALL_MIN_S, STALL_STEPS * typical):
                out.append(Pitfall("loader-stalled", "loader", {
                    "loader_id": stall.loader_id, "role": ld.role, "site": ld.site, "seconds": seconds,
                    "batches_before": sum(1 for n in steps if n.iter_id == stall.iter_id),
                    "how": stall.how, "message": stall.message, "pending_workers": stall.pending,
                    "awaited_worker": stall.awaited, "dead_workers": stall.dead,
                    "num_workers": ld.config.get("num_workers"), "timeout": ld.config.get("timeout"),
                    "start_method": ld.config.get("start_method")}))
    return out
