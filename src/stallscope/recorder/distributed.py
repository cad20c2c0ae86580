"""torch.distributed: who each rank is, and the time it spends waiting for the others (the ``sync`` node).

Records, in every rank process:
- ``rank``: rank, local rank, world size, node rank and host, from torchrun's environment at start-up
  or from ``init_process_group`` (scripts that start their ranks with ``torch.multiprocessing.spawn``);
- ``pg_init``: ``init_process_group``'s backend and its start and end. No rank leaves the rendezvous
  before every rank entered it, which is what ``stallscope merge`` aligns node clocks on;
- ``coll``: every collective called from Python (``all_reduce``, ``barrier``, ...), numbered per process
  in call order (ranks of one group call collectives in the same order), and ``Work.wait``;
- ``ddp_wait``: per ``backward`` of a DDP model, when it began, when its last gradient was computed
  and when it returned: the end is the wait for DDP's gradient all-reduce (see :func:`patch_ddp`).
"""

from __future__ import annotations

import functools
import os
import platform
import threading
import time
from typing import Any

from stallscope.job_names import job_identity
from stallscope.recorder import events
from stallscope.settings import ENV_RANK_PID

_perf = time.perf_counter_ns

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


def store_address(env: os._Environ[str] | dict[str, str] | None = None, init_method: Any = None) -> str | None:
    """The job's own store, which every node of the job could reach: ``init_process_group``'s ``tcp://HOST:PORT``,
    else ``MASTER_ADDR:MASTER_PORT``. ``gather`` hands the nodes' sessions over there once the job has let it go."""
    if isinstance(init_method, str) and init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://"):].split("?", 1)[0].rstrip("/").rpartition(":")
        if host and port.isdigit():
            return f"{host.strip('[]')}:{port}"
    env = os.environ if env is None else env
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    return f"{addr}:{port}" if addr and port.isdigit() else None


def _env_int(*names: str) -> int:
    """The first of ``names`` set to an integer (torchrun's, then Slurm's), else -1."""
    for name in names:
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return -1


def mark_rank(rank: int, local_rank: int, world_size: int, node_rank: int, init_method: Any = None) -> None:
    """Say this process is a rank; its workers learn whose they are through the environment."""
    global _is_rank
    first = not _is_rank
    _is_rank = True
    os.environ[ENV_RANK_PID] = str(os.getpid())
    events.emit("rank", rank, local_rank, world_size, node_rank, platform.node(), _perf(), time.time_ns(),
                job_identity(), store_address(init_method=init_method))
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
        # stop DataLoader workers, as Python's own exit would (a private function: not in the stubs)
        multiprocessing.util._exit_function()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass

    events.emit("process_exit", _perf(), None)
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
        env = rank_from_env() or {}  # srun's tasks have no RANK: their own SLURM_* words say where they run
        local_rank = env.get("local_rank", _env_int("LOCAL_RANK", "SLURM_LOCALID"))
        node_rank = env.get("node_rank", _env_int("GROUP_RANK", "SLURM_NODEID"))
        mark_rank(rank, local_rank, world, node_rank, kwargs.get("init_method", args[1] if len(args) > 1 else None))
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
    work: Any = getattr(module, "Work", None)
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


_ddp_forwards = 0  # DDP forwards that prepared a gradient reduction since the last backward
_backward_armed = False  # a timed backward is running and its final callback is not queued yet
_compute_end_ns = 0
_hook_missed = False  # a parameter hook did not fire in some backward: arm every graph's root from then on
_queue_callback: Any = None


def patch_ddp(module: Any) -> None:
    """Time what DDP's gradient reduction makes ``backward`` wait, without touching the reduction.

    DDP all-reduces gradient buckets in C++ while ``backward`` still computes; the training thread
    waits only once every gradient is computed, for the buckets still in flight (and DDP's copy of
    the results into ``.grad``). That wait is measured from outside the reduction, with an autograd
    final callback: it runs when the graph's last node is done and before DDP's own (queued when its
    last bucket becomes ready), and the wait lasts from there to the return of ``backward``. The
    callback is queued by a gradient hook on one parameter of the model, registered once: it runs
    just before DDP's own hook on that parameter, so before the last bucket can be ready, whichever
    parameter it is. Once that parameter went without a gradient in some pass (a dynamic graph), each
    graph's root queues it instead (a pre-hook registered per backward, ~10 us). A few Python calls per
    backward whatever the number of buckets (a Python communication hook would cost ~0.1 ms per
    step), and DDP, the script's own hooks and what training computes stay exactly as they were.
    """
    DDP = module.DistributedDataParallel
    if getattr(DDP._pre_forward, "__stallscope_wrapped__", False):
        return
    import torch

    original_pre_forward = DDP._pre_forward
    is_grad_enabled = torch.is_grad_enabled

    def _pre_forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        global _ddp_forwards
        if self.require_backward_grad_sync and is_grad_enabled():  # DDP prepares a reduction (its own test)
            _ddp_forwards += 1
            if "_stallscope_grad_hook" not in self.__dict__:
                self._stallscope_grad_hook = _hook_last_parameter(self.module)
        return original_pre_forward(self, *inputs, **kwargs)

    _pre_forward.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    DDP._pre_forward = _pre_forward
    _patch_backward(torch)


def _hook_last_parameter(model: Any) -> Any:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params or not hasattr(params[-1], "register_post_accumulate_grad_hook"):
        return None
    return params[-1].register_post_accumulate_grad_hook(_on_gradient)


def _on_gradient(_param: Any) -> None:
    global _backward_armed
    if _backward_armed:  # only in a backward we time, once
        _backward_armed = False
        _queue_callback(_stamp_compute_end)


def _on_graph_start(_grad_outputs: Any) -> None:
    _on_gradient(None)


def _stamp_compute_end() -> None:
    global _compute_end_ns
    _compute_end_ns = _perf()


def _patch_backward(torch: Any) -> None:
    global _queue_callback
    autograd = torch.autograd
    original = autograd.backward
    if getattr(original, "__stallscope_wrapped__", False):
        return
    _queue_callback = autograd.Variable._execution_engine.queue_callback
    Tensor = torch.Tensor

    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        global _ddp_forwards, _backward_armed, _compute_end_ns, _hook_missed
        if not _ddp_forwards:
            return original(tensors, *args, **kwargs)
        _ddp_forwards = 0
        if _hook_missed and not _arm_root(tensors, Tensor):
            return original(tensors, *args, **kwargs)
        _compute_end_ns = 0
        _backward_armed = True
        started = _perf()
        try:
            return original(tensors, *args, **kwargs)
        finally:
            if _backward_armed:  # the hooked parameter got no gradient in this pass
                _backward_armed = False
                _hook_missed = True
            elif _compute_end_ns:
                events.emit("ddp_wait", started, _compute_end_ns, _perf())

    backward.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    autograd.backward = backward


def _arm_root(tensors: Any, Tensor: type[Any]) -> bool:
    """Queue the callback from the graph's root instead (~10 us more per backward than the parameter hook)."""
    root = tensors if isinstance(tensors, Tensor) else next(
        (t for t in tensors if isinstance(t, Tensor) and t.grad_fn is not None), None)
    grad_fn = root.grad_fn if root is not None else None
    if grad_fn is None:
        return False
    grad_fn.register_prehook(_on_graph_start)
    return True
