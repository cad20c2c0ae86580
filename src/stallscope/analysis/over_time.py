"""The run over time: throughput and data wait per window, whether the run slowed (or sped up) beyond its own
noise, where it began, which part of the step changed and what the machine showed meanwhile; and memory that grew.

It reads the run's windows (``Session.windows``, counted by ``folding.py`` for every second of the run, kept or
folded) and the system samples, so it sees a run of days whole. The early and the late quarter of the windows are
compared; a change is called only beyond ``CHANGE_AT``, and only where the two quarters' rates barely overlap (in
``SEPARATION`` of the pairs of an early and a late window, the late one is on the same side): a spread measured
around the early median counts a trend that begins early as noise. Where it began is the change point of a level
followed by a line that fits the rates best. Its cause is the part of the step whose time per step grew the most,
read with what the samples say: a disk read rate that rose (the page cache no longer holds the data), batches that
grew (the data changed: ``batch_bytes``, one batch sized a second), a clock that fell (the CPUs', or the busy GPUs'
SM clock: throttling), garbage collections that take half the growth (``recorder/gc_timing.py``), a training process
whose memory kept growing (a loop that keeps more at every step). Memory that kept growing is also a finding of its
own, the training process's and the DataLoader workers' (copy-on-read), each with where it began.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

from stallscope.analysis.system_metrics import OTHER_LOAD_NOTABLE_CPUS, other_cores_between
from stallscope.session import Session

#: Fewer steady windows than this: too little of a run to tell a trend from noise (a quarter of them, at least 3,
#: are compared with the last quarter).
MIN_WINDOWS = 12
#: The smallest change of the steps' rate called a change, late windows against early ones.
CHANGE_AT = 0.15
#: Of the pairs of an early and a late window, the share in which the late one is slower (or faster): 4 against 4
#: windows in random order reach 0.9 in 2 orders of 70.
SEPARATION = 0.9
#: The part of the step whose time grew is named when it accounts for at least this share of the step's growth.
PART_SHARE = 0.5
#: Disk reads that rose this many times, to at least ``DISK_READ_FLOOR`` bytes/s: the data no longer comes from the
#: page cache.
DISK_READ_RISE = 4.0
DISK_READ_FLOOR = 1 << 20
#: Garbage collection pauses: the last half's longest collection at least this many times the first quarter's, and
#: at least ``GC_PAUSE_FLOOR_MS`` (a full collection walks the whole heap: its length follows what the process keeps).
GC_PAUSE_GROWTH = 2.0
GC_PAUSE_FLOOR_MS = 50.0
#: Memory growth: late windows' resident memory at least this many times the early ones', and by at least
#: ``MEMORY_GROWTH_FLOOR`` bytes.
MEMORY_GROWTH = 1.25
MEMORY_GROWTH_FLOOR = 64 << 20
#: A clock (the GPUs' SM clock, or the CPUs') that fell by this share, late windows against early ones: the device
#: throttles (heat, a power limit), and the step's compute takes longer at the same work.
CLOCK_FALL = 0.1
GPU_BUSY_PERCENT = 20.0
#: Batches that grew this many times (their tensors' bytes): the data changed over the run (longer sequences,
#: larger images), and the step's time follows it.
BATCH_GROWTH = 1.25
#: Other programs' CPUs (the cores they kept busy), late windows against early ones, that changed by this much: a
#: change of the run's rate the same way is the machine's load, not the job (twice report's notable other load).
OTHER_LOAD_CHANGE_CPUS = 2 * OTHER_LOAD_NOTABLE_CPUS
PARTS = ("data_wait", "forward", "backward", "optimizer", "step_code")


@dataclass(frozen=True)
class WindowFigures:
    start_ns: int
    end_ns: int
    steps: int
    steps_per_s: float | None
    data_wait_fraction: float | None
    per_step_ms: dict[str, float]  # PARTS -> milliseconds per step
    fetch_ms: float | None  # the input pipeline's time per fetched batch (workers, or the training process)
    gc_ms: float | None  # the training process's garbage collections per step (inside whichever part ran them)
    gc_longest_ms: float | None  # its longest collection in the window
    rss_bytes: int | None  # the training process, mean over the window's samples
    #: the other processes of the job (the DataLoader workers), summed: each its unique memory (USS) where read,
    #: else its RSS, mean over the window's samples
    workers_rss_bytes: int | None
    disk_read_bytes_per_s: float | None
    iowait_percent: float | None
    batch_bytes: float | None = None  # the training process's batches' tensor bytes, mean of those sized in it
    cpu_mhz: float | None = None  # the CPUs' clock, mean over them and the window
    gpu_mhz: float | None = None  # the GPUs' SM clock, mean over them and the window


@dataclass(frozen=True)
class RunChange:
    """The run slowed (``direction`` "slower") or sped up, from ``began_ns`` on: the late rate over the early."""
    direction: str
    ratio: float
    early_steps_per_s: float
    late_steps_per_s: float
    began_ns: int
    part: str  # one of PARTS, or "several"
    cause: str  # page-cache, input, data-growing, clocks, gc, memory-growth, compute, step-code, other-load, unknown
    per_step_ms: dict[str, tuple[float, float]]  # part -> (early, late)
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryGrowth:
    """Memory that kept growing: the training process's resident memory, or the DataLoader workers' together."""
    who: str  # "training" or "workers"
    early_bytes: int
    late_bytes: int
    began_ns: int


@dataclass(frozen=True)
class GcPauses:
    """The training process's longest garbage collections, grown: the early windows' against the late ones'."""
    early_ms: float
    late_ms: float
    began_ns: int


@dataclass(frozen=True)
class OverTime:
    window_s: float
    windows: list[WindowFigures]
    change: RunChange | None
    memory: list[MemoryGrowth]
    gc_pauses: GcPauses | None = None


def over_time(session: Session, pid: int | None = None) -> OverTime | None:
    """The run's windows and what changed over them; None for a session without windows (recorded before them)."""
    pid = session.main_pid if pid is None else pid
    if not session.windows:
        return None
    window_ns = int(session.recording.get("window_ns") or 0) or _typical_width(session.windows)
    samples = _samples_by_window(session, pid, window_ns)
    figures = [_figures(start, rows, pid, window_ns, samples.get(start, {}))
               for start, rows in sorted(_rows_by_window(session.windows).items())]
    steady = [w for w in figures if w.steps_per_s][1:]  # the first window holds the start-up
    return OverTime(window_ns / 1e9, figures, _with_other_load(session, _change(steady), steady), _memory(steady),
                    _gc_pauses(steady))


def _with_other_load(session: Session, found: RunChange | None, windows: list[WindowFigures]) -> RunChange | None:
    """A change that came with other programs' load changing the same way (more of it as the run slowed, less as
    it sped up) is the machine's, not the job's: its cause then says so, ahead of what the step's parts show."""
    if found is None:
        return None
    early, late = _quarters(windows)
    a = other_cores_between(session, early[0].start_ns, early[-1].end_ns)
    b = other_cores_between(session, late[0].start_ns, late[-1].end_ns)
    if a is None or b is None or abs(b - a) < OTHER_LOAD_CHANGE_CPUS or (b > a) != (found.direction == "slower"):
        return found
    return dataclasses.replace(found, cause="other-load",
                               evidence={**found.evidence, "other_cpus": (round(a, 2), round(b, 2))})


def _typical_width(rows: list[dict[str, Any]]) -> int:
    widths = [int(r["end_ns"]) - int(r["start_ns"]) for r in rows]
    return int(statistics.median(widths)) if widths else 1


def _rows_by_window(rows: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    by_start: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_start.setdefault(int(row["start_ns"]), []).append(row)
    return by_start


def _figures(start: int, rows: list[dict[str, Any]], pid: int | None, window_ns: int,
             samples: dict[str, float | None]) -> WindowFigures:
    own = next((r for r in rows if r.get("pid") == pid), None)
    fetches = sum(int(r.get("fetches", 0)) for r in rows)
    fetch_ms = sum(int(r.get("fetch_ns", 0)) for r in rows) / fetches / 1e6 if fetches else None
    steps = int(own.get("steps", 0)) if own else 0
    step_ns = int(own.get("step_ns", 0)) if own else 0
    parts: dict[str, float] = {}
    if own and steps and step_ns > 0:
        timed = {"data_wait": own.get("wait_ns", 0), "forward": own.get("forward_ns", 0),
                 "backward": own.get("backward_ns", 0), "optimizer": own.get("optimizer_ns", 0)}
        parts = {name: int(ns) / steps / 1e6 for name, ns in timed.items()}
        parts["step_code"] = max(0.0, step_ns / steps / 1e6 - sum(parts.values()))
    gc_ms = int(own.get("gc_ns", 0)) / steps / 1e6 if own and steps and "gc_ns" in own else None
    longest = int(own.get("gc_longest_ns", 0)) / 1e6 if own and own.get("gc_longest_ns") else None
    sized = int(own.get("batches_sized", 0)) if own else 0
    return WindowFigures(
        start, start + window_ns, steps, steps * 1e9 / step_ns if steps and step_ns > 0 else None,
        min(1.0, int(own.get("wait_ns", 0)) / step_ns) if own and step_ns > 0 else None, parts, fetch_ms, gc_ms,
        longest, _int(samples.get("rss")), _int(samples.get("workers_rss")), samples.get("disk"), samples.get("iowait"),
        int(own.get("batch_bytes", 0)) / sized if own and sized else None, samples.get("cpu_mhz"),
        samples.get("gpu_mhz"))


def _int(value: float | None) -> int | None:
    return int(value) if value is not None else None


def _samples_by_window(session: Session, pid: int | None, window_ns: int) -> dict[int, dict[str, float | None]]:
    """Per window start: the mean of the training process's RSS, the other processes' summed RSS, the disk read
    rate and iowait over the samples taken in it."""
    system = session.system
    if not system.present or not session.windows:
        return {}
    origin = min(int(r["start_ns"]) for r in session.windows)
    sums: dict[int, dict[str, list[float]]] = {}

    def add(t_ns: int, name: str, value: float | None) -> None:
        if value is None:
            return
        start = origin + (t_ns - origin) // window_ns * window_ns
        sums.setdefault(start, {}).setdefault(name, []).append(float(value))

    def window_of(t_ns: int) -> int:
        return origin + (t_ns - origin) // window_ns * window_ns

    others: dict[int, float] = {}  # window -> the other processes' memory, each its mean over the window, summed
    for proc in system.processes.values():
        if proc.pid == pid:
            for tick, rss in proc.rss_at().items():
                if 0 <= tick < len(system.t_ns):
                    add(system.t_ns[tick], "rss", rss)
            continue
        # a forked worker's RSS counts the pages it shares with the training process; its USS, where read, is
        # what it holds alone (the pages copy-on-read copied)
        own = [(t, v) for t, v in zip(proc.uss_ticks, proc.uss_bytes) if v] or list(proc.rss_at().items())
        per_window: dict[int, list[float]] = {}
        for tick, value in own:
            if 0 <= tick < len(system.t_ns):
                per_window.setdefault(window_of(system.t_ns[tick]), []).append(float(value))
        # USS is read every few seconds: a window of the process's life without a reading holds the last one
        means: dict[int, float] = {}
        last: float | None = None
        for start in range(min(per_window, default=0), max(per_window, default=-1) + 1, window_ns):
            last = statistics.fmean(per_window[start]) if start in per_window else last
            if last is not None:
                means[start] = last
        for start, held in means.items():
            others[start] = others.get(start, 0.0) + held
    for start, summed in others.items():
        add(start, "workers_rss", summed)
    for name, key in (("disk_read_bytes_per_s", "disk"), ("iowait_percent", "iowait"), ("cpu_mhz", "cpu_mhz")):
        for t_ns, value in zip(system.t_ns, system.system.get(name, [])):
            add(t_ns, key, value if isinstance(value, (int, float)) else None)
    # the busy GPUs' clocks only: an idle one (a rank on another, a spare) clocks down and is no sign of throttling
    gpu = system.gpu
    for t_ns, clocks, utils in zip(system.t_ns, gpu.get("sm_clock_mhz") or [], gpu.get("util_percent") or []):
        busy = [c for c, u in zip(clocks, utils) if c is not None and u is not None and u >= GPU_BUSY_PERCENT]
        add(t_ns, "gpu_mhz", statistics.fmean(busy) if busy else None)
    return {start: {name: statistics.fmean(values) for name, values in named.items()}
            for start, named in sums.items()}


def _quarters(windows: list[WindowFigures]) -> tuple[list[WindowFigures], list[WindowFigures]]:
    k = max(3, len(windows) // 4)
    return windows[:k], windows[-k:]


def _change(windows: list[WindowFigures]) -> RunChange | None:
    if len(windows) < MIN_WINDOWS:
        return None
    early, late = _quarters(windows)
    early_rates = [w.steps_per_s or 0.0 for w in early]
    late_rates = [w.steps_per_s or 0.0 for w in late]
    base, last = statistics.median(early_rates), statistics.median(late_rates)
    if base <= 0:
        return None
    ratio = last / base
    slower = sum(b < a for a in early_rates for b in late_rates) / (len(early_rates) * len(late_rates))
    separated = slower >= SEPARATION if ratio < 1 else 1 - slower >= SEPARATION
    if abs(ratio - 1) < CHANGE_AT or not separated:
        return None
    per_step = {part: (_mean_part(early, part), _mean_part(late, part)) for part in PARTS}
    growth = {part: late_ms - early_ms for part, (early_ms, late_ms) in per_step.items()}
    total = sum(growth.values())
    sign = 1 if total > 0 else -1
    leading = max(growth, key=lambda p: sign * growth[p])
    part = leading if total and growth[leading] / total >= PART_SHARE else "several"
    evidence = _evidence(early, late)
    gc = evidence.get("gc_ms")
    cause = ("gc" if ratio < 1 and gc is not None and total > 0 and gc[1] - gc[0] >= PART_SHARE * total
             else _cause(part, ratio, evidence))
    return RunChange("slower" if ratio < 1 else "faster", ratio, base, last, _onset(windows), part, cause, per_step,
                     evidence)


def _mean_part(windows: list[WindowFigures], part: str) -> float:
    values = [w.per_step_ms.get(part, 0.0) for w in windows if w.per_step_ms]
    return statistics.fmean(values) if values else 0.0


def _onset(windows: list[WindowFigures], values: list[float] | None = None) -> int:
    """Where a change began: the split of ``values`` (the windows' rates by default) into a level (the windows
    before) and a straight line (from there on) with the least squared error; of splits within 1% of the best, the
    earliest."""
    rates = values if values is not None else [w.steps_per_s or 0.0 for w in windows]
    errors = [_level_error(rates[:i]) + _line_error(rates[i:]) for i in range(len(rates) - 2)]
    best = min(errors)
    first = next(i for i, e in enumerate(errors) if e <= best * 1.01 + 1e-12)
    return windows[first].start_ns


def _level_error(values: list[float]) -> float:
    if not values:
        return 0.0
    mean = statistics.fmean(values)
    return sum((v - mean) ** 2 for v in values)


def _line_error(values: list[float]) -> float:
    """The squared error of the least-squares line through ``values`` (at 0, 1, 2...)."""
    n = len(values)
    if n < 3:
        return 0.0
    xs = range(n)
    mx, my = (n - 1) / 2, statistics.fmean(values)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (v - my) for x, v in zip(xs, values)) / sxx
    return sum((v - (my + slope * (x - mx))) ** 2 for x, v in zip(xs, values))


def _mean(values: list[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _evidence(early: list[WindowFigures], late: list[WindowFigures]) -> dict[str, Any]:
    """What the machine and the input pipeline showed, early and late: (early, late) per figure that was read."""
    found: dict[str, Any] = {}
    for name, read in (("fetch_ms", lambda w: w.fetch_ms), ("gc_ms", lambda w: w.gc_ms),
                       ("rss_bytes", lambda w: w.rss_bytes),
                       ("workers_rss_bytes", lambda w: w.workers_rss_bytes),
                       ("disk_read_bytes_per_s", lambda w: w.disk_read_bytes_per_s),
                       ("iowait_percent", lambda w: w.iowait_percent),
                       ("batch_bytes", lambda w: w.batch_bytes), ("cpu_mhz", lambda w: w.cpu_mhz),
                       ("gpu_mhz", lambda w: w.gpu_mhz)):
        a, b = _mean([read(w) for w in early]), _mean([read(w) for w in late])
        if a is not None and b is not None:
            found[name] = (round(a, 3), round(b, 3))
    return found


def _grew(pair: tuple[float, float] | None, factor: float, floor: float) -> bool:
    return pair is not None and pair[1] >= factor * pair[0] and pair[1] - pair[0] >= floor


def _fell(pair: tuple[float, float] | None) -> bool:
    return pair is not None and pair[0] > 0 and pair[1] <= (1 - CLOCK_FALL) * pair[0]


def _cause(part: str, ratio: float, evidence: dict[str, Any]) -> str:
    if ratio > 1:
        return "unknown"  # a run that sped up: said with its part, no cause sought
    batches = evidence.get("batch_bytes")
    bigger = batches is not None and batches[1] >= BATCH_GROWTH * max(batches[0], 1.0)
    if part == "data_wait":
        disk = evidence.get("disk_read_bytes_per_s")
        if disk is not None and disk[1] >= DISK_READ_FLOOR and disk[1] >= DISK_READ_RISE * max(disk[0], 1.0):
            return "page-cache"
        return "data-growing" if bigger else "input"
    if part in ("forward", "backward"):
        if bigger:
            return "data-growing"
        return "clocks" if _fell(evidence.get("gpu_mhz")) or _fell(evidence.get("cpu_mhz")) else "compute"
    if part in ("step_code", "optimizer", "several"):
        if _grew(evidence.get("rss_bytes"), MEMORY_GROWTH, MEMORY_GROWTH_FLOOR):
            return "memory-growth"
        return "step-code" if part == "step_code" else "unknown"
    return "unknown"


def _memory(windows: list[WindowFigures]) -> list[MemoryGrowth]:
    """Memory that kept growing, late windows against early ones: the training process's resident memory, and the
    DataLoader workers' (summed; each its private memory where read, so pages copied on read count and the pages
    still shared with the training process do not)."""
    if len(windows) < MIN_WINDOWS:
        return []
    found = []
    for who, read in (("training", lambda w: w.rss_bytes), ("workers", lambda w: w.workers_rss_bytes)):
        measured = [w for w in windows if read(w) is not None]
        if len(measured) < MIN_WINDOWS:
            continue
        early, late = _quarters(measured)
        a, b = _mean([read(w) for w in early]), _mean([read(w) for w in late])
        if a is not None and b is not None and _grew((a, b), MEMORY_GROWTH, MEMORY_GROWTH_FLOOR):
            found.append(MemoryGrowth(who, int(a), int(b), _onset(measured, [float(read(w) or 0) for w in measured])))
    return found


def _gc_pauses(windows: list[WindowFigures]) -> GcPauses | None:
    """Longest collections that grew (a leak of Python objects): the last half's longest against the first
    quarter's. Maxima, since a window without a full collection has only short ones; the last half, since full
    collections come less often as the heap grows (Python's threshold is a share of it): a last quarter may hold
    only one."""
    timed = [w for w in windows if w.gc_longest_ms is not None]
    if len(timed) < MIN_WINDOWS:
        return None
    early, _ = _quarters(timed)
    a = max(w.gc_longest_ms or 0.0 for w in early)
    b = max(w.gc_longest_ms or 0.0 for w in timed[len(timed) // 2:])
    if b < GC_PAUSE_FLOOR_MS or b < GC_PAUSE_GROWTH * max(a, 1e-3):
        return None
    return GcPauses(a, b, _onset(timed, [w.gc_longest_ms or 0.0 for w in timed]))
