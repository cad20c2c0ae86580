"""Summaries of the launcher's samples: CPU per process role, memory growth, iowait, /dev/shm, GPU.

Everything the sampler could not read stays ``None`` here: absent is never reported as zero.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from stallscope.session import Session


@dataclass(frozen=True)
class ProcessUsage:
    pid: int
    role: str
    cpu_cores: float | None  # mean cores used over the sampled life
    rss_start: int | None
    rss_peak: int | None
    rss_end: int | None
    rss_late_growth: int | None  # RSS growth over the second half of the samples
    private_start: int | None  # USS: pages only this process holds (grows with copy-on-write copies)
    private_end: int | None
    private_growth_per_min: float | None
    private_late_growth: int | None  # growth over the second half of its samples: still growing, or settled?
    read_bytes: int | None
    seconds: float


@dataclass(frozen=True)
class SystemSummary:
    present: bool
    ticks: int
    cpu_percent_mean: float | None
    iowait_percent_mean: float | None
    disk_read_bytes_per_s_mean: float | None
    shm_used_peak: int | None
    tree_rss_peak: int | None
    main_cpu_cores: float | None
    workers: list[ProcessUsage] = field(default_factory=list)
    gpu_util_mean: list[float] | None = None
    gpu_mem_peak: list[float] | None = None
    sampler_core_fraction: float | None = None
    absent: dict[str, str] = field(default_factory=dict)
    other_cores_mean: float | None = None  # CPU used by processes outside the job (noisy neighbours)


def _mean(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _roles(session: Session) -> dict[int, str]:
    roles = {p.pid: p.role for p in session.processes}
    for w in session.worker_starts:
        roles[w.pid] = "worker"
    return roles


def process_cpu_between(session: Session, pid: int | None, start_ns: int, end_ns: int) -> float | None:
    """CPU seconds ``pid`` used between two instants, from the sampled cumulative CPU times."""
    samples = session.samples or {}
    t_ns = samples.get("t_ns") or []
    entry = (samples.get("processes") or {}).get(str(pid))
    if not entry or not t_ns:
        return None
    points = [(t_ns[tick], cpu) for tick, cpu in zip(entry.get("ticks") or [], entry.get("cpu_s") or [])]
    inside = [(t, c) for t, c in points if start_ns <= t <= end_ns]
    if len(inside) < 2:
        return None
    (t0, c0), (t1, c1) = inside[0], inside[-1]
    return (c1 - c0) * (end_ns - start_ns) / (t1 - t0) if t1 > t0 else None


def helper_cpu_between(session: Session, main_pid: int | None, start_ns: int, end_ns: int) -> float | None:
    """CPU seconds of the training process's other descendants (not DataLoader workers) in a window.

    Such helpers (a local data server, a decoding service, a cache daemon the script starts) do work
    for the samples it consumes, so their CPU counts against the cores like the workers' own."""
    samples = session.samples or {}
    processes = samples.get("processes") or {}
    if main_pid is None or not processes:
        return None
    roles = _roles(session)
    ranks = {r.pid for r in session.ranks}
    parents = {int(k): e.get("ppid") for k, e in processes.items()}
    total = 0.0
    for pid in parents:
        if pid == main_pid or roles.get(pid) == "worker" or pid in ranks:
            continue
        ancestor, hops = parents.get(pid), 0
        while ancestor is not None and ancestor != main_pid and hops < 16:
            ancestor, hops = parents.get(ancestor), hops + 1
        if ancestor == main_pid:
            total += process_cpu_between(session, pid, start_ns, end_ns) or 0.0
    return total


def summarize_samples(session: Session) -> SystemSummary:
    samples = session.samples or {}
    t_ns: list[int] = samples.get("t_ns") or []
    if not t_ns:
        return SystemSummary(False, 0, None, None, None, None, None, None,
                             absent={"samples": "no system samples in this session"})
    system = samples.get("system", {})
    roles = _roles(session)
    interval = float(samples.get("interval_s") or 0.1)
    usages: list[ProcessUsage] = []
    tree_rss = [0] * len(t_ns)
    main_cores = None
    main_pid = session.main_pid
    for key, entry in (samples.get("processes") or {}).items():
        pid = int(key)
        ticks = entry.get("ticks") or []
        for tick, rss in zip(ticks, entry.get("rss_bytes") or []):
            if 0 <= tick < len(tree_rss) and rss is not None:
                tree_rss[tick] += rss
        usage = _usage(pid, roles.get(pid, "child"), entry, t_ns, interval)
        if pid == main_pid:
            main_cores = usage.cpu_cores
        if usage.role == "worker":
            usages.append(usage)
    gpu = samples.get("gpu")
    gpu_util = gpu_mem = None
    if gpu and gpu.get("util_percent"):
        columns = list(zip(*gpu["util_percent"]))
        gpu_util = [_mean(list(c)) for c in columns]
        gpu_mem = [max((v for v in c if v is not None), default=None) for c in zip(*gpu.get("mem_used_bytes", []))]
    shm = [v for v in system.get("shm_used_bytes", []) if v is not None]
    cost = samples.get("cost") or {}
    other = _other_cores(samples, t_ns)
    return SystemSummary(
        present=True,
        ticks=len(t_ns),
        cpu_percent_mean=_mean(system.get("cpu_percent", [])),
        iowait_percent_mean=_mean(system.get("iowait_percent", [])),
        disk_read_bytes_per_s_mean=_mean(system.get("disk_read_bytes_per_s", [])),
        shm_used_peak=max(shm) if shm else None,
        tree_rss_peak=max(tree_rss) if any(tree_rss) else None,
        main_cpu_cores=main_cores,
        workers=usages,
        gpu_util_mean=gpu_util,
        gpu_mem_peak=gpu_mem,
        sampler_core_fraction=cost.get("core_fraction"),
        absent=dict(samples.get("absent") or {}),
        other_cores_mean=other,
    )


def _other_cores(samples: dict[str, Any], t_ns: list[int]) -> float | None:
    """Mean cores busy outside the job's process tree: system-wide busy cores minus the tree's."""
    system = samples.get("system", {})
    per_core = system.get("per_core_percent") or []
    if len(t_ns) < 3 or not per_core:
        return None
    tree = [0.0] * len(t_ns)
    for entry in (samples.get("processes") or {}).values():
        ticks, cpu = entry.get("ticks") or [], entry.get("cpu_s") or []
        for (t0, c0), (t1, c1) in zip(zip(ticks, cpu), zip(ticks[1:], cpu[1:])):
            if t1 == t0 + 1:
                tree[t1] += c1 - c0
    others = []
    for tick in range(1, len(t_ns)):
        dt = (t_ns[tick] - t_ns[tick - 1]) / 1e9
        if dt <= 0 or tick >= len(per_core):
            continue
        busy = sum(per_core[tick]) / 100.0
        others.append(max(0.0, busy - tree[tick] / dt))
    return statistics.fmean(others) if others else None


def _usage(pid: int, role: str, entry: dict[str, Any], t_ns: list[int], interval: float) -> ProcessUsage:
    ticks = entry.get("ticks") or []
    cpu = entry.get("cpu_s") or []
    seconds = (t_ns[ticks[-1]] - t_ns[ticks[0]]) / 1e9 if len(ticks) > 1 else 0.0
    cores = (cpu[-1] - cpu[0]) / seconds if len(cpu) > 1 and seconds > 0 else None
    rss = [v for v in entry.get("rss_bytes") or [] if v]  # 0 is an exiting process, not a reading
    uss = entry.get("uss_bytes") or []
    uss_ticks = entry.get("uss_ticks") or []
    growth = None
    if len(uss) >= 3:
        span = (t_ns[uss_ticks[-1]] - t_ns[uss_ticks[0]]) / 1e9
        growth = (uss[-1] - uss[0]) / span * 60 if span > 0 else None
    reads = [v for v in entry.get("read_bytes") or [] if v is not None]
    late = uss[-1] - uss[len(uss) // 2] if len(uss) >= 3 else None
    rss_late = rss[-1] - rss[len(rss) // 2] if len(rss) >= 3 else None
    return ProcessUsage(pid, role, cores, rss[0] if rss else None, max(rss) if rss else None,
                        rss[-1] if rss else None, rss_late,
                        uss[0] if uss else None, uss[-1] if uss else None, growth, late,
                        reads[-1] - reads[0] if len(reads) > 1 else None, seconds)
