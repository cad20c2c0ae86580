"""Time library calls made while a batch is being fetched, by node.

Inside a fetch (a DataLoader worker producing one batch, or the main process when
``num_workers=0``), calls into decoders, transforms and collate are timed with wall and
thread-CPU clocks. Time is *exclusive*: a call's nested instrumented calls of another node
are subtracted from it, and nested calls of the same node pass straight through untimed
(``F.resize`` inside ``RandomResizedCrop`` stays transform time and costs nothing extra).

Outside a fetch every wrapper is a single attribute check and a call.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

_perf = time.perf_counter_ns
_cpu = time.thread_time_ns


#: A timed call starting within this many ns of the last clock reading of its fetch takes its CPU
#: start from that reading plus the wall time since, instead of reading the thread's CPU clock (a
#: system call, a few us each in a busy worker, two per timed call otherwise). Calls of one sample
#: follow each other within 2-40 us (a Compose step, ``nn.Module.__call__``). Exact while the thread
#: stays on the CPU in between; time blocked there (a short file open) moves from the call's node
#: to the fetch's unattributed CPU, at most this much per call. A preemption lasts longer, so the
#: clock is read again after one.
CPU_CLOCK_REUSE_NS = 50_000


#: What timing one library call costs in a busy worker (two clock reads, a frame, a table update); less on a machine
#: without nested virtualization and cache-hungry neighbours (calibration: rec-timed-call-cost).
TIMED_CALL_COST_NS = 10_000
#: The share of a worker's fetch time that call timing may cost on average. Where timing every call
#: would cost more (many cheap calls per batch), only every n-th batch is call-timed: see
#: ``timing_interval``. Every batch still records its wall, CPU and run-queue time.
CALL_TIMING_BUDGET = 0.005
#: At least one batch in this many is call-timed, however cheap its calls.
MAX_TIMING_INTERVAL = 16


#: The label of ``Image.convert`` on an image already decoded: a pixel conversion (transform), where a convert
#: that decodes the image first (torchvision's loader converts right after ``open``) is ``Image.convert`` (decode).
#: Each label belongs to one node.
DECODED_CONVERT = "Image.convert (decoded image)"


class FetchAccount:
    """What one batch fetch spent, per call name (and so per node). Plain lists keep it cheap: each name's row is
    ``[wall_ns, cpu_ns, calls, node]``."""

    __slots__ = ("stack", "by_name", "mark_wall", "mark_cpu")

    def __init__(self) -> None:
        # Each frame: [node, child_wall, child_cpu] (see _timed_invoke)
        self.stack: list[list[Any]] = []
        self.by_name: dict[str, list[Any]] = {}  # [wall_ns, cpu_ns, calls, node]
        # The last (wall, CPU) clock pair read in this fetch: see CPU_CLOCK_REUSE_NS.
        self.mark_wall = -CPU_CLOCK_REUSE_NS
        self.mark_cpu = 0

    @property
    def by_node(self) -> dict[str, list[int]]:
        """``[wall, cpu, calls]`` per node, summed from the names once per fetch rather than kept per call."""
        totals: dict[str, list[int]] = {}
        for wall, cpu, count, node in self.by_name.values():
            row = totals.setdefault(node, [0, 0, 0])
            row[0] += wall
            row[1] += cpu
            row[2] += count
        return totals


class _FetchLocal(threading.local):
    """Per thread: the account of the fetch in progress. The class default makes a lookup in a
    thread that never fetched a hit, not a miss (a miss raises and catches inside ``getattr``)."""

    account: FetchAccount | None = None


_local = _FetchLocal()


def timing_interval(account: FetchAccount, fetch_wall_ns: int) -> int:
    """How many batches until the next call-timed one, given what timing this one's calls cost.

    The estimated cost (calls x ``TIMED_CALL_COST_NS``) against ``CALL_TIMING_BUDGET`` of the
    batch's wall time: 1 (every batch) where calls are few or slow, as with JPEG decoding; up to
    ``MAX_TIMING_INTERVAL`` where a batch is many cheap calls. The per-node split of the batches in
    between is estimated from the timed ones (``analyze.pipeline.loader_cpu_shares``): the split of
    a batch's CPU between nodes is what varies least from batch to batch, while its wall, CPU and
    blocked time, measured for every batch, carry the variation.
    """
    calls_made = 0
    for row in account.by_name.values():
        calls_made += row[2]
    allowed = CALL_TIMING_BUDGET * max(fetch_wall_ns, 1)
    cost = calls_made * TIMED_CALL_COST_NS
    if cost <= allowed:
        return 1
    return min(MAX_TIMING_INTERVAL, -int(-cost // allowed))


def begin_fetch() -> FetchAccount:
    account = FetchAccount()
    _local.account = account
    return account


def end_fetch() -> None:
    _local.account = None


def current_account() -> FetchAccount | None:
    return _local.account


def timed_call(fn: Callable[..., Any], node: str, name: str | None = None) -> Callable[..., Any]:
    """Wrap ``fn`` so that calls inside a fetch are charged to ``node`` under ``name``."""
    if getattr(fn, "__stallscope_wrapped__", False):
        return fn
    label = name or str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", "call"))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        account = _local.account
        if account is None or (account.stack and account.stack[-1][0] == node):
            return fn(*args, **kwargs)
        return _timed_invoke(account, node, label, fn, args, kwargs)

    wrapper.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def timed_method(cls: type, method_name: str, node: str, label_from_instance: bool = True) -> bool:
    """Wrap ``cls.method_name`` in place. Labels use the instance's class name (``RandomResizedCrop``)."""
    original = cls.__dict__.get(method_name)
    if original is None or not callable(original) or getattr(original, "__stallscope_wrapped__", False):
        return False
    if not label_from_instance:
        setattr(cls, method_name, timed_call(original, node, f"{cls.__name__}.{method_name}"))
        return True

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        account = _local.account
        if account is None or (account.stack and account.stack[-1][0] == node):
            return original(self, *args, **kwargs)
        return _timed_invoke(account, node, type(self).__name__, original, (self, *args), kwargs)

    method.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    setattr(cls, method_name, method)
    return True


def timed_method_by_state(cls: type, method_name: str, choose: Callable[[Any], tuple[str, str]]) -> bool:
    """Wrap ``cls.method_name`` in place, its node and label chosen per call from the instance by ``choose`` (a
    cheap attribute read): for a call whose stage is what it does to that object, not its name. The chosen node is
    the wrapper's local ``node``, which the stack sampler reads (``recorder/stacks.py``)."""
    original = cls.__dict__.get(method_name)
    if original is None or not callable(original) or getattr(original, "__stallscope_wrapped__", False):
        return False

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        account = _local.account
        if account is None:
            return original(self, *args, **kwargs)
        node, label = choose(self)
        if account.stack and account.stack[-1][0] == node:
            return original(self, *args, **kwargs)
        return _timed_invoke(account, node, label, original, (self, *args), kwargs)

    method.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    setattr(cls, method_name, method)
    return True


def _timed_invoke(account: FetchAccount, node: str, label: str, fn: Callable[..., Any],
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``fn`` charging its exclusive time to ``label`` (of ``node``). Runs for every timed call
    in a fetch (a dozen per image sample), hence the inlined table update."""
    stack = account.stack
    frame: list[Any] = [node, 0, 0]  # node, then wall and CPU of timed calls nested in this one
    stack.append(frame)
    t0 = _perf()
    since_mark = t0 - account.mark_wall
    if since_mark < CPU_CLOCK_REUSE_NS:
        c0 = account.mark_cpu + since_mark
    else:
        c0 = account.mark_cpu = _cpu()
        account.mark_wall = t0
    try:
        return fn(*args, **kwargs)
    finally:
        c1 = _cpu()
        t1 = account.mark_wall = _perf()
        account.mark_cpu = c1
        cpu = max(0, c1 - c0)
        wall = t1 - t0
        stack.pop()
        own_wall = wall - frame[1]
        own_cpu = cpu - frame[2]
        row = account.by_name.get(label)
        if row is None:
            account.by_name[label] = [own_wall, own_cpu, 1, node]
        else:
            row[0] += own_wall
            row[1] += own_cpu
            row[2] += 1
        if stack:
            parent = stack[-1]
            parent[1] += wall
            parent[2] += cpu


def patch_module_functions(module: Any, names: list[str] | tuple[str, ...], node: str, prefix: str = "") -> int:
    """Wrap the named module-level callables that exist; returns how many were wrapped."""
    count = 0
    for name in names:
        fn = getattr(module, name, None)
        if fn is None or not callable(fn) or isinstance(fn, type):
            continue
        setattr(module, name, timed_call(fn, node, f"{prefix}{name}"))
        count += 1
    return count
