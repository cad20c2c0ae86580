"""A short, bounded window of the PyTorch profiler inside the run: the operators the step spends on, by part.

After ``START_AFTER`` training steps (past the warm-up; none in a run ``--steps`` stops early), the profiler
records ``WINDOW_STEPS`` steps, then stops and
the window is folded at once into one ``op_window`` event: per part of the step (forward, backward, optimizer, the
step's own code) and operator, the calls and the self CPU time, and on a GPU the self device time. The parts come
from ``record_function`` ranges the step-part hooks open only while the window is open; a backward operator run on
an autograd device thread (CUDA) is backward's. Never the whole run: the profiler's own cost (its start, its
per-operator bookkeeping, the folding) lands in those steps and the step after, and the analysis leaves them out
of the measured steps, stating the cost. The profiler is driven through its low-level calls and its raw events
folded here: ``torch.profiler.profile`` builds a Python tree of every event on stop, which costs about 80 us an
operator (seconds for a window of an optimizer stepping hundreds of tensors).

While the window is open the calls that read values back from the device are timed at the user's lines
(``sync_calls.py``), so a wait the profiler names can be placed.

The script's own profiler comes first: no window opens while one runs, and one the script starts inside the window
closes the window (left unfolded) before it starts. ``STALLSCOPE_OP_WINDOW=0`` turns the window off. Nothing here
raises into the script.
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from stallscope.constants import SYNC_CALLS
from stallscope.recorder import events, sync_calls
from stallscope.settings import ENV_MAX_STEPS, ENV_OP_WINDOW

_perf = time.perf_counter_ns

#: Training steps (optimizer steps after a batch) before the window opens: past the warm-up and the first epoch's
#: worker start, and late enough that a short run (a quick look with ``--steps``) keeps its steps to itself.
START_AFTER = 30
#: A run stopped by ``--steps`` before this many steps opens no window: the window would take too many of them.
SHORTEST_RUN = 45
#: Steps the window records.
WINDOW_STEPS = 5
#: Operators kept per window (by their larger of self CPU and self device time).
TOP_OPS = 40
RANGE_PREFIX = "stallscope."
#: The profiler range torch's DataLoader opens around each ``next``: what runs inside is data wait.
_LOADER_RANGE = "enumerate(DataLoader)"

active = False
_steps = 0
_window_steps = 0
_done = False
_opening = False
_opened = (0, 0)  # perf ns before the profiler started, after it had
_ranges: list[Any] = []
_main_ident = threading.main_thread().ident
_QUIET = "6"  # above every level of the profiler's log (USDT is 5)
#: Stops the step sampler (``step_sampler.py`` sets it): the window's steps, profiled, are not the run's to sample.
pause_sampling: Callable[[], None] | None = None


def on_step_end(fed: bool) -> None:
    """After each optimizer step (``steps.py``; ``fed``: a batch came since the last): open, count, close."""
    global _steps, _window_steps
    if not fed:
        return
    if active:
        _window_steps += 1
        if _window_steps >= WINDOW_STEPS:
            _close()
    elif not _done:
        _steps += 1
        if _steps >= START_AFTER:
            _open()


def _open() -> None:
    global active, _done, _opening, _opened
    _done = True  # one window a run, whatever happens here
    if os.environ.get(ENV_OP_WINDOW, "").strip() == "0" or threading.get_ident() != _main_ident:
        return
    limit = os.environ.get(ENV_MAX_STEPS, "").strip()
    if limit.isdigit() and int(limit) < SHORTEST_RUN:
        return
    try:
        import torch
        from torch._C._profiler import _ExperimentalConfig
        from torch.autograd import (
            ProfilerActivity,
            ProfilerConfig,
            ProfilerState,
            _enable_profiler,
            _prepare_profiler,
        )

        if torch.autograd._profiler_enabled():  # the script's own
            return
        activities = {ProfilerActivity.CPU}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.add(ProfilerActivity.CUDA)
        config = ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig())
        start = _perf()
        _opening = True
        quiet = "KINETO_LOG_LEVEL" not in os.environ
        if quiet:  # the profiler's own log lines (its start, stop, a device it cannot count) stay off the job's stderr
            os.environ["KINETO_LOG_LEVEL"] = _QUIET
        try:
            _prepare_profiler(config, activities)
            _enable_profiler(config, activities)
        finally:
            _opening = False
            if quiet and os.environ.get("KINETO_LOG_LEVEL") == _QUIET:
                del os.environ["KINETO_LOG_LEVEL"]
        _opened, active = (start, _perf()), True
        sync_calls.install()
        if pause_sampling is not None:
            pause_sampling()
        atexit.register(_close_at_exit)
    except Exception:  # noqa: BLE001, S110 - no window; never into the script
        pass


def _close_at_exit() -> None:
    """The script ended inside the window: stop the profiler before the interpreter goes (left unfolded)."""
    if active:
        _close(fold=False)


def enter(part: str) -> None:
    """A part of the step begins in the main thread while the window is open: a profiler range around it."""
    try:
        from torch.autograd.profiler import record_function

        scope = record_function(RANGE_PREFIX + part)
        scope.__enter__()
        _ranges.append(scope)
    except Exception:  # noqa: BLE001, S110 - the part's operators go to the step's code
        pass


def leave() -> None:
    if _ranges:
        try:
            _ranges.pop().__exit__(None, None, None)
        except Exception:  # noqa: BLE001, S110
            pass


def _close(fold: bool = True) -> None:
    global active
    opened, active = active, False
    if pause_sampling is not None:
        pause_sampling()  # the folding is the window's cost, not the step's code
    while _ranges:
        leave()
    if not opened:
        return
    syncs = sync_calls.uninstall()
    try:
        from torch.autograd import _disable_profiler

        stop_start = _perf()
        result = _disable_profiler()
        ops, totals = _fold(result.events()) if fold else ({}, (0, 0))
        rows = sorted(ops.items(), key=lambda kv: -max(kv[1][1], kv[1][2]))[:TOP_OPS]
        events.emit("op_window", _opened[0], _opened[1], stop_start, _perf(), _window_steps, fold,
                    [[part, name, *figures] for (part, name), figures in rows], totals[0], totals[1],
                    syncs if fold else [])
    except Exception:  # noqa: BLE001, S110 - the window is lost; never into the script
        pass


def _fold(listed: list[Any]) -> tuple[dict[tuple[str, str], list[int]], tuple[int, int]]:
    """(part, operator) -> [calls, self CPU ns, self device ns]; and the totals of both.

    The profiler's host events nest per thread: an operator's self time is its duration less its direct children's;
    its part is the innermost of our ranges around it. A kernel's device time goes to the operator that launched it
    (its linked correlation id), which is the innermost one: it is that operator's self device time."""
    by_thread: dict[int, list[Any]] = {}
    kernels: list[Any] = []
    for event in listed:
        if str(event.device_type()).endswith("CPU"):
            by_thread.setdefault(event.start_thread_id(), []).append(event)
        else:
            kernels.append(event)
    main_thread = next((tid for tid, evs in by_thread.items() if any(e.name().startswith(RANGE_PREFIX) for e in evs)),
                       None)
    ops: dict[tuple[str, str], list[int]] = {}
    by_correlation: dict[int, list[int]] = {}
    for tid, thread_events in by_thread.items():
        thread_events.sort(key=lambda e: (e.start_ns(), -e.duration_ns()))
        default = "step_code" if main_thread is None or tid == main_thread else "backward"  # autograd's device threads
        # [end ns, part or None (data wait), row or None, children's ns, duration ns, name]
        stack: list[list[Any]] = []
        for event in thread_events:
            start, duration = event.start_ns(), event.duration_ns()
            while stack and stack[-1][0] <= start:
                _pop(stack)
            part = stack[-1][1] if stack else default
            if stack:
                stack[-1][3] += duration
            name = event.name()
            if name in SYNC_CALLS and stack and stack[-1][2] is not None:
                name = f"{name} < {stack[-1][5]}"  # the host waits for the device here: in which operator
            row = None
            if name.startswith(RANGE_PREFIX):
                part = name[len(RANGE_PREFIX):]
            elif name.startswith(_LOADER_RANGE):
                part = None  # inside a DataLoader's next: data wait, not the step's compute
            elif part is not None and not name.startswith("ProfilerStep"):
                row = ops.setdefault((part, name), [0, 0, 0])
                row[0] += 1
                if event.linked_correlation_id() == 0:  # an operator; a runtime call (a launch) links to one
                    by_correlation[event.correlation_id()] = row
            stack.append([start + duration, part, row, 0, duration, name])
        while stack:
            _pop(stack)
    total_device = 0
    for kernel in kernels:
        row = by_correlation.get(kernel.linked_correlation_id())
        if row is not None:
            row[2] += kernel.duration_ns()
            total_device += kernel.duration_ns()
    return ops, (sum(row[1] for row in ops.values()), total_device)


def _pop(stack: list[list[Any]]) -> None:
    """Close the innermost open event: its self time (duration less its children's) to its operator's row."""
    _, _, row, children, duration, _ = stack.pop()
    if row is not None:
        row[1] += max(0, duration - children)


def yield_to_script(original: Any) -> Any:
    """Wrap the profiler's start: the script's own profiler closes an open window (unfolded) first."""
    @functools.wraps(original)
    def _prepare_trace(self: Any, *args: Any, **kwargs: Any) -> Any:
        if active and not _opening:
            _close(fold=False)
        return original(self, *args, **kwargs)

    _prepare_trace.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return _prepare_trace


def patch_profiler(module: Any) -> None:
    """Patch target ``torch.autograd.profiler``: every profiler start goes through ``profile._prepare_trace``."""
    cls = getattr(module, "profile", None)
    original = getattr(cls, "_prepare_trace", None)
    if cls is not None and original is not None and not getattr(original, "__stallscope_wrapped__", False):
        cls._prepare_trace = yield_to_script(original)
