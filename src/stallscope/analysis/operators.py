"""The operators the step spends on, from the run's profiler window (``recorder/op_window.py``): the top ones by self
CPU time and, on a GPU, self device time, each with its part of the step, and what the window cost.

The window's steps are left out of every other figure (``steps.py``); here its own cost is said: the profiler's
start and stop, and the folding of its events, in seconds of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stallscope.constants import SYNC_CALLS
from stallscope.session import Session

#: Operators shown per run.
SHOWN = 12


@dataclass(frozen=True)
class Operator:
    part: str
    name: str
    calls: int
    self_cpu_s: float
    self_device_s: float
    share_of_cpu: float  # of the window's self CPU time
    share_of_device: float  # of its self device time (0 without a device)

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "name": self.name, "calls": self.calls,
                "self_cpu_ms": round(1e3 * self.self_cpu_s, 3), "self_device_ms": round(1e3 * self.self_device_s, 3),
                "share_of_cpu": round(self.share_of_cpu, 4), "share_of_device": round(self.share_of_device, 4)}


@dataclass(frozen=True)
class SyncSite:
    """A line of the user's code that read values back from the device in the window (``recorder/sync_calls.py``):
    the call, where, the tensor's device, and the host's wall time in it."""
    call: str
    file: str
    line: int
    function: str
    device: str
    calls: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"call": self.call, "file": self.file, "line": self.line, "function": self.function,
                "device": self.device, "calls": self.calls, "ms": round(1e3 * self.seconds, 3)}


@dataclass(frozen=True)
class Operators:
    steps: int
    window_s: float  # from the profiler's start to the end of the folding
    cost_s: float  # the profiler's start, stop and folding (the window's steps themselves ran profiled)
    self_cpu_s: float
    self_device_s: float
    by_part: dict[str, dict[str, float]] = field(default_factory=dict)  # part -> {cpu_s, device_s}
    top: list[Operator] = field(default_factory=list)
    #: the rows where the host waited for the device (a CUDA synchronizing call, named with its operator), costliest
    #: first
    waits: list[Operator] = field(default_factory=list)
    #: self CPU seconds in the CUDA allocator's device calls (cudaMalloc, cudaFree) over the window
    device_alloc_s: float = 0.0
    #: the user's lines that read back from a CUDA device in the window, costliest first
    sync_sites: list[SyncSite] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "window_s": round(self.window_s, 4), "cost_s": round(self.cost_s, 4),
                "self_cpu_s": round(self.self_cpu_s, 4), "self_device_s": round(self.self_device_s, 4),
                "by_part": {p: {k: round(v, 4) for k, v in figures.items()} for p, figures in self.by_part.items()},
                "top": [op.to_dict() for op in self.top], "waits": [op.to_dict() for op in self.waits],
                "device_alloc_s": round(self.device_alloc_s, 6),
                "sync_sites": [site.to_dict() for site in self.sync_sites]}


def operators(session: Session) -> Operators | None:
    """The training process's profiler window, folded; None where none was recorded (or the script's own profiler
    took its place)."""
    window = next((w for w in session.op_windows if w.get("pid") == session.main_pid and w.get("folded")), None)
    if window is None or not window.get("ops"):
        return None
    cpu_total = sum(int(row[3]) for row in window["ops"]) or 1
    device_total = sum(int(row[4]) for row in window["ops"])
    by_part: dict[str, dict[str, float]] = {}
    top = []
    for part, name, calls, cpu_ns, device_ns in window["ops"]:
        figures = by_part.setdefault(part, {"cpu_s": 0.0, "device_s": 0.0})
        figures["cpu_s"] += cpu_ns / 1e9
        figures["device_s"] += device_ns / 1e9
        top.append(Operator(part, name, int(calls), cpu_ns / 1e9, device_ns / 1e9, cpu_ns / cpu_total,
                            device_ns / device_total if device_total else 0.0))
    waits = sorted((op for op in top if op.name.split(" < ")[0] in SYNC_CALLS), key=lambda op: -op.self_cpu_s)
    top.sort(key=lambda op: -(op.share_of_device if device_total else op.share_of_cpu))
    sites = [SyncSite(str(call), str(file), int(line), str(function), str(device), int(calls), int(ns) / 1e9)
             for call, file, line, function, device, calls, ns in window.get("syncs") or [] if device == "cuda"]
    start, opened, stop, end = (int(window[k]) for k in ("start_ns", "opened_ns", "stop_ns", "end_ns"))
    return Operators(steps=int(window.get("steps") or 0), window_s=(end - start) / 1e9,
                     cost_s=((opened - start) + (end - stop)) / 1e9, self_cpu_s=int(window.get("cpu_ns") or 0) / 1e9,
                     self_device_s=int(window.get("device_ns") or 0) / 1e9, by_part=by_part, top=top[:SHOWN],
                     waits=waits, device_alloc_s=sum(op.self_cpu_s for op in top
                                                     if op.name.split(" < ")[0] in ("cudaMalloc", "cudaFree")),
                     sync_sites=sorted(sites, key=lambda site: -site.seconds))
