"""Batch buffers in shared memory that a DataLoader worker reuses once the main process let go of them.

Why: every batch a worker sends lives in fresh shared memory, and on the machines measured a
fresh page costs more than the data written into it (a 64-image uint8 batch of 224 px is 2,400
pages: ~65 us of kernel time per image, 7% of the whole fast path's CPU). Reusing a buffer is
only safe once no process can still read it, and the worker cannot see the main process's
references. So the main process tells it: each pooled batch travels with a one-byte flag in a
small shared array, set when the batch is pickled for sending and cleared by a finalizer on the
batch's storage in the main process, which runs when the last tensor, view or NumPy array over
that memory is gone there. A buffer is taken again only when its flag is clear and nothing in
the worker refers to it either.

One limit: a batch forwarded from the main process to a third process (a second pickling) is
not followed; datasets take ``recycle_batches=False`` for such pipelines.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np
import torch

from stallscope.data._memory import populate_for_writing

#: Buffers kept per worker: the batches in flight (prefetch_factor, 2 by default) plus those the
#: training loop still holds, with room to spare. When all are busy a fresh buffer is used.
SLOTS = 6


def _new_shared(shape: tuple[int, ...]) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))
    tensor = torch.empty(0, dtype=torch.uint8).set_(storage, 0, shape)
    populate_for_writing(tensor)
    return tensor


def _only_pool_refers_to(buffer: torch.Tensor) -> bool:
    from stallscope.data.device import _unreferenced

    return _unreferenced(buffer)


class SharedBatchPool:
    """The worker side: uint8 batch buffers in shared memory, with a shared "still in use" flag each."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.flags = torch.zeros(slots, dtype=torch.uint8).share_memory_()
        self._flag_view = self.flags.numpy()
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.reused = 0
        self.allocated = 0

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A buffer of ``shape``: a released one of the same shape, else a new one."""
        free = [i for i, flag in enumerate(self._flag_view) if flag == 0]
        for i in free:
            buffer = self.buffers[i]
            if buffer is not None and tuple(buffer.shape) == shape and _only_pool_refers_to(buffer):
                self.reused += 1
                return buffer.view(shape)
        self.allocated += 1
        for i in free:
            buffer = self.buffers[i]
            if buffer is None or _only_pool_refers_to(buffer):
                self.buffers[i] = _new_shared(shape)
                return self.buffers[i].view(shape)
        return _new_shared(shape)  # every slot busy: an ordinary, unpooled batch

    def slot_of(self, tensor: torch.Tensor) -> int | None:
        """The slot whose buffer ``tensor`` (or any view of it) lives in, or None."""
        with torch._C.DisableTorchFunctionSubclass():
            ptr = tensor.untyped_storage().data_ptr()
        for i, buffer in enumerate(self.buffers):
            if buffer is not None and buffer.data_ptr() == ptr:
                return i
        return None

    def mark(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (a pooled buffer or a view of one) as a :class:`PooledBatch`; others unchanged."""
        if self.slot_of(tensor) is None:
            return tensor
        return tensor.as_subclass(PooledBatch)


_POOL: tuple[int, SharedBatchPool] | None = None


def worker_pool() -> SharedBatchPool:
    """This process's pool (a forked child gets its own, never its parent's)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), SharedBatchPool())
    return _POOL[1]


def current_pool() -> SharedBatchPool | None:
    return _POOL[1] if _POOL is not None and _POOL[0] == os.getpid() else None


class PooledBatch(torch.Tensor):
    """A tensor over a worker's pooled buffer; it arrives in another process as a plain tensor.

    Results of operations on it (views, slices) are PooledBatch too, so whichever of them
    leaves the worker, the buffer's flag is set and its release armed on the other side.
    """

    def __reduce_ex__(self, protocol: Any) -> Any:
        plain = self.as_subclass(torch.Tensor)
        pool = current_pool()
        slot = pool.slot_of(plain) if pool is not None else None
        if slot is None:
            return _plain, (plain,)
        pool.flags[slot] = 1  # in use until the receiver's copy dies; set while we still hold it
        return _arrive, (plain, pool.flags, slot)


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


#: Pooled batches received by this process (for tests and diagnostics).
received = 0


def _arrive(batch: torch.Tensor, flags: torch.Tensor, slot: int) -> torch.Tensor:
    """In the receiving process: hand over the plain batch; clear its flag when its memory dies here."""
    global received
    received += 1
    weakref.finalize(batch.untyped_storage(), _release, flags, slot)
    return batch


def _release(flags: torch.Tensor, slot: int) -> None:
    flags[slot] = 0
