"""The training process's other Python threads while its step computes: the CPU each took, where it was, and how
long the step's main thread was blocked meanwhile (and their CPU around each batch the process loads itself).

A Python thread running Python holds the interpreter lock; the step's main thread, each time an operator that
released the lock returns, waits to take it back. That wait is blocked time (the thread sleeps on the lock): neither
CPU time nor run-queue time. So the main thread's compute intervals (from the batch it took to its next ``next``)
are split by its CPU clock and its run-queue wait (``/proc/self/task/TID/schedstat``) into CPU, run queue (other
programs or threads taking the cores) and blocked; each other thread's CPU clock is read at the same moments.
Watched are the script's threads and its libraries' (a logger, a metrics exporter, a prefetcher), not stallscope's
and not the DataLoader's pin-memory thread (its cost is transfer's). Where none runs nothing is read: the threads
are listed once a second. At the step sampler's moments the watched threads' frames are counted (where they spend).

The totals go out cumulatively as one ``threads_info`` event every few seconds and at exit. Nothing here raises
into the script.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

from stallscope.constants import LIBRARY_ROOTS
from stallscope.recorder import events

_perf = time.perf_counter_ns
#: How often the threads are listed again.
LIST_EVERY_NS = 1_000_000_000
#: How often the totals go out.
EMIT_EVERY_NS = 5_000_000_000
#: Lines kept per thread.
LINES = 5
_OWN_PREFIX = "stallscope"
_PIN_MEMORY = "_pin_memory_loop"

watched: list[tuple[int, str, str, int]] = []  # ident, name, target, CPU clock id
_next_list = 0
_next_emit = 0
_at: tuple[int, int, int, list[int]] | None = None  # an interval's start: wall, CPU, run queue, the others' CPU
_schedstat: int | None = None
_main = threading.main_thread().ident
_totals = [0, 0, 0, 0]  # wall, CPU, run queue, intervals
_thread_cpu: dict[int, int] = {}
_thread_lines: dict[int, dict[tuple[str, int, str], int]] = {}
_names: dict[int, tuple[str, str]] = {}
_looked: dict[int, int] = {}  # a thread's CPU clock when its frame was last looked at
_WAITING = (f"{os.sep}threading.py", f"{os.sep}queue.py", f"{os.sep}selectors.py")
_registered = False


def resumed() -> None:
    """The main thread took its batch and computes (``step_sampler.batch_taken``, main thread only)."""
    global _at
    now = _perf()
    if now >= _next_list:
        _list_threads(now)
    if not watched:
        return
    try:
        _at = (now, time.thread_time_ns(), _run_queue_ns(), [time.clock_gettime_ns(c) for _, _, _, c in watched])
    except OSError:  # a watched thread ended: list them again next time
        _at = None
        watched.clear()


def paused() -> None:
    """The main thread asks for its next batch: the compute interval ends."""
    global _at, _next_emit
    start = _at
    if start is None:
        return
    _at = None
    try:
        now, cpu, queued = _perf(), time.thread_time_ns(), _run_queue_ns()
        others = [time.clock_gettime_ns(c) for _, _, _, c in watched]
    except OSError:
        watched.clear()
        return
    _totals[0] += now - start[0]
    _totals[1] += cpu - start[1]
    _totals[2] += queued - start[2]
    _totals[3] += 1
    for (ident, *_), before, after in zip(watched, start[3], others):
        _thread_cpu[ident] = _thread_cpu.get(ident, 0) + max(0, after - before)
    if now >= _next_emit:
        _next_emit = now + EMIT_EVERY_NS
        emit()


def others_cpu_ns() -> int:
    """The watched threads' CPU so far, summed; -1 where none is watched. Read around a batch the training process
    loads itself (``num_workers=0``, ``workers.timed_fetch``): the batch waits for the interpreter as the step
    does."""
    now = _perf()
    if now >= _next_list:
        _list_threads(now)
    if not watched:
        return -1
    try:
        return sum(time.clock_gettime_ns(c) for _, _, _, c in watched)
    except OSError:  # a watched thread ended: list them again next time
        watched.clear()
        return -1


def _list_threads(now: int) -> None:
    global _next_list, _registered
    _next_list = now + LIST_EVERY_NS
    found = []
    for thread in threading.enumerate():
        ident = thread.ident
        if ident is None or ident == _main or thread.name.startswith(_OWN_PREFIX) or not thread.is_alive():
            continue
        target = getattr(thread, "_target", None)
        target_name = getattr(target, "__qualname__", None) or type(thread).__qualname__
        if target_name == _PIN_MEMORY:
            continue
        try:
            found.append((ident, thread.name, target_name, time.pthread_getcpuclockid(ident)))
        except (OSError, AttributeError):
            continue
        _names[ident] = (thread.name, target_name)
    watched[:] = found
    if found and not _registered:
        _registered = True
        atexit.register(emit)


def _run_queue_ns() -> int:
    """The main thread's run-queue wait so far (0 where the kernel does not say)."""
    global _schedstat
    if _schedstat is None:
        try:
            _schedstat = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
        except OSError:
            _schedstat = -1
    if _schedstat < 0:
        return 0
    try:
        return int(os.pread(_schedstat, 128, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def count_frames() -> None:
    """Where each watched thread that ran since its last look is: its innermost frame outside the standard library
    (a ``json.dumps`` is charged to the line that called it); a thread asleep is not counted. Called at the step
    sampler's moments (``stacks.py``), in the main thread while it holds the interpreter lock: a thread that runs
    Python is then caught where it had to give the lock up."""
    frames = sys._current_frames()
    for ident, _, _, clock in watched:
        try:
            cpu = time.clock_gettime_ns(clock)
        except OSError:
            continue
        ran, _looked[ident] = cpu != _looked.get(ident), cpu
        frame = frames.get(ident)
        if not ran or frame is None or frame.f_code.co_filename.endswith(_WAITING):
            continue  # asleep now (a lock, a condition, a queue)
        innermost = frame
        while frame is not None and frame.f_code.co_filename.startswith(LIBRARY_ROOTS):
            frame = frame.f_back
        frame = frame or innermost
        code = frame.f_code
        key = (code.co_filename, frame.f_lineno or 0, getattr(code, "co_qualname", code.co_name))
        lines = _thread_lines.setdefault(ident, {})
        lines[key] = lines.get(key, 0) + 1
    del frames


def emit() -> None:
    """The totals so far, as one cumulative ``threads_info`` event."""
    if not _totals[3]:
        return
    try:
        threads = []
        for ident, cpu in sorted(_thread_cpu.items(), key=lambda kv: -kv[1]):
            name, target = _names.get(ident, ("?", "?"))
            lines = sorted(_thread_lines.get(ident, {}).items(), key=lambda kv: -kv[1])[:LINES]
            threads.append({"name": name, "target": target, "cpu_ns": cpu,
                            "lines": [[file, line, function, n] for (file, line, function), n in lines]})
        events.emit("threads_info", _perf(), {"wall_ns": _totals[0], "cpu_ns": _totals[1], "run_queue_ns": _totals[2],
                                              "intervals": _totals[3], "threads": threads})
    except Exception:  # noqa: BLE001, S110 - never into the script
        pass


def _after_fork_in_child() -> None:
    """A forked child computes no step of the parent's: nothing carried over."""
    global _at, _schedstat, _next_list, _registered
    _at, _schedstat, _next_list, _registered = None, None, 0, False
    watched.clear()
    _totals[:] = [0, 0, 0, 0]
    _thread_cpu.clear()
    _thread_lines.clear()
    _looked.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
