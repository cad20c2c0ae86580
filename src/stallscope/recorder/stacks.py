"""Sample the Python stack of the thread fetching a batch, in the process that fetches it.

Each process that fetches batches (a DataLoader worker under fork, spawn or forkserver; the training process
itself with ``num_workers=0``) samples the fetching thread's stack while a fetch is in progress, at jittered
moments (a fixed period would alias with a periodic workload), and counts ``(loader, stage, stack)``; the counts
go out as one ``stack_samples`` event every few seconds (at the end of a fetch) and at process exit, so the event
volume stays small whatever the rate.

Where the fetching thread is the main thread (it is in workers and with ``num_workers=0``), the samples are taken
by a ``SIGALRM`` handler: an ``ITIMER_REAL`` (wall-clock) timer is armed when a fetch starts and disarmed when it
ends, so the sample moments run on a clock of fetch time alone (what is left of an interval at the end of one
fetch carries into the next, so short fetches are sampled in proportion to their time). Python runs the handler
in the main thread at the next bytecode boundary and hands it the interrupted frame: the sample is where the
thread is, a long C call is charged to the line that made it (every sample moment it spanned is counted there),
a ``time.sleep`` or a read is interrupted and resumed (``siginterrupt(SIGALRM, False)``: interrupted system calls
restart). Nothing of the job's own changes: no GIL hand-over, no switch interval, no thread of ours. The handler
counts in place and never writes events or takes a lock. Fork: the child inherits neither the timer (POSIX) nor,
once ``_after_fork_in_child`` has run, the handler; it decides afresh at its first fetch.

The handler is never installed where the script has ``SIGALRM`` (a handler, or ignored) or an ``ITIMER_REAL``
timer (``signal.alarm``, ``setitimer``) of its own, and it gives way (the script's handler or timer is left as
it is) when the script takes either later; a fetch outside the main thread cannot be sampled by it either. Then
a daemon thread samples instead: while a fetch is in progress it reads the fetching thread's stack
(``sys._current_frames``). That sampler is biased toward where the fetching thread releases the GIL by itself (a
torch op, a read: the sampler waits for the GIL up to the switch interval, 5 ms, and any such point within the
wait takes the sample), so a pure-Python loop's line can lose its samples to the next library call; it is left
that way rather than change the job's switch interval.

A sample's stage is read from the stack: the innermost ``calls`` wrapper in it (a timed library call in
progress, timed or passed through untimed) names its node; outside any, the fetching thread's CPU clock and
run-queue wait over the interval since the previous sample or the fetch's start (``/proc/self/task/TID/
schedstat``) tell blocked time (``storage``, as the worker-time split charges it) from CPU time (``transform``).
Only frames inside the fetch are kept (outer ones are the loader's machinery, or under fork the training loop the
worker was forked from), innermost first, without stallscope's own.

Each ``stack_samples`` event names the sampler that took its counts (``signal`` or ``thread``) and, for the
thread sampler, why the signal sampler could not run: the analysis says once when a run's samples carry the
thread sampler's bias. The counts are written out when the signal sampler gives way, so one event never mixes
the two.

Where sampling cannot run (neither sampler can: the handler cannot be installed and there is no
``sys._current_frames``, or no thread can be started; turned off with ``STALLSCOPE_STACK_SAMPLE_HZ=0``) the
process writes one ``stack_sampler_off`` event with the reason and the fetches go on unsampled. Nothing here
raises into the script.
"""

from __future__ import annotations

import atexit
import os
import random
import signal
import sys
import threading
import time
from typing import Any

from stallscope.background import start_thread
from stallscope.recorder import events, step_parts, step_threads
from stallscope.settings import ENV_STACK_SAMPLE_HZ

try:  # the C functions: signal.getsignal's enum conversion costs ~5 us a call
    from _signal import SIG_DFL as _SIG_DFL
    from _signal import getsignal as _getsignal
    from _signal import setitimer as _setitimer
except ImportError:  # not on this platform: the thread sampler only
    _getsignal = _setitimer = _SIG_DFL = None

#: Mean samples per second while a fetch is in progress: low enough to keep the sampler near a third of the 0.5% of
#: fetch time it must stay under, and a minute of fetching still gives ~540 samples per worker (calibration:
#: rec-stack-sample-hz).
DEFAULT_HZ = 9.0
#: Counts are written out at least this often (at the end of a fetch), so a worker killed outright loses at most
#: this much.
EMIT_EVERY_NS = 3_000_000_000
#: The sampler thread ends after this long without a fetch (a new fetch starts it again).
IDLE_STOP_NS = 1_000_000_000
#: Innermost frames kept per sample (a dataset's own code is rarely deeper).
MAX_DEPTH = 40
#: A timer tick this close to its sample moment takes it (setitimer rounds to microseconds).
_EARLY_NS = 20_000

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HERE) + os.sep
_CALLS_FILE = os.path.join(_HERE, "calls.py")
_WORKERS_FILE = os.path.join(_HERE, "workers.py")
_WRAPPER_NAMES = frozenset({"wrapper", "method", "_timed_invoke"})
_KEEP, _SKIP, _WRAPPER, _FETCH = 0, 1, 2, 3
#: How this process samples: not decided yet (before its first fetch), off, signal handler, thread.
_UNDECIDED, _OFF, _SIGNAL, _THREAD = 0, 1, 2, 3
#: The sampler's name in the ``stack_samples`` event, by mode.
SAMPLER_NAMES = {_SIGNAL: "signal", _THREAD: "thread"}

#: (thread ident, loader id) of the fetch in progress in this process; None between fetches.
_fetching: tuple[int, int] | None = None
#: The training process's main thread is computing its step (between batches): ``step_parts.main_part`` names the
#: part; the signal sampler samples it then too (stage "compute:PART", loader -1). See ``step_sampler.py``.
_stepping = False
#: Where the signal sampler cannot run, the step is sampled by ``step_sampler``'s thread: called when that happens.
on_thread_mode: Any = None
_mode = _UNDECIDED
_interval_ns = int(1e9 / DEFAULT_HZ)
_rng = random.Random(0)
#: (loader id, stage, ((code, line), ...)) -> samples not yet written out.
_counts: dict[tuple[int, str, tuple[Any, ...]], int] = {}
_counts_lock = threading.Lock()
#: CPU the sampler has spent in this process: its thread's, or the handler's (benchmarks/fetch_overhead.py).
sampler_cpu_ns = 0
_kinds: dict[Any, int] = {}
_exit_hooked = False
_last_emit_ns = 0
# the thread sampler
_thread_running = False
_generation = 0
_current_frames: Any = None
# the signal sampler
_main_ident = 0
_main_tid: int | None = None
_armed = False
_deadline_ns = 0  # the next sample moment (perf_counter) while armed
_remaining_ns = 0  # fetch time to the next sample moment, carried from one fetch to the next
_window: tuple[int, int, int] | None = None  # (wall, CPU, run-queue) ns at the last sample or the fetch's start
_clock: Any = None
_handler_before: Any = None  # SIGALRM's disposition before ours
_fallback_reason: str | None = None  # why the thread sampler runs instead of the signal sampler


def fetch_started(loader_id: int) -> None:
    """A fetch begins in this thread (called by ``workers.timed_fetch``): the hot path."""
    global _fetching
    _fetching = (threading.get_ident(), loader_id)
    mode = _mode
    if mode == _SIGNAL:
        _arm()
    elif mode == _THREAD:
        if not _thread_running:
            _start_thread()
    elif mode == _UNDECIDED:
        _decide()


def fetch_ended() -> None:
    global _fetching
    _fetching = None
    if _armed:
        _disarm()


def step_resumed() -> None:
    """The main thread of the training process has its batch and computes (called by ``step_sampler``)."""
    global _stepping
    _stepping = True
    mode = _mode
    if mode == _SIGNAL:
        if not _armed:
            _arm()
    elif mode == _UNDECIDED:
        _decide()
    elif mode == _THREAD and on_thread_mode is not None:
        on_thread_mode()


def step_paused() -> None:
    """The main thread asks the DataLoader for a batch: data wait, not compute."""
    global _stepping
    _stepping = False
    if _armed:
        _disarm()


def _decide() -> None:
    """At the first fetch of this process: the signal sampler where it can run, else the thread sampler."""
    global _mode, _interval_ns, _rng, _current_frames, _last_emit_ns
    _last_emit_ns = time.perf_counter_ns()
    try:
        raw = os.environ.get(ENV_STACK_SAMPLE_HZ, "")
        try:
            hz = float(raw) if raw.strip() else DEFAULT_HZ
        except ValueError:
            hz = 0.0
        if not hz > 0:
            _mode = _OFF
            _off(f"turned off ({ENV_STACK_SAMPLE_HZ}={raw})")
            return
        _interval_ns = max(int(1e9 / hz), 100_000)
        _rng = random.Random(os.getpid())
        _current_frames = getattr(sys, "_current_frames", None)
        _hook_exit()
        why_not = _install_handler()
        if why_not is None:
            _mode = _SIGNAL
            _arm()
        else:
            _fall_back(why_not)
    except Exception as exc:  # noqa: BLE001 - never into the script: the fetch goes on unsampled
        _mode = _OFF
        _off(f"the sampler could not start ({type(exc).__name__}: {exc})")


def _install_handler() -> str | None:
    """Install the SIGALRM handler; None, or why it cannot be."""
    global _main_ident, _main_tid, _clock, _remaining_ns, _handler_before, _window
    if _setitimer is None or not hasattr(signal, "SIGALRM"):
        return "no setitimer on this platform"
    if threading.current_thread() is not threading.main_thread():
        return "batches are fetched outside the main thread"
    before = _getsignal(signal.SIGALRM)
    if before is None or before != _SIG_DFL:
        return "the script handles SIGALRM"
    if signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0):
        return "the script runs an ITIMER_REAL timer (signal.alarm or setitimer)"
    _main_ident = threading.get_ident()
    _main_tid = getattr(threading, "get_native_id", lambda: None)()
    _clock = _SchedClock()
    _remaining_ns = _next_interval()
    _window = None
    _handler_before = before
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.siginterrupt(signal.SIGALRM, False)  # SA_RESTART: system calls it interrupts go on
    return None


def _fall_back(reason: str) -> None:
    """The signal sampler cannot run (or has to give way): the thread sampler, or none. The signal sampler's
    counts so far go out first, under its name."""
    global _mode, _fallback_reason
    _uninstall_handler()
    emit_counts()
    _fallback_reason = reason
    if _current_frames is None:
        _mode = _OFF
        _off(f"{reason}, and sys._current_frames is not available in this interpreter")
        return
    _mode = _THREAD
    if _fetching is not None and not _thread_running:
        _start_thread()
    if _stepping and on_thread_mode is not None:
        on_thread_mode()


def _uninstall_handler() -> None:
    global _handler_before
    if _handler_before is None:
        return
    try:
        if _getsignal(signal.SIGALRM) is _on_alarm:
            signal.signal(signal.SIGALRM, _handler_before)
    except (ValueError, OSError):  # not the main thread: our handler stays, and ignores ticks
        pass
    _handler_before = None


def _next_interval() -> int:
    return int(_interval_ns * (0.5 + _rng.random()))


def _reading() -> tuple[int, int, int] | None:
    """(wall, CPU, run-queue) ns of the main thread now, or None."""
    now = time.perf_counter_ns()
    sched = _clock.read(_main_tid) if _clock is not None else None
    return None if sched is None else (now, sched[0], sched[1])


def _arm() -> None:
    """Start the fetch-time clock: the timer fires at the next sample moment."""
    global _armed, _deadline_ns, _window
    if threading.get_ident() != _main_ident:
        _fall_back("batches are fetched outside the main thread")
        return
    if _getsignal(signal.SIGALRM) is not _on_alarm:
        _handler_taken()
        return
    _window = _reading() if _fetching is not None else None  # the step's samples need no CPU split
    _deadline_ns = time.perf_counter_ns() + _remaining_ns
    _armed = True  # before the timer: its first tick may come at once
    previous = _setitimer(signal.ITIMER_REAL, _remaining_ns / 1e9)
    if previous != (0.0, 0.0):  # the script's own timer, set since: put back, and give way
        _armed = False
        _setitimer(signal.ITIMER_REAL, *previous)
        _fall_back("the script runs an ITIMER_REAL timer (signal.alarm or setitimer)")


def _disarm() -> None:
    global _armed, _remaining_ns, _last_emit_ns
    _armed = False
    if _getsignal(signal.SIGALRM) is not _on_alarm:  # the script took SIGALRM during the fetch: its timer now
        _handler_taken()
        return
    _setitimer(signal.ITIMER_REAL, 0.0)
    now = time.perf_counter_ns()
    _remaining_ns = max(_deadline_ns - now, 1_000)
    if now - _last_emit_ns > EMIT_EVERY_NS:
        _last_emit_ns = now
        emit_counts()


def _handler_taken() -> None:
    global _handler_before
    _handler_before = None  # the script's handler stays
    _fall_back("the script handles SIGALRM")


def _on_alarm(signum: int, frame: Any) -> None:
    """A sample moment of the fetch in progress (in the main thread, at the frame it was interrupted in)."""
    global _deadline_ns, _window, sampler_cpu_ns
    fetching = _fetching
    if not _armed or (fetching is None and not _stepping):
        return  # a tick that was on its way when the fetch or the step's compute ended
    c0 = time.thread_time_ns()
    try:
        now = time.perf_counter_ns()
        deadline = _deadline_ns
        n = 0
        while deadline <= now + _EARLY_NS:  # every moment since the last sample (a long C call spans several)
            n += 1
            deadline += _next_interval()
        _deadline_ns = deadline
        _setitimer(signal.ITIMER_REAL, (deadline - now) / 1e9)
        if n and fetching is None:  # the training step itself
            _, stack = stack_of(frame)
            key = (-1, f"compute:{step_parts.main_part}", stack)
            _counts[key] = _counts.get(key, 0) + n
            if step_threads.watched:
                step_threads.count_frames()
        elif n and fetching is not None:
            stage, stack = stack_of(frame)
            reading, window = _reading(), _window
            _window = reading
            if stage is None:
                stage = "transform"
                if reading is not None and window is not None:
                    wall = reading[0] - window[0]
                    if (wall - (reading[1] - window[1]) - (reading[2] - window[2])) * 2 > wall:
                        stage = "storage"
            key = (fetching[1], stage, stack)
            counts = _counts  # no lock: the handler runs between the main thread's bytecodes
            counts[key] = counts.get(key, 0) + n
    except Exception:  # noqa: BLE001, S110 - a sample lost; never into the script
        pass
    sampler_cpu_ns += time.thread_time_ns() - c0


def _start_thread() -> None:
    global _thread_running, _generation, _mode
    try:
        _thread_running = True
        _generation += 1
        start_thread(_loop, "stallscope-stacks", (_generation, _interval_ns / 1e9, _current_frames))
    except Exception as exc:  # noqa: BLE001 - never into the script: the fetch goes on unsampled
        _thread_running = False
        _mode = _OFF
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
    atexit.register(_at_exit)
    try:
        import multiprocessing.util

        multiprocessing.util.Finalize(None, _at_exit, exitpriority=101)
    except Exception:  # noqa: BLE001, S110 - atexit still writes them in the training process
        pass


def _at_exit() -> None:
    global _armed
    if _armed:  # leaving in the middle of a fetch
        _armed = False
        try:
            if _getsignal(signal.SIGALRM) is _on_alarm:
                _setitimer(signal.ITIMER_REAL, 0.0)
        except Exception:  # noqa: BLE001, S110 - the handler ignores a tick with nothing armed
            pass
    emit_counts()


def emit_counts_every(period_ns: int, now_ns: int) -> None:
    """``emit_counts`` where ``period_ns`` passed since the last time (a worker writing out as it goes)."""
    global _last_emit_ns
    if now_ns - _last_emit_ns > period_ns:
        _last_emit_ns = now_ns
        emit_counts()


def emit_counts() -> None:
    """Write the counts so far as one ``stack_samples`` event (frames as ``file:line:function``), with the
    sampler that took them and, for the thread sampler, why it ran."""
    global _counts
    with _counts_lock:
        counts, _counts = _counts, {}
    if not counts:
        return
    rows = [[loader_id, stage, [f"{code.co_filename}:{line}:{getattr(code, 'co_qualname', code.co_name)}"
                                for code, line in stack], n]
            for (loader_id, stage, stack), n in counts.items()]
    sampler = SAMPLER_NAMES.get(_mode)
    events.emit("stack_samples", time.perf_counter_ns(), rows, sampler,
                _fallback_reason if sampler == "thread" else None)


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


def _loop(generation: int, interval_s: float, current_frames: Any) -> None:
    """The thread sampler (where the signal sampler cannot run)."""
    global sampler_cpu_ns
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
        _stopped(generation)


def _stopped(generation: int) -> None:
    """The thread ends (idle, or its process is ending): counts out; a later fetch starts a new thread."""
    global _thread_running
    try:
        emit_counts()
    except Exception:  # noqa: BLE001, S110 - interpreter teardown: these counts are lost
        pass
    if generation == _generation:
        _thread_running = False


def _after_fork_in_child() -> None:
    """A forked child does not inherit the parent's sampler: no timer (POSIX: interval timers are not inherited),
    not our handler (put back here, so the child decides afresh and the script's own code finds SIGALRM as it
    was), no thread, none of the parent's counts."""
    global _fetching, _mode, _thread_running, _generation, _counts, _counts_lock, _exit_hooked, sampler_cpu_ns
    global _stepping
    global _armed, _clock, _window, _fallback_reason
    _fetching = None
    _stepping = False
    _fallback_reason = None
    _armed = False
    _uninstall_handler()
    _mode = _UNDECIDED
    _thread_running = False
    _generation += 1
    _counts = {}
    _counts_lock = threading.Lock()
    _exit_hooked = False
    if _clock is not None:  # its files are the parent's thread's
        _clock.close()
        _clock = None
    _window = None
    sampler_cpu_ns = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
