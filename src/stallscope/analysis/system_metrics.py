"""Summaries of the launcher's samples: CPU per process role, memory growth, iowait, /dev/shm, GPU.

Everything the sampler could not read stays ``None`` here: absent is never reported as zero.
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from stallscope.session import Session
from stallscope.system_samples import TREE_REFRESH_S, ProcessSeries, SystemSamples


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
    gpu_util_mean: list[float | None] | None = None  # per GPU; None for a GPU with no reading
    gpu_mem_peak: list[float | None] | None = None
    sampler_core_fraction: float | None = None
    absent: dict[str, str] = field(default_factory=dict)
    other_cores_mean: float | None = None  # CPU used by processes outside the job (noisy neighbours)


def _roles(session: Session) -> dict[int, str]:
    roles = {p.pid: p.role for p in session.processes}
    for w in session.worker_starts:
        roles[w.pid] = "worker"
    return roles


def helper_cpu_between(session: Session, main_pid: int | None, start_ns: int, end_ns: int) -> float | None:
    """CPU seconds of the training process's other descendants (not DataLoader workers) in a window.

    Such helpers (a local data server, a decoding service, a cache daemon the script starts) do work
    for the samples it consumes, so their CPU counts against the cores like the workers' own."""
    processes = session.system.processes
    if main_pid is None or not processes:
        return None
    roles = _roles(session)
    ranks = {r.pid for r in session.ranks}
    parents = {pid: proc.ppid for pid, proc in processes.items()}
    total = 0.0
    for pid in parents:
        if pid == main_pid or roles.get(pid) == "worker" or pid in ranks:
            continue
        ancestor, hops = parents.get(pid), 0
        while ancestor is not None and ancestor != main_pid and hops < 16:
            ancestor, hops = parents.get(ancestor), hops + 1
        if ancestor == main_pid:
            total += session.system.cpu_between(pid, start_ns, end_ns) or 0.0
    return total


def local_server_cpu_between(session: Session, start_ns: int, end_ns: int) -> float:
    """CPU seconds the servers on this machine that the job's requests reached (a local object store, a proxy in
    front of one) used in a window for those requests: their CPU less what they burn idle (read once the job ended);
    0 where the job timed no requests.

    That work grows with the requests the job sends and shares its cores, so it counts per sample like a helper
    process's; their idle CPU, like other programs', stays a fixed load. A job that timed no requests reached them for
    something else (a notebook's kernel, a tracker's service) and their CPU is left where it was."""
    samples = session.system
    if not samples.servers or not any(f.requests for f in session.fetches):
        return 0.0
    seconds = (end_ns - start_ns) / 1e9
    return sum(max(0.0, (samples.cpu_between(pid, start_ns, end_ns) or 0.0)
                   - samples.server_idle_cores.get(pid, 0.0) * seconds) for pid in samples.servers)


def summarize_samples(session: Session) -> SystemSummary:
    samples = session.system
    if not samples.present:
        return SystemSummary(False, 0, None, None, None, None, None, None)
    roles = _roles(session)
    usages: list[ProcessUsage] = []
    main_cores = None
    main_pid = session.main_pid
    # a worker's memory from the moment its loop started: a spawned worker imports torch and unpickles the
    # dataset before that, hundreds of MiB that are start-up, not growth
    ready = {ws.pid: ws.ready_ns for ws in session.worker_starts}
    for pid, proc in samples.processes.items():
        usage = _usage(proc, roles.get(pid, "child"), samples.t_ns, ready.get(pid))
        if pid == main_pid:
            main_cores = usage.cpu_cores
        if usage.role == "worker":
            usages.append(usage)
    gpu_util = gpu_mem = None
    if samples.gpu.get("util_percent"):
        gpu_util = samples.gpu_mean("util_percent")
        gpu_mem = samples.gpu_peak("mem_used_bytes")
    shm = samples.peak("shm_used_bytes")
    return SystemSummary(
        present=True,
        ticks=len(samples.t_ns),
        cpu_percent_mean=samples.mean("cpu_percent"),
        iowait_percent_mean=samples.mean("iowait_percent"),
        disk_read_bytes_per_s_mean=samples.mean("disk_read_bytes_per_s"),
        shm_used_peak=int(shm) if shm is not None else None,
        tree_rss_peak=samples.tree_rss_peak,
        main_cpu_cores=main_cores,
        workers=usages,
        gpu_util_mean=gpu_util,
        gpu_mem_peak=gpu_mem,
        sampler_core_fraction=samples.cost.get("core_fraction"),
        absent=dict(samples.absent),
        other_cores_mean=_other_cores(samples, unseen=_unseen_processes(session)),
    )


def _other_cores(samples: SystemSamples, start_ns: int | None = None, end_ns: int | None = None,
                 unseen: Sequence[tuple[int, int]] = ()) -> float | None:
    """Mean cores busy outside the job's process tree: system-wide busy cores minus the tree's, over the ticks
    between ``start_ns`` and ``end_ns`` (the whole run when not given).

    The sampler looks for new processes of the tree once every ``TREE_REFRESH_S``, so a process that has just
    started (DataLoader workers at each epoch's start) runs for up to that long before its CPU is read: those
    ticks, and the tick a process was last seen, are left out rather than counted as someone else's CPU; so are
    the ticks while a process the recorder saw and the sampler never read ran (``unseen``: workers of epochs
    shorter than a look)."""
    per_core = samples.system.get("per_core_percent") or []
    t_ns = samples.t_ns
    if len(t_ns) < 3 or not per_core:
        return None
    tree = samples.tree_cores()
    unsure = _ticks_around_process_changes(samples)
    for first, last in unseen:  # ticks (t[i-1], t[i]] that overlap (first, last)
        unsure.update(range(max(1, bisect.bisect_right(t_ns, first)), bisect.bisect_left(t_ns, last) + 1))
    others = []
    for tick in range(1, len(t_ns)):
        dt = (t_ns[tick] - t_ns[tick - 1]) / 1e9
        if dt <= 0 or tick >= len(per_core) or tick in unsure:
            continue
        if (start_ns is not None and t_ns[tick - 1] < start_ns) or (end_ns is not None and t_ns[tick] > end_ns):
            continue
        busy = sum(per_core[tick]) / 100.0
        others.append(max(0.0, busy - tree[tick] / dt))
    return statistics.fmean(others) if others else None


def _ticks_around_process_changes(samples: SystemSamples) -> set[int]:
    """Ticks at which the tree's CPU may be under-read: from ``TREE_REFRESH_S`` and one sampling interval before a
    process's first reading (it ran unseen) to that reading, and the tick after its last (it ended between two)."""
    t_ns = samples.t_ns
    last_tick = len(t_ns) - 1
    # The sampler looks when more than TREE_REFRESH_S has passed since its last look, at a tick: up to one
    # interval more.
    unseen_ns = (TREE_REFRESH_S + max(0.0, samples.interval_s or 0.0)) * 1e9
    unsure: set[int] = set()
    for proc in samples.processes.values():
        ticks = [t for t, c in zip(proc.ticks, proc.cpu_s) if c is not None and 0 <= t <= last_tick]
        if not ticks:
            continue
        first, last = ticks[0], ticks[-1]
        if first > 0:
            tick = first
            while tick > 0 and t_ns[first] - t_ns[tick - 1] <= unseen_ns:
                unsure.add(tick)
                tick -= 1
            unsure.add(tick)
        if last < last_tick:
            unsure.add(last + 1)
    return unsure


#: Other programs' load worth saying (report's evidence) and acting on (tune runs a loaded original again): a quarter
#: of a CPU is beyond what the sampler's rounding and the system's own daemons show on a quiet machine (calibration:
#: system-other-load-notable).
OTHER_LOAD_NOTABLE_CPUS = 0.25


def other_cores_between(session: Session, start_ns: int, end_ns: int) -> float | None:
    """Mean cores other programs kept busy between two instants (the steady steps, say)."""
    samples = session.system
    return _other_cores(samples, start_ns, end_ns, _unseen_processes(session)) if samples.present else None


def _unseen_processes(session: Session) -> list[tuple[int, int]]:
    """(from, to) of each process of the job the recorder saw and the sampler never read: from its recorder's start
    to its last fetch or its exit (a look's time where neither is known). Its CPU is the job's, not other
    programs'."""
    read = set(session.system.processes)
    last: dict[int, int] = {}
    for fetch in session.fetches:
        last[fetch.pid] = max(last.get(fetch.pid, 0), fetch.end_ns)
    spans = []
    for proc in session.processes:
        if proc.pid in read:
            continue
        ends = [t for t in (proc.exit_ns, last.get(proc.pid)) if t is not None]
        spans.append((proc.mono_ns, max(ends) if ends else proc.mono_ns + int(TREE_REFRESH_S * 1e9)))
    return spans


def _since(proc: ProcessSeries, t_ns: list[int], start_ns: int | None) -> ProcessSeries:
    """``proc``'s readings from ``start_ns`` on (all of them where it is None, or where none is that late)."""
    if start_ns is None:
        return proc

    def kept(ticks: list[int]) -> list[bool]:
        return [0 <= t < len(t_ns) and t_ns[t] >= start_ns for t in ticks]

    def pick(values: list, mask: list[bool]) -> list:
        return [v for v, k in zip(values, mask) if k]

    keep, keep_uss = kept(proc.ticks), kept(proc.uss_ticks)
    if not any(keep):
        return proc
    return dataclasses.replace(proc, ticks=pick(proc.ticks, keep), cpu_s=pick(proc.cpu_s, keep),
                               rss_bytes=pick(proc.rss_bytes, keep),
                               uss_ticks=pick(proc.uss_ticks, keep_uss), uss_bytes=pick(proc.uss_bytes, keep_uss))


def _usage(proc: ProcessSeries, role: str, t_ns: list[int], grown_since_ns: int | None = None) -> ProcessUsage:
    """What ``proc`` used over its sampled life; its memory's growth from ``grown_since_ns`` on (a worker's loop
    start), where given."""
    ticks = [t for t in proc.ticks if 0 <= t < len(t_ns)]
    cpu = [c for c in proc.cpu_s if c is not None]
    seconds = (t_ns[ticks[-1]] - t_ns[ticks[0]]) / 1e9 if len(ticks) > 1 else 0.0
    cores = (cpu[-1] - cpu[0]) / seconds if len(cpu) > 1 and seconds > 0 else None
    everything = [v for v in proc.rss_bytes if v]  # 0 is an exiting process, not a reading
    later = _since(proc, t_ns, grown_since_ns)
    rss = [v for v in later.rss_bytes if v]
    uss = [v for v in later.uss_bytes if v is not None]
    uss_ticks = [t for t in later.uss_ticks if 0 <= t < len(t_ns)]
    growth = None
    if len(uss) >= 3 and len(uss_ticks) >= 2:
        span = (t_ns[uss_ticks[-1]] - t_ns[uss_ticks[0]]) / 1e9
        growth = (uss[-1] - uss[0]) / span * 60 if span > 0 else None
    reads = [v for v in proc.read_bytes if v is not None]
    late = uss[-1] - uss[len(uss) // 2] if len(uss) >= 3 else None
    rss_late = rss[-1] - rss[len(rss) // 2] if len(rss) >= 3 else None
    return ProcessUsage(proc.pid, role, cores, rss[0] if rss else None, max(everything) if everything else None,
                        everything[-1] if everything else None, rss_late,
                        uss[0] if uss else None, uss[-1] if uss else None, growth, late,
                        reads[-1] - reads[0] if len(reads) > 1 else None, seconds)
