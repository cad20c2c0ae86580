"""Known DataLoader pitfalls, each raised only on evidence from this run.

Every pitfall carries the numbers that triggered it. None fires on configuration alone when the
measurement says it did no harm, except those that break jobs outright (CUDA in forked workers).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from stallscope.analyze.findings import LoaderSummary
from stallscope.analyze.system_metrics import SystemSummary
from stallscope.session import Session

MIB = 1 << 20


@dataclass(frozen=True)
class Pitfall:
    id: str
    node: str
    title: str
    evidence: str
    fix: str


def find_pitfalls(session: Session, loaders: list[LoaderSummary], system: SystemSummary,
                  usable_cpus: int) -> list[Pitfall]:
    found: list[Pitfall] = []
    for check in (_rss_growth, _shm_headroom, _workers_above_cores, _thread_oversubscription, _unpinnable_batch,
                  _cuda_in_forked_worker, _lmdb_before_fork, _out_of_order_waits):
        found.extend(check(session, loaders, system, usable_cpus))
    return found


def _rss_growth(session, loaders, system, cpus):
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
        worst = max(by_uss, key=lambda w: w.private_end - w.private_start)
        rate = f", {worst.private_growth_per_min / MIB:.0f} MiB/min" if worst.private_growth_per_min else ""
        what = (f"pid {worst.pid} from {worst.private_start / MIB:.0f} to {worst.private_end / MIB:.0f} MiB "
                f"private{rate}")
    else:
        worst = max(by_rss, key=lambda w: w.rss_end - w.rss_start)
        what = f"pid {worst.pid} resident memory from {worst.rss_start / MIB:.0f} to {worst.rss_end / MIB:.0f} MiB"
    grown = {w.pid for w in by_uss} | {w.pid for w in by_rss}
    return [Pitfall(
        "worker-memory-growth", "loader", "DataLoader workers' memory keeps growing",
        f"{len(grown)} worker(s) grew; worst: {what}",
        "a Python list/dict of per-sample objects in the dataset is copied page by page as workers read it "
        "(copy-on-read, pytorch issue 13246): store paths and labels in numpy arrays or a packed file; "
        "also check the dataset does not cache samples it loads")]


def _shm_headroom(session, loaders, system, cpus):
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
            out.append(Pitfall(
                "shm-headroom", "loader", "/dev/shm is small for the batches in flight",
                f"loader {loader.loader_id}: {workers} workers x prefetch {loader.config.get('prefetch_factor')} x "
                f"{info['nbytes'] / MIB:.1f} MiB batches = {in_flight / MIB:.0f} MiB vs {free / MIB:.0f} MiB free",
                "enlarge /dev/shm (docker run --shm-size=8g), or lower prefetch_factor/num_workers, or send uint8"))
    return out


def _workers_above_cores(session, loaders, system, cpus):
    out = []
    for ld in loaders:
        p = ld.pipeline
        workers = int(ld.config.get("num_workers") or 0)
        if p is None or workers <= cpus or not p.busy_s:
            continue
        waiting = (p.runqueue_s or 0.0) / p.busy_s
        if waiting > 0.15:
            out.append(Pitfall(
                "workers-above-cores", "loader", f"{workers} workers on {cpus} usable CPUs",
                f"workers waited for a CPU {100 * waiting:.0f}% of their busy time",
                f"use at most {cpus} workers for CPU-bound loading (more only when they block on I/O)"))
    return out


def _thread_oversubscription(session, loaders, system, cpus):
    by_loader: dict[int, list[tuple[int, dict]]] = defaultdict(list)
    for w in session.worker_starts:
        by_loader[w.loader_id].append((w.worker, w.threads))
    out = []
    for loader_id, starts in by_loader.items():
        workers = len({worker for worker, _ in starts})
        threads = [t for _, t in starts]
        per_worker = max(_threads_of(t) for t in threads)
        if per_worker > 1 and per_worker * workers > cpus:
            out.append(Pitfall(
                "thread-oversubscription", "transform", "Each worker runs several compute threads",
                f"loader {loader_id}: up to {per_worker} threads per worker x {workers} workers on {cpus} CPUs "
                f"({threads[0]})",
                "in worker_init_fn: torch.set_num_threads(1); cv2.setNumThreads(0); or OMP_NUM_THREADS=1"))
    return out


def _threads_of(settings: dict) -> int:
    values = [settings.get("torch") or 1, settings.get("cv2") or 1]
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        try:
            values.append(int(settings.get(key) or 1))
        except ValueError:
            pass
    return max(values)


def _unpinnable_batch(session, loaders, system, cpus):
    out = []
    for info in session.batch_info:
        loader = next((ld for ld in loaders if ld.loader_id == info["loader_id"]), None)
        if loader and loader.config.get("pin_memory") and not info.get("pinnable", True):
            out.append(Pitfall(
                "unpinnable-batch", "transfer", "pin_memory cannot pin this batch type",
                f"loader {loader.loader_id} yields {', '.join(info['unpinnable'])} without a pin_memory() method: "
                f"its {info.get('tensors', 0)} tensors stay in pageable memory",
                "give the batch class a pin_memory(self) method returning a copy with pinned tensors, "
                "or return a dict/tuple of tensors"))
    return out


def _cuda_in_forked_worker(session, loaders, system, cpus):
    hits = [e for e in session.errors if "re-initialize CUDA in forked subprocess" in e.message]
    if not hits:
        return []
    return [Pitfall(
        "cuda-in-forked-worker", "loader", "CUDA used inside a forked DataLoader worker",
        f"{hits[0].type}: {hits[0].message[:200]}",
        "keep datasets on the CPU (move batches to the GPU in the training loop), or use "
        "multiprocessing_context='spawn'")]


def _lmdb_before_fork(session, loaders, system, cpus):
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
        return [Pitfall(
            "lmdb-before-fork", "storage", "LMDB environment opened before the workers forked",
            f"{main_opens[0]['path']} was opened in the main process and never reopened in a worker",
            "open the environment lazily in __getitem__ (once per worker process), not in __init__")]
    return []


def _out_of_order_waits(session, loaders, system, cpus):
    """Waiting for one slow worker's batch while others' are ready (in-order delivery)."""
    out = []
    for ld in loaders:
        fetches = [f for f in session.fetches if f.loader_id == ld.loader_id and f.worker >= 0]
        workers = {f.worker for f in fetches}
        if len(workers) < 2 or not ld.config.get("in_order", True):
            continue
        per_worker = {w: statistics.median(f.end_ns - f.start_ns for f in fetches if f.worker == w) for w in workers}
        slowest, fastest = max(per_worker.values()), min(per_worker.values())
        if fastest > 0 and slowest / fastest > 2.0 and (ld.pipeline and (ld.pipeline.empty_queue_fraction or 0) > 0.2):
            slow = max(per_worker, key=per_worker.get)
            out.append(Pitfall(
                "slow-worker", "loader", "Batches wait in order behind one slow worker",
                f"worker {slow}'s median batch takes {slowest / 1e6:.0f} ms vs {fastest / 1e6:.0f} ms for the "
                f"fastest; no batch was ready on {100 * ld.pipeline.empty_queue_fraction:.0f}% of requests",
                "balance per-sample cost (sort or bucket by size), or DataLoader(in_order=False) if order does not "
                "matter"))
    return out
