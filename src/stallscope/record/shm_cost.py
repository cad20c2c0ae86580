"""What a batch costs to pass through shared memory on this machine, measured at exit of a 0-worker run.

With ``num_workers=0`` a batch is collated into ordinary memory and used where it was made. With
workers it is collated into a fresh shared-memory segment (torch's collate in a worker allocates one
per batch) and mapped again in the training process. Both cost page faults that a 0-worker run never
pays and cannot show, so a prediction of "add workers" from such a run would miss them. They scale
with the batch's bytes; the per-byte cost depends on the kernel and the machine (about 0.5 ms per MB
to write and 0.06 ms per MB to map and read on the 2-core development VM). So the recorder measures
it once, after the script is done (nothing of the training is slowed), in the training process where
torch is already imported, and the throughput model scales it by the run's bytes per sample.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

#: Large enough that per-call overheads vanish against the page faults, small enough for any /dev/shm.
CALIBRATION_BYTES = 2 << 20
REPEATS = 3
WARM_UP = 2  # rounds until ordinary memory is reused, not freshly mapped, as a training loop's batches are
PAGE = 4096


def _timed(action: Any) -> int:
    t0 = time.perf_counter_ns()
    action()
    return time.perf_counter_ns() - t0


def measure(nbytes: int = CALIBRATION_BYTES, repeats: int = REPEATS) -> dict[str, int] | None:
    """Extra nanoseconds, over ordinary memory, to fill ``nbytes`` of a new shared-memory segment (the worker's
    collate) and to map that segment again and read it (the training process's side): the median of ``repeats``
    rounds, so one interrupted round does not count. None where torch is not loaded, shared memory cannot be had
    (a full or missing /dev/shm), or batches would go through torch's file_system strategy (its own manager
    process)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "UntypedStorage"):
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
            holder.clear()
            if attempt >= WARM_UP:
                write_extra.append(shared - private)
                read_extra.append(read_shared - read_private)
    except Exception:  # noqa: BLE001 - no /dev/shm, a torch without these calls: the model uses its estimate
        return None
    return {"nbytes": nbytes, "write_extra_ns": max(0, int(statistics.median(write_extra))),
            "read_extra_ns": max(0, int(statistics.median(read_extra)))}
