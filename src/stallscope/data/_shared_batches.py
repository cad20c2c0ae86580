"""Batch buffers in shared memory that a DataLoader worker reuses once no other process reads them.

Why: every batch a worker sends lives in fresh shared memory, and on the machines measured a
fresh page costs more than the data written into it (a 64-image uint8 batch of 224 px is 2,400
pages: ~65 us of kernel time per image, 7% of the whole fast path's CPU). Reuse is only safe once
no process can still read the buffer, and the worker cannot see the other processes' references,
so they tell it. Every storage a worker pickles goes through torch's reducer for
``UntypedStorage``; the worker wraps that reducer: a storage inside one of its pooled buffers sets
the buffer's one-byte flag in a small shared array and travels with (flags, slot). The receiving
process rebuilds the storage as torch would and puts a finalizer on it that clears the flag when
the last tensor, view or NumPy array over that memory is gone there. Whatever the tensor type or
view that carried it, the storage is what crosses, so nothing leaves the worker unflagged.

If the receiving process pickles such a storage again (forwards a batch to a third process), its
finalizers are cancelled: the buffer is then never reused, which is safe, only not faster.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stallscope.data._memory import populate_for_writing

#: Buffers kept per worker: the batches in flight (prefetch_factor of them) plus the one or two the
#: training loop holds. When all are busy a batch gets a fresh, unpooled buffer. Each buffer costs
#: its batch's size in /dev/shm for the life of the worker (9.6 MB for 64 images of 224x224).
SLOTS = 6

#: Storages of the batch buffers the datasets made in this process, by address (weakly held):
#: ``collate_uint8`` passes such a buffer on as the batch, never a user's own storage.
_BATCH_BUFFERS: weakref.WeakValueDictionary[int, torch.UntypedStorage] = weakref.WeakValueDictionary()


def register_batch_buffer(tensor: torch.Tensor) -> torch.Tensor:
    storage = tensor.untyped_storage()
    _BATCH_BUFFERS[storage.data_ptr()] = storage
    return tensor


def is_batch_buffer(storage: torch.UntypedStorage) -> bool:
    return _BATCH_BUFFERS.get(storage.data_ptr()) is storage


def new_shared_batch(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor in shared memory, its pages mapped in one call."""
    storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))
    # torch accepts (storage, offset, size) without a stride (contiguous); its stubs want one
    tensor = torch.empty(0, dtype=torch.uint8).set_(storage, 0, shape)  # type: ignore[call-overload]
    populate_for_writing(tensor)
    return register_batch_buffer(tensor)


def alias(buffer: torch.Tensor) -> torch.Tensor:
    """A new tensor over ``buffer``'s memory that does not keep ``buffer`` itself (no ``_base``)."""
    return torch.empty(0, dtype=buffer.dtype).set_(buffer.untyped_storage(), 0, buffer.shape, buffer.stride())


_storage_use_count: Any = getattr(torch._C, "_storage_Use_Count", None)  # private to torch: None where absent


def _reference_counts(buffer: torch.Tensor) -> tuple[int, int]:
    """(C++ references to the memory, Python references to its storage object), seen from here."""
    storage = buffer.untyped_storage()
    return _storage_use_count(storage._cdata), sys.getrefcount(storage)


def _calibrate() -> tuple[int, int] | None:
    """The counts of a buffer nobody else holds, if holding an alias or the storage shows up in them.

    Measured rather than assumed, because both counts depend on how this torch build keeps
    Python objects alive; the batch recycling also relies on a storage's finalizer firing only
    when its memory dies, checked here too. If anything is off, reuse stays off.
    """
    if _storage_use_count is None:
        return None
    try:
        probe = torch.empty(1)
        alone = _reference_counts(probe)
        view = probe.view(1)
        with_alias = _reference_counts(probe)
        del view
        storage = probe.untyped_storage()
        with_storage = _reference_counts(probe)
        died: list[bool] = []
        weakref.finalize(storage, died.append, True)
        del storage
        if with_alias[0] <= alone[0] or with_storage[1] <= alone[1] or _reference_counts(probe) != alone or died:
            return None
        del probe
        return alone if died == [True] else None
    except Exception:  # noqa: BLE001 - a private torch API changed: no reuse, no failure
        return None


_UNREFERENCED_COUNTS = _calibrate()


def unreferenced(buffer: torch.Tensor) -> bool:
    """True when nothing but ``buffer`` refers to its memory (False when that cannot be told)."""
    return _UNREFERENCED_COUNTS is not None and _reference_counts(buffer) == _UNREFERENCED_COUNTS


def _only_pool_refers_to(buffer: torch.Tensor) -> bool:
    return unreferenced(buffer)


class SharedBatchPool:
    """The worker side: uint8 batch buffers in shared memory, with a shared "still in use" flag each."""

    def __init__(self, slots: int = SLOTS) -> None:
        self.flags = torch.zeros(slots, dtype=torch.uint8).share_memory_()
        self._flags = self.flags.numpy()
        self.buffers: list[torch.Tensor | None] = [None] * slots
        self.reused = 0
        self.allocated = 0

    def _free(self, i: int) -> bool:
        # References first, then the flag: the sender sets the flag while it still holds the
        # buffer, so once nothing here refers to it the flag read next is current.
        buffer = self.buffers[i]
        return buffer is not None and _only_pool_refers_to(buffer) and self._flags[i] == 0

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A buffer of ``shape``: a released one of the same shape, else a new one."""
        for i, buffer in enumerate(self.buffers):
            if buffer is not None and tuple(buffer.shape) == shape and self._free(i):
                self.reused += 1
                return alias(buffer)
        self.allocated += 1
        for i, buffer in enumerate(self.buffers):
            if buffer is None or self._free(i):
                self.buffers[i] = fresh = new_shared_batch(shape)
                return alias(fresh)
        return new_shared_batch(shape)  # every slot busy: an ordinary, unpooled batch

    def slot_of(self, storage: torch.UntypedStorage) -> int | None:
        ptr = storage.data_ptr()
        for i, buffer in enumerate(self.buffers):
            if buffer is not None and buffer.data_ptr() == ptr:
                return i
        return None


_POOL: tuple[int, SharedBatchPool] | None = None


def worker_pool() -> SharedBatchPool:
    """This process's pool (a forked child gets its own, never its parent's)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _wrap_storage_reducer(_flag_pooled_storage)
        _POOL = (os.getpid(), SharedBatchPool())
    return _POOL[1]


def current_pool() -> SharedBatchPool | None:
    return _POOL[1] if _POOL is not None and _POOL[0] == os.getpid() else None


def _wrap_storage_reducer(wrapper: Callable[[Any, torch.UntypedStorage], Any]) -> None:
    """Put ``wrapper(original_reduce, storage)`` in front of ForkingPickler's ``UntypedStorage`` reducer, once."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - registers torch's reducers

    current = ForkingPickler._extra_reducers.get(torch.UntypedStorage)  # type: ignore[attr-defined]  # private
    if current is None or wrapper in getattr(current, "_stallscope_wrappers", ()):
        return

    def reduce_untyped_storage(storage: torch.UntypedStorage) -> Any:
        return wrapper(current, storage)

    wrappers = (*getattr(current, "_stallscope_wrappers", ()), wrapper)
    reduce_untyped_storage._stallscope_wrappers = wrappers  # type: ignore[attr-defined]
    ForkingPickler.register(torch.UntypedStorage, reduce_untyped_storage)


def _flag_pooled_storage(original: Callable[[torch.UntypedStorage], Any], storage: torch.UntypedStorage) -> Any:
    """The sender's reducer: a pooled buffer is marked in use and travels with its flag."""
    rebuild, args = original(storage)
    pool = current_pool()
    slot = pool.slot_of(storage) if pool is not None else None
    if pool is None or slot is None:
        return rebuild, args
    pool._flags[slot] = 1  # in use until the receiver's copy dies; set while we still hold it
    return _arrive, (rebuild, args, pool.flags, slot)


#: Storages received from a pool in this process, with the finalizers that will release them.
_ARRIVED: weakref.WeakKeyDictionary[torch.UntypedStorage, list[weakref.finalize]] = weakref.WeakKeyDictionary()


def _arrive(rebuild: Callable[..., Any], args: tuple[Any, ...], flags: torch.Tensor, slot: int) -> Any:
    """In the receiving process: rebuild the storage as torch would; release its slot when it dies here."""
    storage = rebuild(*args)
    untyped = storage._untyped_storage if isinstance(storage, torch.TypedStorage) else storage
    _wrap_storage_reducer(_cancel_release_when_forwarded)
    release = weakref.finalize(untyped, _release, flags.numpy(), slot, os.getpid())
    _ARRIVED.setdefault(untyped, []).append(release)
    return storage


def _release(flags: np.ndarray, slot: int, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the finalizer
        flags[slot] = 0


def _cancel_release_when_forwarded(original: Callable[[torch.UntypedStorage], Any],
                                   storage: torch.UntypedStorage) -> Any:
    """The receiver's reducer: a received buffer sent on to another process is never released."""
    for release in _ARRIVED.pop(storage, ()):
        release.detach()
    return original(storage)
