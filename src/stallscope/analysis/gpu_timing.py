"""What the GPU itself saw, from the CUDA events the recorder put in the stream (``record/cuda_timing.py``).

The CPU-side step split says how long the training loop *waited* for data; with asynchronous
launches that can overstate starvation (the GPU may still be draining earlier kernels) or
understate it. ``idle_fraction`` is the share of the device's timeline spent between one step's
last kernel and the next step's first, i.e. the starvation the GPU actually experienced.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from stallscope.session import Session


@dataclass(frozen=True)
class GpuTiming:
    pid: int
    steps: int
    busy_ms_median: float
    idle_ms_median: float
    idle_fraction: float  # idle / (busy + idle) on the GPU timeline, over the timed steps
    h2d_copies: int
    h2d_bytes: int
    h2d_ms: float
    h2d_gb_per_s: float | None


def gpu_timing(session: Session, pid: int | None = None) -> GpuTiming | None:
    """Per-step GPU busy and idle time of ``pid`` (the training process by default); None without events."""
    pid = session.main_pid if pid is None else pid
    spans = [s for s in session.gpu_spans if s.pid == pid]
    steps = [s.gpu_ns for s in spans if s.kind == "step"]
    idles = [s.gpu_ns for s in spans if s.kind == "idle"]
    copies = [s for s in spans if s.kind == "h2d"]
    if not steps and not copies:
        return None
    busy, idle = sum(steps), sum(idles)
    h2d_ns = sum(c.gpu_ns for c in copies)
    h2d_bytes = sum(c.nbytes for c in copies)
    return GpuTiming(
        pid=pid if pid is not None else -1,
        steps=len(steps),
        busy_ms_median=statistics.median(steps) / 1e6 if steps else 0.0,
        idle_ms_median=statistics.median(idles) / 1e6 if idles else 0.0,
        idle_fraction=idle / (busy + idle) if busy + idle > 0 else 0.0,
        h2d_copies=len(copies),
        h2d_bytes=h2d_bytes,
        h2d_ms=h2d_ns / 1e6,
        h2d_gb_per_s=h2d_bytes / h2d_ns if h2d_ns > 0 else None,  # bytes per ns = GB/s
    )
