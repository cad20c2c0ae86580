"""GPU-side timings from CUDA events: how long the device worked on each step, and how long it sat idle.

CPU-side clocks cannot tell a starved GPU from a busy one: CUDA launches are asynchronous, so
the training loop may wait for data while the GPU still drains the previous step's kernels.
Events recorded in the stream answer that. Per training step we record one event when its
first batch is handed to the script (*ready*) and one when the optimizer step returns (*end*):

- ``step``: elapsed GPU time from *ready* to *end*, the device's share of the step;
- ``idle``: from the previous step's *end* to this *ready*. When the CPU handed over the batch
  while the GPU was still busy, the stream reaches *ready* right after *end* and this is ~0;
  when the GPU ran dry waiting for input, it is the starvation the GPU actually saw;
- ``h2d``: host-to-device copies timed on the stream (a non-blocking copy returns at once on
  the CPU; the event pair says how long the transfer took and at what bandwidth).

Events are polled with ``query()`` at step boundaries, never synchronized, so the recorder does
not change when the script's work runs; at exit the remaining ones are waited for briefly.
Only the process that initialised CUDA itself records (never a forked worker), only on the GPU
its batches are copied to (learned from the first copy), and nothing is recorded while a stream
is being captured into a CUDA graph.
"""

from __future__ import annotations

import atexit
import collections
import time
from typing import Any

from stallscope.recorder import events

_perf = time.perf_counter_ns
MAX_PENDING = 4096  # event pairs awaiting completion; beyond this the oldest are dropped
EXIT_WAIT_S = 2.0

_cuda: Any = None
_device: int | None = None  # index of the GPU the script's batches go to (learned from its copies)
_ready: tuple[Any, int] | None = None
_last_end: tuple[Any, int] | None = None
_step = 0
_pending: collections.deque[tuple[str, int, Any, Any, int, int, int]] = collections.deque()
dropped = 0


def enable(torch_cuda: Any) -> None:
    """Start recording; called once the script has initialised CUDA in this process."""
    global _cuda
    if _cuda is None:
        _cuda = torch_cuda
        atexit.register(_drain_at_exit)


def _event() -> Any | None:
    """An event recorded now on the current stream of the device the script copies its batches to.

    Until the first host-to-device copy shows which device that is, nothing is recorded: touching
    ``current_device()`` blindly would create a CUDA context (hundreds of MB) on GPU 0 in a job
    whose processes each use another GPU without calling ``set_device``.
    """
    if _cuda is None or _device is None:
        return None
    try:
        with _cuda.device(_device):
            if _cuda.is_current_stream_capturing():
                return None
            event = _cuda.Event(enable_timing=True)
            event.record(_cuda.current_stream(_device))
        return event
    except Exception:
        return None


def _queue(kind: str, index: int, start: tuple[Any, int], end: tuple[Any, int], extra: int = 0) -> None:
    global dropped
    if len(_pending) >= MAX_PENDING:
        _pending.popleft()
        dropped += 1
    _pending.append((kind, index, start[0], end[0], start[1], end[1], extra))


def on_batch(saw_optimizer: bool) -> None:
    """A batch was handed to the script: the first one after a step boundary marks the step's start.

    Steps are timed once the script has stepped an optimizer (``saw_optimizer``, from ``steps``):
    before that there is no step end to close them."""
    global _ready
    if _cuda is None or _ready is not None or not saw_optimizer:
        return
    event = _event()
    if event is None:
        return
    _ready = (event, _perf())
    if _last_end is not None:
        _queue("idle", _step, _last_end, _ready)


def on_step_end() -> None:
    """The optimizer step returned: close the step opened by the first batch after the last one."""
    global _ready, _last_end, _step
    if _cuda is None or _ready is None:
        return
    event = _event()
    if event is None:
        return
    end = (event, _perf())
    _queue("step", _step, _ready, end)
    _last_end, _ready = end, None
    _step += 1
    poll()


def time_copy(copy: Any, nbytes: int) -> Any:
    """Run ``copy()`` between two events in the current stream and queue the pair as an ``h2d`` span.

    The first copy runs untimed and tells which device the script uses."""
    global _device
    start_event = _event()
    if start_event is None:
        result = copy()
        if _cuda is not None and _device is None:
            index = getattr(getattr(result, "device", None), "index", None)
            _device = int(index) if index is not None else None
        return result
    start = (start_event, _perf())
    result = copy()
    end_event = _event()
    if end_event is not None:
        _queue("h2d", -1, start, (end_event, _perf()), nbytes)
    return result


def poll() -> None:
    """Emit every pair whose end event the GPU has reached, oldest first; never blocks."""
    while _pending:
        kind, index, start, end, t0, t1, extra = _pending[0]
        try:
            if not end.query():
                return
            gpu_ns = int(start.elapsed_time(end) * 1e6)
        except Exception:
            gpu_ns = -1
        _pending.popleft()
        if gpu_ns >= 0:
            events.emit("gpu_span", kind, index, t0, t1, gpu_ns, extra)


def _drain_at_exit() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    while _pending and time.monotonic() < deadline:
        poll()
        if _pending:
            time.sleep(0.005)
    if dropped or _pending:
        events.emit("gpu_span_lost", dropped + len(_pending))
