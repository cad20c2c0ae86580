"""What a batch costs to pass through shared memory on this machine, measured at exit of a 0-worker run.

With ``num_workers=0`` a batch is collated into ordinary memory and used where it was made. With
workers it is collated into a fresh shared-memory segment (torch's collate in a worker allocates one
per batch) and mapped again in the training process. Both cost page faults that a 0-worker run never
pays and cannot show, so a prediction of "add workers" from such a run would miss them. They scale
with the batch's bytes; the per-byte cost depends on the kernel, the machine and the batch's size (fractions of a
millisecond per MiB; calibration: rec-shm-calibration-bytes). So the recorder measures it once, after the script is
done (nothing of the training is slowed), in the training process where torch is already imported, and the
throughput model scales it by the run's bytes per sample.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

#: Large enough that per-call overheads vanish against the page faults, small enough for any /dev/shm.
CALIBRATION_BYTES = 2 << 20
#: The run's own batch size is measured where known, within these bounds: the cost per byte is not flat. A
#: batch the allocator keeps reusing in process costs nothing to fill again, one it maps fresh each time (glibc
#: maps fresh every allocation of 32 MiB or more) pays faults there too (calibration: rec-shm-calibration-bytes).
#: The upper bound keeps the exit short and the memory it takes small.
MIN_BYTES = 1 << 20
MAX_BYTES = 32 << 20
SHM = "/dev/shm"
REPEATS = 3
WARM_UP = 2  # rounds until ordinary memory is reused, not freshly mapped, as a training loop's batches are
PAGE = 4096


def calibration_bytes(batch_nbytes: int | None, shm_free: int | None = None) -> int | None:
    """The size to measure at for batches of ``batch_nbytes`` (the default size when unknown), or None where
    /dev/shm has too little room: the segment takes it, and where torch only truncates the file (older releases)
    a full /dev/shm would kill the process with SIGBUS after its training. At most a quarter of what is free is
    used (``shm_free``: bytes free there, read from the file system when not given)."""
    size = CALIBRATION_BYTES
    if batch_nbytes and batch_nbytes > 0:
        size = int(min(MAX_BYTES, max(MIN_BYTES, batch_nbytes)))
    if shm_free is None:
        shm_free = _free_bytes(SHM)
    if shm_free is not None:
        size = min(size, shm_free // 4)
    return size if size >= MIN_BYTES else None


def _free_bytes(path: str) -> int | None:
    try:
        stat = os.statvfs(path)
    except (AttributeError, OSError):
        return None  # no /dev/shm (macOS): torch's own shared memory goes elsewhere
    return stat.f_bavail * stat.f_frsize


def _timed(action: Any) -> int:
    t0 = time.perf_counter_ns()
    action()
    return time.perf_counter_ns() - t0


def measure(nbytes: int | None = CALIBRATION_BYTES, repeats: int = REPEATS) -> dict[str, int] | None:
    """Extra nanoseconds, over ordinary memory, to fill ``nbytes`` of a new shared-memory segment (the worker's
    collate) and to map that segment again, read it and let it go (the training process's side: it holds the
    batch last, so freeing the segment's pages falls to it, about a quarter of a write): the median of ``repeats``
    rounds, so one interrupted round does not count. None where torch is not loaded, shared memory cannot be had
    (a full or missing /dev/shm), or batches would go through torch's file_system strategy (its own manager
    process)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "UntypedStorage") or not nbytes:
        return None
    try:
        if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
            return None
        source = torch.ones(nbytes, dtype=torch.uint8)
        # One byte per page: the copy itself is the same in both memories, the page faults are the difference.
        write_extra, read_extra = [], []
        for attempt in range(repeats + WARM_UP):  # the first rounds warm the allocator up and are dropped
            private = _timed(lambda: torch.empty(nbytes, dtype=torch.uint8)[::PAGE].fill_(1))
            holder: list[Any] = []

            def shared_write(holder: list[Any] = holder) -> None:
                storage = torch.UntypedStorage._new_shared(nbytes)
                torch.tensor([], dtype=torch.uint8).set_(storage)[::PAGE].fill_(1)
                holder.append(storage)

            shared = _timed(shared_write)
            fd, size = holder[0]._share_fd_cpu_()[:2]
            read_private = _timed(lambda: source[::PAGE].sum())

            def mapped_read(fd: int = fd, size: int = size) -> None:
                again = torch.UntypedStorage._new_shared_fd_cpu(fd, size)  # maps a copy of fd
                torch.tensor([], dtype=torch.uint8).set_(again)[::PAGE].sum()  # one byte per page: the faults

            read_shared = _timed(mapped_read)
            read_shared += _timed(holder.clear)  # the last reference: the segment's pages are freed here
            if attempt >= WARM_UP:
                write_extra.append(shared - private)
                read_extra.append(read_shared - read_private)
    except Exception:  # noqa: BLE001 - no /dev/shm, a torch without these calls: the model uses its estimate
        return None
    return {"nbytes": nbytes, "write_extra_ns": max(0, int(statistics.median(write_extra))),
            "read_extra_ns": max(0, int(statistics.median(read_extra)))}
