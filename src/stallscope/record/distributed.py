"""torch.distributed: who each rank is, and the time it spends waiting for the others (the ``sync`` node).

Records, in every rank process:
- ``rank``: rank, local rank, world size, node rank and host, from torchrun's environment at start-up
  or from ``init_process_group`` (scripts that start their ranks with ``torch.multiprocessing.spawn``);
- ``pg_init``: ``init_process_group``'s backend and its start and end. No rank leaves the rendezvous
  before every rank entered it, which is what ``stallscope merge`` aligns node clocks on;
- ``coll``: every collective called from Python (``all_reduce``, ``barrier``, ...), numbered per process
  in call order (ranks of one group call collectives in the same order), and ``Work.wait``;
- ``ddp``: each DDP gradient bucket, from the moment it is handed to the all-reduce to the moment its
  result is back. DDP reduces gradients in C++, so the script's own communication hook is timed, or,
  when it registered none, one that does exactly what DDP's built-in all-reduce does (scale by
  ``1 / world_size`` with the same multiplication, then sum), so training computes identically.
"""

from __future__ import annotations

import functools
import os
import platform
import threading
import time
from typing import Any

from stallscope.record import events

_perf = time.perf_counter_ns
ENV_RANK_PID = "STALLSCOPE_RANK_PID"

#: Collectives of ``torch.distributed`` timed when called from Python (only the outermost call counts).
COLLECTIVES: tuple[str, ...] = (
    "all_reduce", "broadcast", "barrier", "monitored_barrier", "all_gather", "all_gather_into_tensor",
    "reduce_scatter", "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all",
    "all_to_all_single", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    "all_reduce_coalesced", "all_gather_coalesced", "batch_isend_irecv",
)

_local = threading.local()
_seq = 0
_is_rank = False
_became_rank_hook: Any = None  # set by the bootstrap: starts flushing and exit recording in a new rank process


def rank_from_env(env: os._Environ[str] | dict[str, str] | None = None) -> dict[str, Any] | None:
    """torchrun's identity variables, or None outside a rank process."""
    env = os.environ if env is None else env
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        return {
            "rank": int(env["RANK"]),
            "local_rank": int(env.get("LOCAL_RANK", -1)),
            "world_size": int(env["WORLD_SIZE"]),
            "node_rank": int(env.get("GROUP_RANK", env.get("ROLE_RANK", -1)) or -1),
        }
    except ValueError:
        return None


def mark_rank(rank: int, local_rank: int, world_size: int, node_rank: int) -> None:
    """Say this process is a rank; its workers learn whose they are through the environment."""
    global _is_rank
    first = not _is_rank
    _is_rank = True
    os.environ[ENV_RANK_PID] = str(os.getpid())
    events.emit("rank", rank, local_rank, world_size, node_rank, platform.node(), _perf(), time.time_ns())
    if first and _became_rank_hook is not None:
        _became_rank_hook()


def _next_seq() -> int:
    global _seq
    _seq += 1
    return _seq - 1


def _timed_collective(name: str, original: Any) -> Any:
    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "depth", 0):
            return original(*args, **kwargs)
        _local.depth = 1
        t0 = _perf()
        try:
            return original(*args, **kwargs)
        finally:
            t1 = _perf()
            _local.depth = 0
            events.emit("coll", name, _next_seq(), _group_size(args, kwargs), bool(kwargs.get("async_op")), t0, t1)

    collective.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return collective


def _group_size(args: Any, kwargs: Any) -> int:
    group = kwargs.get("group")
    try:
        import torch.distributed as dist

        return int(dist.get_world_size(group)) if group is not None else int(dist.get_world_size())
    except Exception:
        return -1


#: Set when ``--steps N`` ends this rank; the process group is then destroyed at exit (see below).
stopped_by_step_limit = False
#: Set by the exception hook when an exception other than SystemExit ended the script.
uncaught_exception = False


def _leave_after_step_limit(module: Any) -> None:
    """At exit of a torchrun rank that ``--steps`` stopped: destroy its process group, then leave at once.

    Such a rank skips the script's own ``destroy_process_group``, and torch's C++ teardown of a live
    gloo group aborts now and then ("terminate called without an active exception", SIGABRT; seen
    without stallscope too, about 1 exit in 15), which would turn our clean stop into a failed job.
    Registered when torch.distributed is imported, so the script's later exit handlers have run by
    now; what is left of Python's shutdown (stopping DataLoader workers, flushing) is done here,
    before ``os._exit``: with 0, or 1 when an exception escaped the script after the stop, as Python
    itself would exit. A process without an initialised process group exits normally.
    """
    if not stopped_by_step_limit:
        return
    try:
        if not module.is_initialized():
            return  # not a rank with a live group: Python's own exit is fine
        module.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass
    import logging
    import multiprocessing.util
    import sys

    try:
        multiprocessing.util._exit_function()  # stop DataLoader workers, as Python's own exit would
    except Exception:  # noqa: BLE001
        pass

    events.emit("process_exit", _perf())
    events.flush()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream
            pass
    os._exit(1 if uncaught_exception else 0)


def patch_c10d(module: Any) -> None:
    """Wrap ``init_process_group``, the collectives and ``Work.wait`` (``torch.distributed.distributed_c10d``)."""
    if getattr(module.init_process_group, "__stallscope_wrapped__", False):
        return
    import atexit

    atexit.register(_leave_after_step_limit, module)
    original_init = module.init_process_group

    @functools.wraps(original_init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        t0 = _perf()
        result = original_init(*args, **kwargs)
        t1 = _perf()
        wall = time.time_ns()
        try:
            rank, world = int(module.get_rank()), int(module.get_world_size())
            backend = str(module.get_backend())
        except Exception:
            rank, world, backend = -1, -1, "?"
        env = rank_from_env() or {}
        local_rank = env.get("local_rank", int(os.environ.get("LOCAL_RANK", -1)))
        mark_rank(rank, local_rank, world, env.get("node_rank", -1))
        events.emit("pg_init", backend, rank, world, t0, t1, wall)
        events.flush()
        return result

    init_process_group.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    module.init_process_group = init_process_group
    for name in COLLECTIVES:
        original = getattr(module, name, None)
        if callable(original) and not getattr(original, "__stallscope_wrapped__", False):
            setattr(module, name, _timed_collective(name, original))
    # ``torch.distributed`` re-exports these; when it is already imported, its names are rebound too.
    import sys

    package = sys.modules.get("torch.distributed")
    if package is not None and package is not module:
        for name in ("init_process_group", *COLLECTIVES):
            if hasattr(package, name) and hasattr(module, name):
                setattr(package, name, getattr(module, name))
    _patch_work_wait(module)


def _patch_work_wait(module: Any) -> None:
    work = getattr(module, "Work", None)
    original = getattr(work, "wait", None)
    if original is None or getattr(original, "__stallscope_wrapped__", False):
        return

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "depth", 0):
            return original(self, *args, **kwargs)
        t0 = _perf()
        try:
            return original(self, *args, **kwargs)
        finally:
            events.emit("coll", "wait", -1, -1, False, t0, _perf())

    wait.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    try:
        work.wait = wait
    except (TypeError, AttributeError):
        pass


def _timed_hook(hook: Any) -> Any:
    """A DDP comm hook that also records when each bucket was handed over and when its result came back."""

    @functools.wraps(hook)
    def timed(state: Any, bucket: Any) -> Any:
        launched = _perf()
        index = bucket.index()
        depth = getattr(_local, "depth", 0)
        _local.depth = 1  # the hook's own all_reduce is this bucket, not a separate collective
        try:
            future = hook(state, bucket)
        finally:
            _local.depth = depth

        # A done-callback, not ``then``: no chained future for DDP to wait on (cheaper per bucket).
        future.add_done_callback(lambda _fut: events.emit("ddp", index, launched, _perf()))
        return future

    return timed


def _stand_in_hook(late: list[Any]) -> Any:
    """DDP's built-in all-reduce, timed per bucket, until the script registers a hook of its own after
    the first forward; then that hook, with its state (``late`` is ``[state, hook]`` once set).

    This runs once per bucket per step, so it is kept lean: :func:`_scaled_allreduce`, and one
    callback that both stamps the bucket's return and hands DDP its tensor.
    """

    def stand_in(process_group, bucket):  # no annotations: DDP checks them
        if late:
            return late[1](late[0], bucket)  # the script's hook, already wrapped by _timed_hook
        launched = _perf()
        index = bucket.index()
        return _scaled_allreduce(process_group, bucket).then(lambda fut: _bucket_returned(index, launched, fut))

    return stand_in


def _bucket_returned(index: int, launched: int, fut: Any) -> Any:
    events.emit("ddp", index, launched, _perf())
    return fut.value()[0]


def _python_builtin_hook(comm_hook_type: Any) -> Any | None:
    """The Python twin of a C++ built-in hook registered too late for the reducer, or None."""
    name = getattr(comm_hook_type, "name", str(comm_hook_type))
    if name.endswith("ALLREDUCE"):
        return builtin_allreduce_hook
    if name.endswith("FP16_COMPRESS"):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

        return fp16_compress_hook
    return None


def builtin_allreduce_hook(process_group, bucket):  # no annotations: DDP checks them
    """DDP's built-in gradient all-reduce, in Python: scale by ``1 / world_size`` (the same multiply the
    C++ reducer does), then sum across ranks."""
    return _scaled_allreduce(process_group, bucket).then(lambda fut: fut.value()[0])


def _scaled_allreduce(process_group: Any, bucket: Any) -> Any:
    """Scale the bucket by ``1 / world_size`` (the C++ reducer's multiply), then sum across ranks: a future
    of ``[tensor]``. The group's own ``allreduce``, not ``dist.all_reduce``, whose Python checks cost more
    than the rest of a hook run once per bucket per step."""
    if process_group is None:
        import torch.distributed as dist

        process_group = dist.group.WORLD
    tensor = bucket.buffer()
    tensor.mul_(1.0 / process_group.size())
    return process_group.allreduce([tensor]).get_future()


def patch_ddp(module: Any) -> None:
    """Time the script's comm hook, or install a timed built-in equivalent before the first forward."""
    DDP = module.DistributedDataParallel
    if getattr(DDP.register_comm_hook, "__stallscope_wrapped__", False):
        return
    original_register = DDP.register_comm_hook
    original_builtin = DDP._register_builtin_comm_hook
    original_pre_forward = DDP._pre_forward

    def register_comm_hook(self: Any, state: Any, hook: Any) -> None:
        if getattr(self, "_stallscope_late_hook", None) is not None:
            # Our stand-in for the built-in all-reduce is already registered (DDP takes one hook, once):
            # from now on it hands every bucket to the script's hook, as DDP itself would have.
            self._stallscope_late_hook[:] = [state, _timed_hook(hook)]
            return None
        self._stallscope_hooked = True
        return original_register(self, state, _timed_hook(hook))

    def _register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        if getattr(self, "_stallscope_late_hook", None) is not None:
            late = _python_builtin_hook(comm_hook_type)
            if late is not None:
                self._stallscope_late_hook[:] = [self.process_group, _timed_hook(late)]
                return None
        self._stallscope_hooked = True  # a C++ hook: not timed
        return original_builtin(self, comm_hook_type)

    def _pre_forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_stallscope_hooked", False):
            self._stallscope_hooked = True
            if _default_reduction(self):
                late: list[Any] = []
                try:
                    original_register(self, self.process_group, _stand_in_hook(late))
                    self._stallscope_late_hook = late
                except Exception:
                    pass
        return original_pre_forward(self, *inputs, **kwargs)

    register_comm_hook.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    DDP.register_comm_hook = functools.wraps(original_register)(register_comm_hook)
    DDP.register_comm_hook.__stallscope_wrapped__ = True
    DDP._register_builtin_comm_hook = _register_builtin_comm_hook
    DDP._pre_forward = _pre_forward


def _default_reduction(ddp: Any) -> bool:
    """True when DDP would use its built-in all-reduce: no hook, no mixed precision, the C++ reducer,
    a dense floating-point model on the CPU or one device, and a process group of the script's world."""
    if getattr(ddp, "_comm_hooks", None) or getattr(ddp, "_use_python_reducer", False):
        return False
    if getattr(ddp, "mixed_precision", None) is not None or getattr(ddp, "_delay_all_reduce_all_params", False):
        return False
    if getattr(ddp, "reducer", None) is None:
        return False
    try:
        params = [p for p in ddp.module.parameters() if p.requires_grad]
        return all(not p.is_sparse and p.dtype.is_floating_point for p in params)
    except Exception:
        return False
