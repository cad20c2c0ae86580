"""Sample the training process's main thread while it computes: the lines of the step that cost it host time.

The fetch sampler (``stacks.py``) sees the batches being made; this sees the training step itself. From the first
batch the training process's main thread takes, the moments between its batches (its step: everything but the
wait inside a DataLoader's ``next``) are sampled like a fetch, at jittered moments about ``stacks.DEFAULT_HZ`` a
second, and counted by ``(part, stack)``: the part of the step the main thread was in (forward, backward,
optimizer, or the script's own step code, kept by ``step_parts``). The waits are the fetch sampler's and are not
counted here.

The samples are taken by the fetch sampler's ``SIGALRM`` handler (``stacks.step_resumed``/``step_paused`` arm and
disarm its timer around each wait), on the same terms: never where the script has ``SIGALRM`` or a timer of its
own; system calls it interrupts restart. Where it cannot run, a daemon thread here samples instead
(``sys._current_frames``), with the thread sampler's bias: it takes the interpreter lock where the main thread gives
it up, so a pure-Python loop's samples can land on the next torch call after it. Its counts go out as
``step_samples`` events every few seconds and at exit. Nothing here raises into the script.
"""

from __future__ import annotations

import atexit
import os
import random
import sys
import threading
import time
from typing import Any

from stallscope.background import start_thread
from stallscope.recorder import events, op_window, stacks, step_parts, step_threads
from stallscope.settings import ENV_STACK_SAMPLE_HZ

#: Mean samples per second of the main thread's compute: the fetch sampler's rate (calibration: rec-stack-sample-hz).
DEFAULT_HZ = stacks.DEFAULT_HZ
#: Counts are written out at least this often, so a process killed outright loses at most this much.
EMIT_EVERY_NS = 3_000_000_000

_started = False
_main_thread = 0  # the training process's main thread, once it took a batch
_counts: dict[tuple[str, tuple[Any, ...]], int] = {}
_lock = threading.Lock()
#: CPU the sampler thread has spent (benchmarks/overhead.py).
sampler_cpu_ns = 0


def batch_wanted() -> None:
    """At the start of a DataLoader ``next``: the main thread's wait for a batch begins (the hot path)."""
    if _main_thread and threading.get_ident() == _main_thread:
        stacks.step_paused()
        step_threads.paused()


def batch_taken() -> None:
    """At the end of a DataLoader ``next`` that returned a batch: the main thread computes until its next wait."""
    global _main_thread
    if not _main_thread:
        main = threading.main_thread().ident
        if main is None or threading.get_ident() != main:
            return  # batches taken outside the main thread: the step is not the main thread's to sample
        _main_thread = main
        stacks.on_thread_mode = _start_thread
    elif threading.get_ident() != _main_thread:
        return
    if not op_window.active:
        stacks.step_resumed()
        step_threads.resumed()


def _start_thread() -> None:
    """The signal sampler cannot run in this process: sample the step from a thread (once)."""
    global _started
    if _started:
        return
    _started = True
    try:
        raw = os.environ.get(ENV_STACK_SAMPLE_HZ, "")
        hz = float(raw) if raw.strip() else DEFAULT_HZ
    except ValueError:
        hz = 0.0
    current_frames = getattr(sys, "_current_frames", None)
    if not hz > 0 or current_frames is None:
        return
    try:
        atexit.register(emit_counts)
        start_thread(_loop, "stallscope-step-sampler", (max(1e-4, 1.0 / hz), _main_thread, current_frames,
                                                        os.getpid()))
    except Exception:  # noqa: BLE001, S110 - never into the script: the steps go on unsampled
        pass


def _loop(interval_s: float, main: int, current_frames: Any, pid: int) -> None:
    global sampler_cpu_ns
    rng = random.Random(pid)
    perf, cpu = time.perf_counter_ns, time.thread_time_ns
    last_emit = perf()
    try:
        while os.getpid() == pid:
            time.sleep(interval_s * (0.5 + rng.random()))
            c0 = cpu()
            if stacks._stepping:
                frame = current_frames().get(main)
                if frame is None:
                    break  # the main thread has ended
                part = step_parts.main_part
                _, stack = stacks.stack_of(frame)
                del frame
                key = (part, stack)
                with _lock:
                    _counts[key] = _counts.get(key, 0) + 1
                if step_threads.watched:
                    step_threads.count_frames()
            now = perf()
            if now - last_emit > EMIT_EVERY_NS:
                last_emit = now
                emit_counts()
            sampler_cpu_ns += cpu() - c0
    except Exception:  # noqa: BLE001, S110 - the sampler stops; the steps go on unsampled
        pass
    finally:
        emit_counts()


def emit_counts() -> None:
    """The counts so far as one ``step_samples`` event (frames as ``file:line:function``, innermost first)."""
    global _counts
    with _lock:
        counts, _counts = _counts, {}
    if not counts:
        return
    rows = [[part, [f"{code.co_filename}:{line}:{getattr(code, 'co_qualname', code.co_name)}" for code, line in stack],
             n] for (part, stack), n in counts.items()]
    events.emit("step_samples", time.perf_counter_ns(), rows)


def _after_fork_in_child() -> None:
    """A forked child (a worker, a process the script forks) has no sampler thread and none of the counts."""
    global _started, _counts, _lock, _main_thread
    _started = False
    _main_thread = 0
    _counts = {}
    _lock = threading.Lock()


op_window.pause_sampling = stacks.step_paused
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
