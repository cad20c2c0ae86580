"""Patches of ``torch.utils.data``: loader creation, iterators, the main-process wait, pinning.

What the main process records per DataLoader:
- ``loader``: creation site, configuration, the ``--set`` overrides applied;
- ``iter``/``reset``: each iterator and each epoch start (worker start-up lives here);
- ``next``: every ``__next__`` call, blocked time and the worker that produced the batch;
- ``send``: every index batch handed to a worker (to match worker fetches to main batches);
- ``pin``: time in ``pin_memory`` per batch and thread.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import sys
import threading
import time
from types import FrameType
from typing import Any

from stallscope.recorder import batches, events, importhook, step_parts, step_sampler, steps, workers
from stallscope.recorder.crop_transform import training_crop
from stallscope.recorder.overrides import apply_overrides

_perf = time.perf_counter_ns
_thread_cpu = time.thread_time_ns
_loader_ids = itertools.count()
_iter_ids = itertools.count()
overrides: dict[str, Any] = {}


#: Frames kept of a DataLoader's creation stack: enough to reach the user's code through a framework.
STACK_FRAMES = 24
#: A batch is sized (its tensors' bytes, ``batch_bytes``) once a second at most: the windows see data that grows
#: (longer sequences, larger images) at the cost of one walk of a batch a second.
SIZED_EVERY_NS = 1_000_000_000


def _creation_stack() -> list[str]:
    """``file:line:function`` frames from the first one outside torch and stallscope outward: the first is
    where the DataLoader was built (a framework's line, or the script's), the rest lead to the user's code."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if f"{os.sep}torch{os.sep}" not in filename and f"{os.sep}stallscope{os.sep}record" not in filename:
            break
        frame = frame.f_back
    stack: list[str] = []
    while frame is not None and len(stack) < STACK_FRAMES:
        stack.append(f"{frame.f_code.co_filename}:{frame.f_lineno}:{frame.f_code.co_name}")
        frame = frame.f_back
    return stack


def _describe(loader: Any) -> dict[str, Any]:
    dataset = loader.dataset
    config: dict[str, Any] = {
        "dataset": type(dataset).__name__,
        "iterable": _is_iterable_dataset(dataset),
        "num_workers": loader.num_workers,
        "batch_size": loader.batch_size,
        "pin_memory": bool(loader.pin_memory),
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": bool(loader.persistent_workers),
        "drop_last": bool(loader.drop_last),
        "batch_sampler": type(loader.batch_sampler).__name__ if loader.batch_sampler is not None else None,
        "sampler": type(loader.sampler).__name__,
        "collate_fn": getattr(loader.collate_fn, "__name__", type(loader.collate_fn).__name__),
        "in_order": getattr(loader, "in_order", True),
        "timeout": loader.timeout,
    }
    context = loader.multiprocessing_context
    config["multiprocessing_context"] = context.get_start_method() if context is not None else None
    if config["multiprocessing_context"] is None and loader.num_workers > 0:
        import multiprocessing

        config["multiprocessing_context"] = multiprocessing.get_start_method(allow_none=True) or "default"
    try:
        import torch.multiprocessing

        config["sharing_strategy"] = torch.multiprocessing.get_sharing_strategy()
    except Exception:
        config["sharing_strategy"] = None
    try:  # the training process's intra-op threads: how many cores its compute can keep busy on the CPU
        import torch

        config["torch_threads"] = torch.get_num_threads()
    except Exception:
        config["torch_threads"] = None
    try:  # the numerics as the loader is built (tune --numerics turns them; see _numerics)
        config["matmul_precision"] = torch.get_float32_matmul_precision()
        config["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
        config["autocast"] = step_parts.autocast_dtype  # --set autocast's (the script's own is a model fact)
        config["channels_last"] = step_parts.channels_last  # --set channels_last's
    except Exception:
        config["matmul_precision"] = config["cudnn_benchmark"] = None
    try:
        config["dataset_len"] = len(dataset)
    except Exception:
        config["dataset_len"] = None
    try:  # what one epoch is: a DistributedSampler's or a subset sampler's share, not the whole dataset
        config["batches_per_epoch"] = len(loader)
    except Exception:
        config["batches_per_epoch"] = None
    config["start_method"] = _start_method(config["multiprocessing_context"])
    streaming = _streaming_cache(dataset)
    if streaming is not None:
        config["streaming_cache"] = streaming
    try:  # the crop its transform takes: what `pack --max-side auto` sizes images for
        crop = training_crop(dataset)
    except Exception:
        crop = None
    if crop is not None:
        config["crop"] = crop
    torch_import = importhook.import_seconds.get("torch")
    if torch_import is not None:
        config["torch_import_s"] = round(torch_import, 3)
    return config


def _is_streaming(dataset: Any) -> bool:
    """A MosaicML Streaming dataset: its class or a base comes from the ``streaming`` package."""
    return dataset is not None and any(c.__module__.startswith("streaming.") for c in type(dataset).__mro__)


def _streaming_cache(dataset: Any) -> dict[str, Any] | None:
    """A MosaicML Streaming dataset's local cache: its limit and what the dataset's shards would keep in it (bytes),
    read from the attributes it sets in its constructor; None for any other dataset, or where they cannot be read."""
    if not _is_streaming(dataset):
        return None
    try:
        keep_zip = bool(getattr(dataset, "keep_zip", False))
        shards = list(dataset.shards)
        return {"cache_limit": getattr(dataset, "cache_limit", None) or None, "shards": len(shards),
                "dataset_bytes": int(sum(shard.get_persistent_size(keep_zip) for shard in shards)),
                "predownload": getattr(dataset, "predownload", None)}
    except Exception:
        return None


def _start_method(context: str | None) -> str:
    """How the loader's workers start, or would with ``num_workers > 0``: its own context, else the one the
    script set, else the platform's default (the first of ``get_all_start_methods``). Read without fixing it."""
    if context and context != "default":
        return context
    import multiprocessing

    try:
        return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    except Exception:
        return "default"


def _is_iterable_dataset(dataset: Any) -> bool:
    from torch.utils.data import IterableDataset

    return isinstance(dataset, IterableDataset)


def batch_size_of(batch: Any, depth: int = 0) -> int | None:
    """Samples in a batch, read from its first leaf with a length: cheap and structure-agnostic.

    Runs per batch in the training thread: the common shape, a tuple or list of tensors, is
    answered before the general walk."""
    if depth > 4:
        return None
    if type(batch) in (tuple, list) and batch:
        shape = getattr(batch[0], "shape", None)
        if shape is not None:  # an array first: its length, as the walk below would find
            return int(shape[0]) if len(shape) > 0 else len(batch)
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) > 0 else None
    if isinstance(batch, dict):
        return batch_size_of(next(iter(batch.values())), depth + 1) if batch else None
    if isinstance(batch, (list, tuple)):
        if not batch:
            return 0
        inner = batch_size_of(batch[0], depth + 1)
        if inner is not None and not isinstance(batch[0], (str, bytes, int, float)):
            return inner
        return len(batch)
    return None


def _samples(iterator: Any, batch: Any) -> int | None:
    """The samples in ``batch``: as many as the sampler gave for it, where it gave a list of indices, or the
    batch's first length where that is fewer (an iterable dataset's last batch ends early; a collate can drop
    samples); the batch's first length where no list was given."""
    indexed = iterator._stallscope_last_indexed if iterator._num_workers == 0 else iterator._stallscope_indexed
    counted = batch_size_of(batch)
    if indexed is None:
        return counted
    return indexed if counted is None else min(indexed, counted)  # fewer: a collate that drops bad samples


class _IpcClock(threading.local):
    """Per thread: (wall, CPU) nanoseconds spent unpickling batches since the current ``__next__`` began."""

    ns = 0
    cpu_ns = 0


_ipc = _IpcClock()
_ipc_patched = False


def _patch_batch_unpickling() -> None:
    """Time rebuilding batches received from workers (unpickling, shared-memory tensor rebuilds).

    That work happens in the receiving thread of the training process, inside ``__next__``: it
    is ``loader`` time the workers' own records cannot show, and it grows with tensors per batch.
    """
    global _ipc_patched
    if _ipc_patched:
        return
    _ipc_patched = True
    from multiprocessing.reduction import ForkingPickler

    original = ForkingPickler.loads

    def loads(*args: Any, **kwargs: Any) -> Any:
        t0, c0 = _perf(), _thread_cpu()
        try:
            return original(*args, **kwargs)
        finally:
            _ipc.ns += _perf() - t0
            _ipc.cpu_ns += _thread_cpu() - c0

    ForkingPickler.loads = staticmethod(loads)


def _numerics(overrides: dict[str, Any]) -> dict[str, list[Any]]:
    """``--set matmul_precision=high`` / ``cudnn_benchmark=true``: set as the script's first DataLoader is built
    (before its training, after its imports); a script that sets them itself later has the last word. Applied once:
    [before, after], as the other overrides say it."""
    import torch

    applied: dict[str, list[Any]] = {}
    precision = overrides.get("matmul_precision")
    if precision and torch.get_float32_matmul_precision() != precision:
        applied["matmul_precision"] = [torch.get_float32_matmul_precision(), precision]
        torch.set_float32_matmul_precision(precision)
    benchmark = overrides.get("cudnn_benchmark")
    if benchmark is not None and bool(torch.backends.cudnn.benchmark) != bool(benchmark):
        applied["cudnn_benchmark"] = [bool(torch.backends.cudnn.benchmark), bool(benchmark)]
        torch.backends.cudnn.benchmark = bool(benchmark)
    if overrides.get("channels_last") and not step_parts.channels_last:
        step_parts.use_channels_last()
        applied["channels_last"] = [False, True]
    autocast = overrides.get("autocast")
    if autocast and step_parts.autocast_dtype is None:
        step_parts.use_autocast(autocast)
        applied["autocast"] = [None, autocast]
    return applied


def _streaming_settings(dataset: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """``--set streaming_cache_limit=20gb`` / ``streaming_predownload=N`` on a MosaicML Streaming dataset, as its
    constructor would take them (Streaming reads both when it iterates, after the loader is built); a limit under
    four of its largest shards is refused as the constructor refuses it. [before, after], or why it was skipped."""
    if not _is_streaming(dataset):
        return {name: {"skipped": "the DataLoader's dataset is no MosaicML StreamingDataset"}
                for name in ("streaming_cache_limit", "streaming_predownload") if overrides.get(name)}
    applied: dict[str, Any] = {}
    limit = overrides.get("streaming_cache_limit")
    if limit:
        try:
            from streaming.base.util import bytes_to_int

            value = bytes_to_int(limit)
        except Exception as exc:  # noqa: BLE001 - its parser's words name what it could not read
            applied["streaming_cache_limit"] = {"skipped": f"not a size: {limit!r} ({exc})"}
        else:
            try:  # what the constructor checks a limit against: the indexes it keeps, four of the largest shards
                largest = int(max(shard.get_max_size() for shard in dataset.shards))
                floor = max(4 * largest, sum(stream.get_index_size() for stream in dataset.streams) + 1)
            except Exception as exc:  # noqa: BLE001 - a Streaming version that keeps these otherwise
                applied["streaming_cache_limit"] = {"skipped": f"this Streaming's shard sizes are unreadable ({exc})"}
            else:
                if value < floor:
                    applied["streaming_cache_limit"] = {
                        "skipped": f"under {floor} bytes (four of the dataset's largest shards, or its indexes), "
                                   "which Streaming refuses"}
                else:
                    applied["streaming_cache_limit"] = [getattr(dataset, "cache_limit", None), value]
                    dataset.cache_limit = value
                    dataset.max_shard_size_across_all_streams = largest
    ahead = overrides.get("streaming_predownload")
    if ahead:
        applied["streaming_predownload"] = [getattr(dataset, "predownload", None), int(ahead)]
        dataset.predownload = int(ahead)
    return applied


def _hold_torch_threads(threads: int) -> list[int]:
    """``--set torch_threads=N``: the training process computes on N intra-op threads from its first DataLoader on,
    and a later ``torch.set_num_threads`` of the script's, from the thread that built the loader, is kept at N (the
    script sets its threads before or after it builds its loader; either way the run measures what was asked). A
    name bound before (``from torch import set_num_threads``) is not reached. [before, N], as the other overrides
    say it."""
    import torch

    before = torch.get_num_threads()
    setter = getattr(torch.set_num_threads, "_stallscope_original", torch.set_num_threads)
    setter(threads)
    training_process, training_thread = os.getpid(), threading.get_ident()

    def set_num_threads(nthreads: int) -> None:  # torch's own parameter name
        # a forked worker inherits this function, and torch's pin-memory thread sets its own single thread:
        # their calls stay theirs
        held = os.getpid() == training_process and threading.get_ident() == training_thread
        setter(threads if held else nthreads)

    set_num_threads._stallscope_original = setter  # type: ignore[attr-defined]
    torch.set_num_threads = set_num_threads
    return [before, threads]


def patch_dataloader(module: Any) -> None:
    DataLoader = module.DataLoader
    base_iter = module._BaseDataLoaderIter
    mp_iter = module._MultiProcessingDataLoaderIter
    single_iter = module._SingleProcessDataLoaderIter
    original_init = DataLoader.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        applied: dict[str, Any] = {}
        strategy = overrides.get("sharing_strategy")
        if strategy:
            import torch.multiprocessing

            before = torch.multiprocessing.get_sharing_strategy()
            torch.multiprocessing.set_sharing_strategy(strategy)
            applied["sharing_strategy"] = [before, strategy]
        threads = overrides.get("torch_threads")
        if threads:
            applied["torch_threads"] = _hold_torch_threads(int(threads))
        applied.update(_numerics(overrides))
        if overrides:
            args, kwargs, changed = apply_overrides(original_init, args, kwargs, overrides)
            applied.update(changed)
        original_init(self, *args, **kwargs)
        if overrides.get("streaming_cache_limit") or overrides.get("streaming_predownload"):
            try:
                applied.update(_streaming_settings(getattr(self, "dataset", None), overrides))
            except Exception as exc:  # noqa: BLE001 - the user's DataLoader() call must go on
                applied.update({name: {"skipped": f"{type(exc).__name__}: {exc}"}
                                for name in ("streaming_cache_limit", "streaming_predownload") if overrides.get(name)})
        self._stallscope_id = next(_loader_ids)
        stack = _creation_stack()
        site = stack[0].rsplit(":", 1)[0] if stack else "?"
        events.emit("loader", self._stallscope_id, _perf(), site, _describe(self), applied, stack)

    DataLoader.__init__ = __init__

    original_base_init = base_iter.__init__

    def base_init(self: Any, loader: Any) -> None:
        if not hasattr(self, "_stallscope_iter"):
            self._stallscope_iter = next(_iter_ids)
        self._stallscope_lid = getattr(loader, "_stallscope_id", -1)
        self._stallscope_epoch = 0
        self._stallscope_sent = collections.deque()  # samples the sampler gave each batch sent to the workers
        original_base_init(self, loader)

    base_iter.__init__ = base_init

    # Samples per batch, as the sampler gave them: a collate that packs a batch into one flat tensor (token ids of
    # every sequence end to end) makes the batch's first length the tokens, not the samples.
    base_iter._stallscope_indexed = None  # the samples of the batch a worker just handed over
    base_iter._stallscope_last_indexed = None  # the samples of the last index list the sampler gave

    original_next_index = base_iter._next_index

    def _next_index(self: Any) -> Any:
        index = original_next_index(self)
        # one index without automatic batching (batch_size=None: a string key has a length too): the batch is
        # what the dataset returned
        self._stallscope_last_indexed = (len(index) if getattr(self, "_auto_collation", False)
                                         and hasattr(index, "__len__") else None)
        return index

    base_iter._next_index = _next_index

    original_reset = base_iter._reset

    def _reset(self: Any, loader: Any, first_iter: bool = False) -> None:
        if not first_iter:
            self._stallscope_epoch += 1  # carried by this iterator's next/stop records
        sent = getattr(self, "_stallscope_sent", None)  # None: an iterator whose __init__ skipped ours
        if sent is not None:
            sent.clear()  # a new epoch sends from its first batch again
        original_reset(self, loader, first_iter)

    base_iter._reset = _reset

    original_mp_init = mp_iter.__init__

    def mp_init(self: Any, loader: Any) -> None:
        _patch_batch_unpickling()
        self._stallscope_iter = iter_id = next(_iter_ids)
        self._stallscope_thread = threading.get_ident()  # the loop's thread: only its stops make the loop wait
        user_fn = loader.worker_init_fn
        loader.worker_init_fn = workers.WorkerInit(user_fn, getattr(loader, "_stallscope_id", -1), iter_id, _perf())
        try:
            original_mp_init(self, loader)
        finally:
            loader.worker_init_fn = user_fn

    mp_iter.__init__ = mp_init

    original_single_init = single_iter.__init__

    def single_init(self: Any, loader: Any) -> None:
        original_single_init(self, loader)
        self._dataset_fetcher._stallscope_ctx = (self._stallscope_lid, self._stallscope_iter, -1)

    single_iter.__init__ = single_init

    original_iter = DataLoader.__iter__

    def __iter__(self: Any) -> Any:
        global loaded_in_process, loaded_by_workers
        t0 = _perf()
        if self.num_workers:
            loaded_by_workers = True
        else:
            loaded_in_process = True
        iterator = original_iter(self)
        events.emit("iter", getattr(self, "_stallscope_id", -1), getattr(iterator, "_stallscope_iter", -1),
                    getattr(iterator, "_stallscope_epoch", 0), t0, _perf(), self.num_workers)
        return iterator

    DataLoader.__iter__ = __iter__

    original_next = base_iter.__next__

    base_iter._stallscope_described = False  # a class default: the per-batch test below is a hit
    base_iter._stallscope_sized_ns = 0  # when a batch of this iterator was last sized (``batch_bytes``)

    def __next__(self: Any) -> Any:
        global _waiting
        if steps.max_steps is not None:
            steps.before_next()
        step_sampler.batch_wanted()
        self._stallscope_worker = -1
        ipc = _ipc
        if _ipc_patched:  # unpickling inside this call (wall beyond CPU: fetching tensors' descriptors)
            ipc.ns = ipc.cpu_ns = 0
        t0 = _perf()
        _waiting = (self, t0)
        try:
            data = original_next(self)
        except StopIteration:
            _waiting = None
            events.emit("stop", self._stallscope_lid, self._stallscope_iter, self._stallscope_epoch, t0, _perf())
            raise
        except BaseException as exc:  # a timeout, Ctrl-C, a worker's error re-raised: no batch came
            _waiting = None
            _record_stall(self, t0, type(exc).__name__, str(exc)[:500])
            raise
        _waiting = None
        t1 = _perf()
        events.emit("next", self._stallscope_lid, self._stallscope_iter, self._stallscope_epoch, t0, t1,
                    self._stallscope_worker, _samples(self, data), ipc.ns, ipc.cpu_ns)
        if not self._stallscope_described:
            self._stallscope_described = True
            described = batches.describe_batch(data)
            events.emit("batch_info", self._stallscope_lid, self._stallscope_iter, described)
            _note_batch_bytes(self._stallscope_lid, described.get("nbytes"))
        if t1 - self._stallscope_sized_ns >= SIZED_EVERY_NS:
            self._stallscope_sized_ns = t1
            events.emit("batch_bytes", self._stallscope_lid, t1, batches.describe_batch(data)["nbytes"])
        _batches_by_loader[self._stallscope_lid] = _batches_by_loader.get(self._stallscope_lid, 0) + 1
        steps.after_next(self._stallscope_lid)
        step_sampler.batch_taken()
        return data

    base_iter.__next__ = __next__

    original_process = mp_iter._process_data

    def _process_data(self: Any, data: Any, worker_idx: int) -> Any:
        self._stallscope_worker = worker_idx
        # Batches come back in the order they were sent (unless in_order=False): the oldest sent is this one. An
        # iterable dataset's worker that runs out takes its task with it, but all its index lists are as long.
        sent = getattr(self, "_stallscope_sent", None)
        self._stallscope_indexed = sent.popleft() if sent and getattr(self, "_in_order", True) else None
        return original_process(self, data, worker_idx)

    mp_iter._process_data = _process_data

    original_put = mp_iter._try_put_index

    def _try_put_index(self: Any) -> None:
        before = self._send_idx
        original_put(self)
        if self._send_idx != before:
            sent = getattr(self, "_stallscope_sent", None)
            if sent is not None and getattr(self, "_in_order", True):  # out of order, one batch is like another
                sent.append(self._stallscope_last_indexed)
            events.emit("send", self._stallscope_lid, self._stallscope_iter, self._stallscope_epoch, before,
                        self._task_info[before][0], _perf())

    mp_iter._try_put_index = _try_put_index

    original_shutdown = mp_iter._shutdown_workers

    def _shutdown_workers(self: Any) -> None:
        # Recorded: a shutdown that stops workers (the first call; not the no-op at interpreter exit), on the thread
        # that iterates the loader (not a garbage collection that freed the iterator on another thread: the loop did
        # not wait for that one). It may run from __del__, even inside a flush: appended, never flushed from here.
        stopping = not getattr(self, "_shutdown", True)
        t0 = _perf()
        try:
            original_shutdown(self)
        finally:
            if stopping and getattr(self, "_shutdown", False) \
                    and getattr(self, "_stallscope_thread", None) == threading.get_ident():
                with contextlib.suppress(Exception):  # never an error of ours in the script
                    lid, iter_id = getattr(self, "_stallscope_lid", -1), getattr(self, "_stallscope_iter", -1)
                    events.append("shutdown", lid, iter_id, t0, _perf(), len(getattr(self, "_workers", ())))

    mp_iter._shutdown_workers = _shutdown_workers


#: The iterator whose ``__next__`` is blocked right now and since when: written at process end if set.
_waiting: tuple[Any, int] | None = None
#: This process iterated a DataLoader with num_workers=0 / with workers: where it only loaded batches itself,
#: its exit measures what shared memory would cost them (recorder/shm_cost.py).
loaded_in_process = False
loaded_by_workers = False
#: Per DataLoader of this process: its batches taken so far and the bytes of its first batch's tensors. The
#: loader that gave the most batches (the training loader) sets the size shm_cost measures at.
_batches_by_loader: dict[int, int] = {}
_batch_bytes_by_loader: dict[int, int] = {}


def _note_batch_bytes(loader_id: int, nbytes: Any) -> None:
    if isinstance(nbytes, int) and nbytes > 0:
        _batch_bytes_by_loader[loader_id] = nbytes


def main_batch_nbytes() -> int | None:
    """Bytes per batch of the loader this process took the most batches from (None before any batch)."""
    sized = [lid for lid in _batch_bytes_by_loader if _batches_by_loader.get(lid)]
    if not sized:
        return None
    return _batch_bytes_by_loader[max(sized, key=lambda lid: _batches_by_loader[lid])]


def _record_stall(iterator: Any, t0: int, how: str, message: str | None) -> None:
    """A ``__next__`` that returned no batch, with the workers that owed batches at that moment."""
    pending: list[int] = []
    awaited = None
    dead: list[int] = []
    try:
        task_info = getattr(iterator, "_task_info", None)
        if task_info is not None:  # multi-process: idx -> (worker,) until the batch arrives
            pending = sorted({info[0] for info in task_info.values() if len(info) == 1})
            owed = task_info.get(getattr(iterator, "_rcvd_idx", None))
            awaited = owed[0] if owed is not None and len(owed) == 1 else None
            dead = [i for i, w in enumerate(getattr(iterator, "_workers", ())) if not w.is_alive()]
    except Exception:  # noqa: BLE001, S110 - a torch without these attributes: the stall is still recorded
        pass
    events.emit("next_stall", iterator._stallscope_lid, iterator._stallscope_iter, iterator._stallscope_epoch, t0,
                _perf(), how, message, pending, awaited, dead)


def record_open_next(how: str) -> None:
    """At process end (exit, a fatal signal, ``os._exit``): a ``__next__`` still blocked is a stall."""
    global _waiting
    waiting, _waiting = _waiting, None
    if waiting is not None:
        _record_stall(waiting[0], waiting[1], how, None)


def patch_fetchers(module: Any) -> None:
    for cls in (module._MapDatasetFetcher, module._IterableDatasetFetcher):
        cls._stallscope_ctx = None  # set per instance by the main-process iterator (num_workers=0)
        cls.fetch = workers.timed_fetch(cls.fetch)


_pin_depth = threading.local()


def patch_pin_memory(module: Any) -> None:
    """Time each top-level ``pin_memory`` call (it recurses through the batch structure)."""
    original = module.pin_memory
    if getattr(original, "__stallscope_wrapped__", False):
        return

    def pin_memory(data: Any, device: Any = None) -> Any:
        if getattr(_pin_depth, "active", False):
            return original(data, device)
        _pin_depth.active = True
        t0 = _perf()
        try:
            return original(data, device)
        finally:
            _pin_depth.active = False
            events.emit("pin", threading.current_thread() is threading.main_thread(), t0, _perf())

    pin_memory.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    module.pin_memory = pin_memory

