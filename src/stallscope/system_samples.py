"""The launcher's system samples (``Session.system_samples``), read in one place.

The sampler (``sample/system.py``) writes one block per run: tick times, system-wide series (one value
per tick), per-process series and NVML series. A process is sampled only at the ticks it was alive
and readable, so its values are listed with the tick index of each (``ticks``); sessions written
before that field existed give ``first`` and one value per tick from there. Every consumer (the
analysis, the history, the HTML report, the trace) reads samples through :class:`SystemSamples`, so
they all align values with ticks the same way. Anything malformed reads as absent, never as zero.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: How often the sampler looks for new processes of the job: a DataLoader worker shows up within this many
#: seconds of starting, and its CPU before that is not read (the analysis leaves those ticks out).
TREE_REFRESH_S = 1.0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers_or_none(values: Any) -> list[Any]:
    return [v if _number(v) else None for v in values] if isinstance(values, list) else []


@dataclass(frozen=True)
class ProcessSeries:
    """One process of the job: its values at the ticks it was sampled."""
    pid: int
    ppid: int | None
    name: str | None
    ticks: list[int]
    cpu_s: list[float | None]
    rss_bytes: list[int | None]
    read_bytes: list[int | None]
    uss_ticks: list[int] = field(default_factory=list)
    uss_bytes: list[int | None] = field(default_factory=list)

    @classmethod
    def read(cls, pid: int, entry: Mapping[str, Any]) -> ProcessSeries:
        rss = _numbers_or_none(entry.get("rss_bytes"))
        ticks = entry.get("ticks")
        if not isinstance(ticks, list) or not all(isinstance(t, int) for t in ticks):
            first = entry.get("first", 0)
            first = first if isinstance(first, int) and first >= 0 else 0
            ticks = list(range(first, first + len(rss)))  # before per-value ticks: one value per tick from first
        cpu = _numbers_or_none(entry.get("cpu_s"))
        reads = _numbers_or_none(entry.get("read_bytes"))
        raw_uss_ticks = entry.get("uss_ticks")
        uss_ticks = raw_uss_ticks if isinstance(raw_uss_ticks, list) else []
        ppid = entry.get("ppid")
        return cls(pid, ppid if isinstance(ppid, int) else None, entry.get("name"), list(ticks), cpu, rss, reads,
                   [t for t in uss_ticks if isinstance(t, int)], _numbers_or_none(entry.get("uss_bytes")))

    def rss_at(self) -> dict[int, int]:
        """tick -> resident bytes, for the ticks with a reading (0 is an exiting process, not a reading)."""
        return {t: v for t, v in zip(self.ticks, self.rss_bytes) if v}

    @property
    def rss_peak(self) -> int | None:
        values = [v for v in self.rss_bytes if v]
        return max(values) if values else None


def _series_of(raw: Any) -> dict[int, ProcessSeries]:
    """pid -> its series, from a block's ``processes`` or ``servers`` (malformed entries left out)."""
    series: dict[int, ProcessSeries] = {}
    for key, entry in (raw.items() if isinstance(raw, Mapping) else ()):
        try:
            pid = int(key)
        except (TypeError, ValueError):
            continue
        if isinstance(entry, Mapping):
            series[pid] = ProcessSeries.read(pid, entry)
    return series


@dataclass(frozen=True)
class SystemSamples:
    """A run's samples: ``t_ns`` per tick, and every series aligned with it."""
    t_ns: list[int]
    interval_s: float
    system: dict[str, list[Any]]  # cpu_percent, per_core_percent, iowait_percent, disk_read_bytes_per_s, ...
    processes: dict[int, ProcessSeries]
    gpu_names: list[str]
    gpu: dict[str, list[list[Any]]]  # util_percent, mem_used_bytes, ...: per tick, one value per device
    absent: dict[str, str]
    cost: dict[str, Any]
    # the servers on this machine that the job's connections reached (a local store, a proxy), not the job's own
    servers: dict[int, ProcessSeries] = field(default_factory=dict)
    server_ports: dict[int, int] = field(default_factory=dict)  # pid -> the port it served the job on
    # pid -> the cores it kept busy once the job had ended (no requests): a fixed load, not a cost per request
    server_idle_cores: dict[int, float] = field(default_factory=dict)

    @classmethod
    def read(cls, block: Any) -> SystemSamples:
        block = block if isinstance(block, Mapping) else {}
        t_ns = block.get("t_ns")
        t_ns = [int(t) for t in t_ns if _number(t)] if isinstance(t_ns, list) else []
        system = block.get("system") if isinstance(block.get("system"), Mapping) else {}
        processes = _series_of(block.get("processes"))
        servers = _series_of(block.get("servers"))
        raw_servers = block["servers"] if isinstance(block.get("servers"), Mapping) else {}
        ports: dict[int, int] = {}
        idle: dict[int, float] = {}
        for key, entry in raw_servers.items():  # each server's port, and its CPU once the job had ended
            pid = int(key) if str(key).isdigit() else None
            if pid not in servers or not isinstance(entry, Mapping):
                continue
            if isinstance(entry.get("port"), int):
                ports[pid] = entry["port"]
            if _number(entry.get("idle_cores")):
                idle[pid] = float(entry["idle_cores"])
        gpu_block = block.get("gpu") if isinstance(block.get("gpu"), Mapping) else {}
        raw_names = gpu_block.get("names")
        names = raw_names if isinstance(raw_names, list) else []
        gpu = {key: [_numbers_or_none(tick) if isinstance(tick, list) else [tick if _number(tick) else None]
                     for tick in values]
               for key, values in gpu_block.items() if key != "names" and isinstance(values, list)}
        interval = block.get("interval_s")
        return cls(t_ns, float(interval) if _number(interval) else 0.1,
                   {k: v for k, v in system.items() if isinstance(v, list)}, processes, [str(n) for n in names],
                   gpu, dict(block.get("absent") or {}) if isinstance(block.get("absent"), Mapping) else {},
                   dict(block.get("cost") or {}) if isinstance(block.get("cost"), Mapping) else {}, servers, ports,
                   idle)

    @property
    def present(self) -> bool:
        return bool(self.t_ns)

    # --- system-wide series -----------------------------------------------------------------------------

    def scalar_series(self) -> dict[str, list[float | None]]:
        """System-wide series with one number per tick (not the per-core lists), in the sampler's order."""
        return {name: _numbers_or_none(values) for name, values in self.system.items()
                if any(_number(v) for v in values)}

    def mean(self, name: str) -> float | None:
        values = [v for v in self.system.get(name, []) if _number(v)]
        return statistics.fmean(values) if values else None

    def peak(self, name: str) -> float | None:
        values = [v for v in self.system.get(name, []) if _number(v)]
        return max(values) if values else None

    # --- the job's processes ----------------------------------------------------------------------------

    def tree_rss(self) -> list[int | None]:
        """Per tick, the summed RSS of every process of the job sampled then (None: none was)."""
        totals: list[int | None] = [None] * len(self.t_ns)
        for proc in self.processes.values():
            for tick, rss in proc.rss_at().items():
                if 0 <= tick < len(totals):
                    totals[tick] = (totals[tick] or 0) + int(rss)
        return totals

    @property
    def tree_rss_peak(self) -> int | None:
        values = [v for v in self.tree_rss() if v is not None]
        return max(values) if values else None

    def cpu_between(self, pid: int | None, start_ns: int, end_ns: int) -> float | None:
        """CPU seconds ``pid`` (a process of the job, or a local server of it) used between two instants, from its
        cumulative CPU time at the ticks inside."""
        proc = (self.processes.get(pid) or self.servers.get(pid)) if pid is not None else None
        if proc is None or not self.t_ns:
            return None
        points = [(self.t_ns[t], c) for t, c in zip(proc.ticks, proc.cpu_s)
                  if 0 <= t < len(self.t_ns) and c is not None and start_ns <= self.t_ns[t] <= end_ns]
        if len(points) < 2:
            return None
        (t0, c0), (t1, c1) = points[0], points[-1]
        return (c1 - c0) * (end_ns - start_ns) / (t1 - t0) if t1 > t0 else None

    def tree_cores(self) -> list[float]:
        """Per tick, CPU seconds the job's processes used since the previous tick (consecutive readings only)."""
        tree = [0.0] * len(self.t_ns)
        for proc in self.processes.values():
            readings = [(t, c) for t, c in zip(proc.ticks, proc.cpu_s) if c is not None]
            for (t0, c0), (t1, c1) in zip(readings, readings[1:]):
                if t1 == t0 + 1 and 0 <= t1 < len(tree):
                    tree[t1] += c1 - c0
        return tree

    # --- GPUs -------------------------------------------------------------------------------------------

    @property
    def gpu_count(self) -> int:
        width = max((len(t) for series in self.gpu.values() for t in series), default=0)
        return max(width, len(self.gpu_names))

    def gpu_series(self, key: str) -> list[list[float | None]]:
        """Per device, the series ``key`` (``util_percent``, ``mem_used_bytes``, ...) with one value per tick."""
        ticks = self.gpu.get(key) or []
        width = max((len(t) for t in ticks), default=0)
        return [[t[k] if k < len(t) else None for t in ticks] for k in range(width)]

    def gpu_mean(self, key: str) -> list[float | None]:
        return [statistics.fmean(v) if (v := [x for x in s if x is not None]) else None for s in self.gpu_series(key)]

    def gpu_peak(self, key: str) -> list[float | None]:
        return [max(v) if (v := [x for x in s if x is not None]) else None for s in self.gpu_series(key)]

    def gpu_util_mean(self) -> float | None:
        """Mean over ticks and devices of GPU utilization (%)."""
        values = [v for s in self.gpu_series("util_percent") for v in s if v is not None]
        return statistics.fmean(values) if values else None

    def peak_device_memory(self) -> int | None:
        """The most memory in use on any one device at any tick (bytes)."""
        values = [v for v in self.gpu_peak("mem_used_bytes") if v is not None]
        return int(max(values)) if values else None
