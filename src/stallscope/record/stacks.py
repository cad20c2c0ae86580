"""Sample the Python stack of the thread fetching a batch, in the process that fetches it.

Each process that fetches batches (a DataLoader worker under fork, spawn or forkserver; the training process
itself with ``num_workers=0``) starts a daemon thread on its first fetch. While a fetch is in progress that
thread looks at the fetching thread's stack (``sys._current_frames``) at a jittered interval (a fixed one
would alias with a periodic workload) and counts ``(loader, stage, stack)``; the counts go out as one
``stack_samples`` event every few seconds, when fetching stops for a while and at process exit, so the event
volume stays small whatever the rate. The fetch itself only sets and clears one module global
(``fetch_started``/``fetch_ended``): everything else happens in the sampler's thread.

A sample's stage is read from the stack: the innermost ``calls`` wrapper in it (a timed library call in
progress, timed or passed through untimed) names its node; outside any, the fetching thread's CPU clock and
run-queue wait over the interval since the previous sample (``/proc/self/task/TID/schedstat``) tell blocked
time (``storage``, as the worker-time split charges it) from CPU time (``transform``). Only frames inside the
fetch are kept (outer ones are the loader's machinery, or under fork the training loop the worker was forked
from), innermost first, without stallscope's own.

Where sampling cannot run (no ``sys._current_frames``, no thread can be started, turned off with
``STALLSCOPE_STACK_SAMPLE_HZ=0``) the process writes one ``stack_sampler_off`` event with the reason and the
fetches go on unsampled. Nothing here raises into the script.
"""

from __future__ import annotations

import atexit
import os
import random
import sys
import threading
import time
from typing import Any

from stallscope.record import events
from stallscope.settings import ENV_STACK_SAMPLE_HZ

#: Mean samples per second while a fetch is in progress, chosen by benchmarks/fetch_overhead.py (``default``
#: against ``nostacks``, 2-core VM, 2026-12-01): at 67 Hz a sample cost ~240 us of the worker's wall time (the
#: GIL handed over and back, ~40 frames materialized and walked), +1.6% of a 44 ms batch; the rate is set for
#: about a third of that. A minute of fetching still gives ~1,000 samples per worker.
DEFAULT_HZ = 19.0
#: Counts are written out at least this often, so a worker killed outright loses at most this much.
EMIT_EVERY_NS = 3_000_000_000
#: The sampler thread ends after this long without a fetch (a new fetch starts it again).
IDLE_STOP_NS = 1_000_000_000
#: Innermost frames kept per sample (a dataset's own code is rarely deeper).
MAX_DEPTH = 40
#: The interpreter's switch interval while the sampler runs, in a process with no other Python thread of its own.
#: The sampler waits for the GIL up to the switch interval (5 ms by default) before the fetching thread is made
#: to hand it over; any point where that thread releases the GIL by itself (a torch op, a read) within that wait
#: takes the sample instead, so a 5 ms wait drew 55% of a pure-Python loop's samples to the one ``torch.full``
#: after it. A 0.1 ms wait leaves such points the few percent they cost.
SWITCH_INTERVAL_S = 0.0001

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HERE) + os.sep
_CALLS_FILE = os.path.join(_HERE, "calls.py")
_WORKERS_FILE = os.path.join(_HERE, "workers.py")
_WRAPPER_NAMES = frozenset({"wrapper", "method", "_timed_invoke"})
_KEEP, _SKIP, _WRAPPER, _FETCH = 0, 1, 2, 3

#: (thread ident, loader id) of the fetch in progress in this process; None between fetches.
_fetching: tuple[int, int] | None = None
#: A sampler thread runs in this process, or it was found impossible (then it is not tried again).
_started = False
_generation = 0
#: (loader id, stage, ((code, line), ...)) -> samples not yet written out.
_counts: dict[tuple[int, str, tuple[Any, ...]], int] = {}
_counts_lock = threading.Lock()
#: Thread CPU the sampler has spent in this process (benchmarks/fetch_overhead.py reads it).
sampler_cpu_ns = 0
_kinds: dict[Any, int] = {}
_exit_hooked = False


def fetch_started(loader_id: int) -> None:
    """A fetch begins in this thread (called by ``workers.timed_fetch``): the hot path, one assignment."""
    global _fetching
    if not _started:
        _start()
    _fetching = (threading.get_ident(), loader_id)


def fetch_ended() -> None:
    global _fetching
    _fetching = None


def _start() -> None:
    global _started, _generation
    _started = True
    try:
        raw = os.environ.get(ENV_STACK_SAMPLE_HZ, "")
        try:
            hz = float(raw) if raw.strip() else DEFAULT_HZ
        except ValueError:
            hz = 0.0
        if not hz > 0:
            _off(f"turned off ({ENV_STACK_SAMPLE_HZ}={raw})")
            return
        frames = getattr(sys, "_current_frames", None)
        if frames is None:
            _off("sys._current_frames is not available in this interpreter")
            return
        _hook_exit()
        _generation += 1
        threading.Thread(target=_loop, args=(_generation, 1.0 / hz, frames), name="stallscope-stacks",
                         daemon=True).start()
    except Exception as exc:  # noqa: BLE001 - never into the script: the fetch goes on unsampled
        _off(f"the sampler thread could not start ({type(exc).__name__}: {exc})")


def _off(reason: str) -> None:
    events.emit("stack_sampler_off", time.perf_counter_ns(), reason)


def _hook_exit() -> None:
    """Write the last counts out at exit: ``atexit`` in the training process, multiprocessing's finalizers in
    workers (they leave through ``os._exit``); the priority runs it before the events' own final flush."""
    global _exit_hooked
    if _exit_hooked:
        return
    _exit_hooked = True
    atexit.register(emit_counts)
    try:
        import multiprocessing.util

        multiprocessing.util.Finalize(None, emit_counts, exitpriority=101)
    except Exception:  # noqa: BLE001, S110 - atexit still writes them in the training process
        pass


def emit_counts() -> None:
    """Write the counts so far as one ``stack_samples`` event (frames as ``file:line:function``)."""
    global _counts
    with _counts_lock:
        counts, _counts = _counts, {}
    if not counts:
        return
    rows = [[loader_id, stage, [f"{code.co_filename}:{line}:{getattr(code, 'co_qualname', code.co_name)}"
                                for code, line in stack], n]
            for (loader_id, stage, stack), n in counts.items()]
    events.emit("stack_samples", time.perf_counter_ns(), rows)


def _kind(code: Any) -> int:
    kind = _kinds.get(code)
    if kind is None:
        path = code.co_filename
        if not path.startswith(_PACKAGE):
            kind = _KEEP
        elif path == _CALLS_FILE and code.co_name in _WRAPPER_NAMES:
            kind = _WRAPPER
        elif path == _WORKERS_FILE and code.co_name == "fetch":
            kind = _FETCH
        else:
            kind = _SKIP
        _kinds[code] = kind
    return kind


def stack_of(frame: Any) -> tuple[str | None, tuple[tuple[Any, int], ...]]:
    """(stage of the innermost timed library call or None, ((code, line), ...) innermost first) of the frames
    inside the fetch."""
    stage = None
    kept: list[tuple[Any, int]] = []
    while frame is not None:
        code = frame.f_code
        kind = _kinds.get(code)
        if kind is None:
            kind = _kind(code)
        if kind == _FETCH:
            break
        if kind == _KEEP:
            if len(kept) < MAX_DEPTH:
                kept.append((code, frame.f_lineno))
        elif kind == _WRAPPER and stage is None:
            stage = frame.f_locals.get("node")
        frame = frame.f_back
    return stage, tuple(kept)


class _SchedClock:
    """A thread's (CPU ns, run-queue ns) from ``/proc/self/task/TID/schedstat``, the file kept open."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}

    def read(self, tid: int | None) -> tuple[int, int] | None:
        if tid is None:
            return None
        try:
            fd = self.fds.get(tid)
            if fd is None:
                fd = self.fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            cpu, runqueue = os.pread(fd, 256, 0).split()[:2]
            return int(cpu), int(runqueue)
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()


def _native_id(ident: int) -> int | None:
    thread = threading._active.get(ident)  # type: ignore[attr-defined]
    return getattr(thread, "native_id", None)


def _shorten_switch_interval() -> float | None:
    """Set ``SWITCH_INTERVAL_S`` where every other live thread is stallscope's own (a worker, usually); the
    previous interval, to put back, or None where the script runs threads of its own (left as it is)."""
    if any(not t.name.startswith("stallscope") for t in threading.enumerate()
           if t is not threading.current_thread() and t.ident not in _fetching_threads()):
        return None
    previous = sys.getswitchinterval()
    if previous > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        return previous
    return None


def _fetching_threads() -> set[int]:
    fetching = _fetching
    return {fetching[0]} if fetching is not None else {threading.main_thread().ident or 0}


def _loop(generation: int, interval_s: float, current_frames: Any) -> None:
    global sampler_cpu_ns
    restore = _shorten_switch_interval()
    pid = os.getpid()
    rng = random.Random(pid)
    clock = _SchedClock()
    perf, cpu = time.perf_counter_ns, time.thread_time_ns
    last_emit = idle_since = perf()
    previous: tuple[int, int, int, int] | None = None  # tid, wall, CPU, run-queue at the last sample
    try:
        while generation == _generation and os.getpid() == pid:
            time.sleep(interval_s * (0.5 + rng.random()))
            c0 = cpu()
            now = perf()
            fetching = _fetching
            if fetching is None:
                if now - idle_since > IDLE_STOP_NS:
                    break
                previous = None
            else:
                idle_since = now
                ident, loader_id = fetching
                frame = current_frames().get(ident)
                if frame is not None:
                    stage, stack = stack_of(frame)
                    del frame
                    tid = _native_id(ident)
                    reading = clock.read(tid)
                    if stage is None:
                        stage = "transform"
                        if reading is not None and previous is not None and previous[0] == tid:
                            wall = now - previous[1]
                            off_cpu = wall - (reading[0] - previous[2]) - (reading[1] - previous[3])
                            if off_cpu * 2 > wall:
                                stage = "storage"
                    previous = (tid, now, *reading) if reading is not None and tid is not None else None
                    key = (loader_id, stage, stack)
                    with _counts_lock:
                        _counts[key] = _counts.get(key, 0) + 1
                if now - last_emit > EMIT_EVERY_NS:
                    last_emit = now
                    emit_counts()
            sampler_cpu_ns += cpu() - c0
    except Exception:  # noqa: BLE001, S110 - the sampler stops; the fetches go on unsampled
        pass
    finally:
        clock.close()
        if restore is not None and sys.getswitchinterval() == SWITCH_INTERVAL_S:
            sys.setswitchinterval(restore)
        _stopped(generation)


def _stopped(generation: int) -> None:
    """The thread ends (idle, or its process is ending): counts out; a later fetch starts a new thread."""
    global _started
    try:
        emit_counts()
    except Exception:  # noqa: BLE001, S110 - interpreter teardown: these counts are lost
        pass
    if generation == _generation:
        _started = False


def _after_fork_in_child() -> None:
    """A forked child does not inherit the parent's sampler: its thread is gone, its counts are the parent's."""
    global _fetching, _started, _generation, _counts, _counts_lock, _exit_hooked, sampler_cpu_ns
    _fetching = None
    _started = False
    _generation += 1
    _counts = {}
    _counts_lock = threading.Lock()
    _exit_hooked = False
    sampler_cpu_ns = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
