"""Pitfalls in words: what each is, what this run showed, and the fix; one function per id, found through
``_SAYS``. An id with no words here is said by its facts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stallscope.render.words.phrases import MIB, facts_text


@dataclass(frozen=True)
class PitfallSaid:
    """A pitfall in words: what it is, what this run showed, and the fix."""
    title: str
    evidence: str
    fix: str


def _shm_evidence(f: dict[str, Any]) -> str:
    """Where /dev/shm ran out, in torch's words, with its size and the batches in flight where known."""
    where = (f"worker {f['worker']} of loader {f['loader_id']}" if f.get("worker") is not None
             else "a DataLoader worker" if f.get("where") == "worker" else "the training process")
    parts = [f"{where}: {f['said']}"]
    if f.get("shm_size_bytes"):
        free = f" ({f['shm_free_bytes'] / MIB:.3g} MiB free)" if f.get("shm_free_bytes") is not None else ""
        parts.append(f"/dev/shm held {f['shm_size_bytes'] / MIB:.3g} MiB{free} when the run started")
    if f.get("in_flight_bytes"):
        parts.append(f"{f['workers']} workers x prefetch {f['prefetch_factor']} x {f['batch_bytes'] / MIB:.3g} MiB "
                     f"batches = {f['in_flight_bytes'] / MIB:.3g} MiB in flight")
    elif f.get("workers"):
        parts.append(f"{f['workers']} workers x prefetch {f['prefetch_factor']} batches in flight")
    return "; ".join(parts)


def _worker_memory_growth(f: dict[str, Any]) -> tuple[str, str, str]:
    if f["memory"] == "private":
        rate = f", {f['growth_bytes_per_min'] / MIB:.0f} MiB/min" if f.get("growth_bytes_per_min") else ""
        what = (f"pid {f['pid']} from {f['start_bytes'] / MIB:.0f} to {f['end_bytes'] / MIB:.0f} MiB "
                f"private{rate}")
    else:
        what = (f"pid {f['pid']} resident memory from {f['start_bytes'] / MIB:.0f} to "
                f"{f['end_bytes'] / MIB:.0f} MiB")
    return ("DataLoader workers' memory keeps growing", f"{f['workers_grown']} worker(s) grew; worst: {what}",
            "a Python list/dict of per-sample objects in the dataset is copied page by page as workers read it "
            "(copy-on-read, pytorch issue 13246): store paths and labels in numpy arrays or a packed file; "
            "also check the dataset does not cache samples it loads")


def _shm_headroom(f: dict[str, Any]) -> tuple[str, str, str]:
    return ("/dev/shm is small for the batches in flight",
            f"loader {f['loader_id']}: {f['workers']} workers x prefetch {f['prefetch_factor']} x "
            f"{f['batch_bytes'] / MIB:.1f} MiB batches = {f['in_flight_bytes'] / MIB:.0f} MiB vs "
            f"{f['shm_free_bytes'] / MIB:.0f} MiB free",
            "enlarge /dev/shm (docker run --shm-size=8g), or lower prefetch_factor/num_workers, or send uint8")


def _shm_exhausted(f: dict[str, Any]) -> tuple[str, str, str]:
    return ("/dev/shm ran out: the batches in flight did not fit", _shm_evidence(f),
            "enlarge /dev/shm: docker run --shm-size=8g (or --ipc=host); Kubernetes: an emptyDir with medium: "
            "Memory mounted at /dev/shm; or keep fewer batches in flight (--set prefetch_factor=1, fewer "
            "workers with --set num_workers=N) or make them smaller (uint8 images instead of float32); "
            "sharing_strategy=file_system does not help, it allocates in /dev/shm too")


def _workers_above_cores(f: dict[str, Any]) -> tuple[str, str, str]:
    advised = f.get("advised_workers")  # the recommendation's count, where one sets it: one owner for the number
    return (f"{f['workers']} workers on {f['usable_cpus']} usable CPUs",
            f"workers waited for a CPU {100 * f['runqueue_fraction']:.0f}% of their busy time",
            f"use {advised} worker{'s' if advised != 1 else ''}, the count predicted fastest for this job on these "
            "CPUs (see the recommendations)" if advised is not None else
            f"use at most {f['usable_cpus']} workers for CPU-bound loading (more only when they block on I/O)")


def _thread_oversubscription(f: dict[str, Any]) -> tuple[str, str, str]:
    return ("Each worker runs several compute threads",
            f"loader {f['loader_id']}: up to {f['threads_per_worker']} threads per worker x {f['workers']} "
            f"workers on {f['usable_cpus']} CPUs ({f['thread_settings']})",
            "in worker_init_fn: torch.set_num_threads(1); cv2.setNumThreads(0); or OMP_NUM_THREADS=1")


def _unpinnable_batch(f: dict[str, Any]) -> tuple[str, str, str]:
    return ("pin_memory cannot pin this batch type",
            f"loader {f['loader_id']} yields {', '.join(f['types'])} without a pin_memory() method: its "
            f"{f['tensors']} tensors stay in pageable memory",
            "give the batch class a pin_memory(self) method returning a copy with pinned tensors, or return a "
            "dict/tuple of tensors")


def _cuda_in_forked_worker(f: dict[str, Any]) -> tuple[str, str, str]:
    return ("CUDA used inside a forked DataLoader worker", f"{f['type']}: {f['message']}",
            "keep datasets on the CPU (move batches to the GPU in the training loop), or use "
            "multiprocessing_context='spawn'")


def _lmdb_before_fork(f: dict[str, Any]) -> tuple[str, str, str]:
    return ("LMDB environment opened before the workers forked",
            f"{f['path']} was opened in the main process and never reopened in a worker",
            "open the environment lazily in __getitem__ (once per worker process), not in __init__")


def _streaming_cache_limit(f: dict[str, Any]) -> tuple[str, str, str]:
    limit, size = f["cache_limit"], f["dataset_bytes"]
    return ("The streaming cache is smaller than the dataset: every epoch downloads it again",
            f"StreamingDataset(cache_limit={limit / 1e6:.0f} MB) for {f.get('shards') or '?'} shards of "
            f"{size / 1e6:.0f} MB in all: the coldest shards are evicted and fetched again each epoch",
            f"raise `cache_limit` to at least {size / 1e6:.0f} MB (or leave it unset) where the local disk holds "
            "it, so only the first epoch reads from the store (try it without editing the script: --set "
            f"streaming_cache_limit={math.ceil(size / 1e6)}mb); else keep the shards the epochs share on a faster "
            "store")


def _slow_worker(f: dict[str, Any]) -> tuple[str, str, str]:
    return ("Batches wait in order behind one slow worker",
            f"worker {f['worker']}'s median batch takes {f['slowest_batch_ns'] / 1e6:.0f} ms vs "
            f"{f['fastest_batch_ns'] / 1e6:.0f} ms for the fastest; no batch was ready on "
            f"{100 * f['empty_queue_fraction']:.0f}% of requests",
            "balance per-sample cost (sort or bucket by size), or DataLoader(in_order=False) if order does not "
            "matter")


def _loader_stalled(f: dict[str, Any]) -> tuple[str, str, str]:
    how = f.get("how") or ""
    if f.get("dead_workers") and how not in ("exit", "os._exit", "KeyboardInterrupt") \
            and not how.startswith("SIG"):  # an interrupt or a kill ends the workers too: the hang came first
        respawned = f.get("start_method") in ("spawn", "forkserver")
        return ("The DataLoader's workers died", _stall_evidence(f),
                "the workers' own error is in the script's output, above this summary"
                + ("; under spawn and forkserver each worker imports the script again, so a script that trains at "
                   "module level needs its training under if __name__ == \"__main__\":" if respawned else
                   "; a worker killed without an error was often out of memory (dmesg says so)"))
    return ("The DataLoader stopped delivering batches", _stall_evidence(f),
            "find where the workers block: py-spy dump --pid WORKER_PID shows each one's stack (a lock taken "
            "before fork, a read that never returns, a queue nobody fills)"
            + ("" if f.get("timeout") else "; DataLoader(timeout=SECONDS) turns a silent hang into an error"))


def _connection_before_fork(f: dict[str, Any]) -> tuple[str, str, str]:
    n = f["processes"]
    who = ("the training process" if f["opened_by"] == "training process" else f"process {f['opened_by']}")
    users = (f"{n} DataLoader worker{'s' if n != 1 else ''}" if f["workers"] == n
             else f"{n} process{'es' if n != 1 else ''}")
    risk = ("their requests share one socket, so one can read another's answer: a download arrives garbled or in "
            "the wrong worker (MosaicML Streaming then fails with 'Relative sample index N is not present in the "
            "shard')" if f.get("at_once", n) > 1 else
            "one worker at a time cannot cross answers with another, but with more workers their requests would "
            "share that socket and one could read another's answer")
    at_once = f.get("at_once", n)
    together = f" ({at_once} at once)" if 1 < at_once < n else (" (one at a time)" if at_once == 1 < n else "")
    return ("A connection opened before the workers forked is used by them",
            f"{users}{together} sent requests to {f['address']} over a connection {who} opened before forking them: "
            f"{risk}",
            "start the workers with multiprocessing_context='spawn' (or 'forkserver'): each then builds its own "
            "client, as MosaicML Streaming advises; or build the client lazily in each worker (in __getitem__ or "
            "worker_init_fn), not in the dataset's __init__. Without editing: --set multiprocessing_context=spawn")


#: pitfall id -> its words (title, evidence, fix)
_SAYS = {
    "worker-memory-growth": _worker_memory_growth,
    "shm-headroom": _shm_headroom,
    "shm-exhausted": _shm_exhausted,
    "workers-above-cores": _workers_above_cores,
    "thread-oversubscription": _thread_oversubscription,
    "unpinnable-batch": _unpinnable_batch,
    "cuda-in-forked-worker": _cuda_in_forked_worker,
    "lmdb-before-fork": _lmdb_before_fork,
    "connection-before-fork": _connection_before_fork,
    "streaming-cache-limit": _streaming_cache_limit,
    "slow-worker": _slow_worker,
    "loader-stalled": _loader_stalled,
}


def _stall_evidence(f: dict[str, Any]) -> str:
    ended = {"exit": "when the script ended", "os._exit": "when the script called os._exit"}.get(
        f["how"], f"until {f['how']} ended it")
    if f.get("message") and "timed out" in f["message"]:
        ended = f"until the DataLoader timeout fired ({f['message']})"
    which = {"train": "the training loader", "eval": "the evaluation loader"}.get(
        f["role"], f"the DataLoader built at {f['site']}" if f.get("site") else "a DataLoader")
    before = (f"after {f['batches_before']} batch(es) of that epoch" if f["batches_before"]
              else "before the epoch's first batch")
    text = f"{which} waited {f['seconds']:.1f} s for its next batch {ended}, {before}"
    if f.get("awaited_worker") is not None:
        text += f"; it waited for worker {f['awaited_worker']}"
    if f.get("pending_workers"):
        text += f"; {_workers(f['pending_workers'])} had not returned their batches"
    if f.get("dead_workers"):
        text += f"; {_workers(f['dead_workers'])} {'was' if len(f['dead_workers']) == 1 else 'were'} no longer alive"
    return text


def _workers(ids: list[int]) -> str:
    return f"worker{'s' if len(ids) != 1 else ''} {', '.join(map(str, ids))}"


def pitfall(p: Any) -> PitfallSaid:
    say = _SAYS.get(p.id)
    return PitfallSaid(*say(p.facts)) if say is not None else PitfallSaid(p.id, facts_text(p.facts), "")
