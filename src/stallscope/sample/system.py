"""System and process-tree sampling from the launcher, about ten times a second.

Read per tick: CPU time and RSS of every process of the job (the script, its DataLoader workers,
their children), bytes they read, system-wide per-core busy %, iowait %, disk read bytes/s,
/dev/shm use, and NVML readings when a GPU is present. The process list is refreshed once a
second, not every tick, which keeps the sampler itself well under 1% of a core. The CPU and RSS of
the servers on this machine that the job's connections reach (``local_servers``) are read too, apart.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from array import array
from collections.abc import Iterable
from typing import Any

import psutil

from stallscope.background import start_thread
from stallscope.sample.gpu import GpuProbe
from stallscope.sample.local_servers import LocalServerFinder
from stallscope.system_samples import TREE_REFRESH_S

SAMPLES_SCHEMA = "stallscope.samples/1"
#: NVML's PCIe throughput query samples for ~20 ms itself: once a second is plenty.
PCIE_EVERY_TICKS = 10
#: Disk counters cost more to read than everything else together; every 5th tick is enough for a rate.
DISK_EVERY_TICKS = 5
#: Unique set size (private pages) needs /proc/PID/smaps_rollup, which walks every mapping: ~7 ms for a
#: process that loaded torch. It is what grows when a worker's copy-on-write pages get copied (reading
#: Python objects touches their refcounts), so it is read for workers only, at most every USS_MIN_PERIOD_S
#: and less often when a read is slow, so that all USS reads together stay within USS_CORE_BUDGET of one
#: core (with eight workers each is read an eighth as often as with one).
USS_MIN_PERIOD_S = 2.0
USS_CORE_BUDGET = 0.002
#: Bytes read per process (for the dataset-size estimate) change slowly; once a second is plenty.
IO_EVERY_TICKS = 10
#: The CPUs' clock (mean MHz over them) is read once every this many ticks: a clock that falls over a long run
#: (thermal or power limits) slows everything on the CPU.
CLOCK_EVERY_TICKS = 10
CLOCK_MAX_READ_S = 0.005
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PF_EXITING = 0x4  # task flag in /proc/PID/stat: the process has begun exiting (linux/sched.h)


#: Seconds the local servers of the job's connections are read once the job has ended: their CPU with no requests,
#: which stays a fixed load rather than a cost of each request (calibration: sampler-local-servers).
SERVER_IDLE_S = 1.0
#: Ticks kept at most (20 minutes at the default 10 Hz): beyond, every other one is dropped and the interval doubles
#: (``SystemSampler.thin``), so the launcher's memory and the session stay bounded however long the run.
MAX_TICKS = 12_000
#: Integers a series holds for "not read" (bytes, ticks and times are never negative).
_NO_INT = -1
_INT_SERIES = frozenset({"shm_used_bytes", "ticks", "rss_bytes", "read_bytes", "uss_ticks", "uss_bytes"})


def _series(name: str) -> array:
    """A series of readings in 8 bytes each, None kept as NaN (or ``_NO_INT``): the launcher holds up to MAX_TICKS of
    them per reading and process, which as Python objects came to tens of megabytes on a many-core machine."""
    return array("q") if name in _INT_SERIES else array("d")


def _put(series: array, value: float | None) -> None:
    if series.typecode == "q":
        series.append(_NO_INT if value is None else int(value))
    else:
        series.append(math.nan if value is None else value)


def _listed(series: array | list[Any]) -> list[Any]:
    """The series as JSON takes it: None where nothing was read."""
    if isinstance(series, list):
        return [list(v) if isinstance(v, array) else v for v in series]
    if series.typecode == "q":
        return [None if v == _NO_INT else v for v in series]
    return [None if v != v else v for v in series]


class SystemSampler:
    def __init__(self, root_pid: int, interval_s: float = 0.1, nvml: Any | None = None,
                 gpu: bool = True, shm_path: str = "/dev/shm") -> None:
        self.root_pid = root_pid
        self.interval_s = interval_s
        self.shm_path = shm_path
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu = GpuProbe(nvml) if gpu else None
        self._files = _ProcFiles()  # this sampler's open /proc descriptors
        self.t_ns = array("q")
        self.system: dict[str, Any] = {name: _series(name) for name in (
            "cpu_percent", "iowait_percent", "disk_read_bytes_per_s", "shm_used_bytes", "cpu_mhz")}
        self.system["per_core_percent"] = []  # an array of the cores' readings a tick
        self.processes: dict[str, dict[str, Any]] = {}
        # the local servers of the job's connections (``local_servers``), read as its processes are, with their port
        self.servers: dict[str, dict[str, Any]] = {}
        self._server_finder = LocalServerFinder()
        self.gpu_series: dict[str, list[Any]] = {}
        self.absent: dict[str, str] = {}
        self._cost_cpu_s = 0.0
        self._wall_s = 0.0
        self._last_uss_cost: float | None = None
        self._training: dict[int, bool] = {}  # pid -> a training process (no USS reads), decided once
        self._read_clock = True  # until a read fails or costs more than CLOCK_MAX_READ_S
        self._tick_lock = threading.Lock()  # a tick's writes against a snapshot's read (``snapshot``)

    def start(self) -> None:
        self._thread = start_thread(self._loop, "stallscope-sampler")

    def stop(self, idle_s: float = SERVER_IDLE_S) -> dict[str, Any]:
        """The samples, once the sampling has stopped: with the local servers' own CPU over ``idle_s`` more seconds
        (the job has ended, so this is what they burn with no requests: a store's heartbeats, timers, compactions)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._gpu is not None:
            self._gpu.close()
        if self.servers and idle_s > 0:
            self._read_idle_servers(idle_s)
        return self.result()

    def _read_idle_servers(self, idle_s: float) -> None:
        def cpu_now() -> dict[str, float]:
            readings = {}
            for key in self.servers:
                try:
                    process = psutil.Process(int(key))
                    times = process.cpu_times()
                except (psutil.Error, OSError, ValueError):
                    continue
                readings[key] = times.user + times.system
            return readings

        began, before = time.perf_counter(), cpu_now()
        time.sleep(idle_s)
        after, elapsed = cpu_now(), time.perf_counter() - began
        for key, cpu in after.items():
            if key in before and elapsed > 0:
                self.servers[key]["idle_cores"] = round(max(0.0, cpu - before[key]) / elapsed, 4)

    def result(self) -> dict[str, Any]:
        gpu = None
        if self._gpu is not None and self._gpu.handles:
            gpu = {"names": self._gpu.names, **self.gpu_series}
        elif self._gpu is not None:
            self.absent["gpu"] = self._gpu.absent or "no GPU"
        else:
            self.absent["gpu"] = "GPU sampling disabled"
        return {
            "schema": SAMPLES_SCHEMA,
            "interval_s": self.interval_s,
            "t_ns": self.t_ns.tolist(),
            "system": {name: _listed(values) for name, values in self.system.items()},
            "processes": {pid: {name: _listed(v) if isinstance(v, array) else v for name, v in entry.items()}
                          for pid, entry in self.processes.items()},
            "servers": {pid: {name: _listed(v) if isinstance(v, array) else v for name, v in entry.items()}
                        for pid, entry in self.servers.items()},
            "gpu": gpu,
            "absent": self.absent,
            "cost": {"cpu_s": round(self._cost_cpu_s, 6), "wall_s": round(self._wall_s, 6),
                     "core_fraction": round(self._cost_cpu_s / self._wall_s, 6) if self._wall_s > 0 else None},
        }

    def snapshot(self) -> str:
        """The samples so far as JSON, read between two ticks: saved beside the raw events while the job runs, so
        a launcher killed mid-run leaves them to ``report`` (a run of days loses minutes of them, not all)."""
        with self._tick_lock:
            return json.dumps(self.result(), separators=(",", ":"))

    # -- the loop -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        wall0 = time.perf_counter()
        tree: list[psutil.Process] = []
        servers: dict[int, psutil.Process] = {}
        uss_due: dict[int, float] = {}
        refreshed = 0.0
        last_cpu = _per_cpu_times(self._files)
        last_disk = _disk_read_bytes()
        last_t = time.perf_counter()
        try:
            next_tick = time.perf_counter() + self.interval_s
            while not self._stop.is_set():
                # A plain sleep to a fixed schedule: one system call, where Event.wait takes a lock
                # round-trip each time; stop() is seen within one interval.
                delay = next_tick - time.perf_counter()
                while delay > 0 and not self._stop.is_set():
                    time.sleep(min(delay, 0.25))
                    delay = next_tick - time.perf_counter()
                if self._stop.is_set():
                    break
                now = time.perf_counter()
                next_tick = max(next_tick + self.interval_s, now + 0.2 * self.interval_s)
                if now - refreshed > TREE_REFRESH_S:
                    tree = self._process_tree()
                    servers = self._local_servers(tree, servers)
                    refreshed = now
                with self._tick_lock:
                    last_cpu, last_disk, last_t = self._tick(tree, uss_due, now, last_cpu, last_disk, last_t,
                                                             servers.values())
        finally:
            self._files.close()
            self._cost_cpu_s = time.thread_time() - cpu0
            self._wall_s = time.perf_counter() - wall0

    def _tick(self, tree: list[psutil.Process], uss_due: dict[int, float], now: float,
              last_cpu: list[tuple[int, ...]], last_disk: int | None, last_t: float,
              servers: Iterable[psutil.Process] = ()) -> tuple[list[tuple[int, ...]], int | None, float]:
        """One tick's readings appended; the previous readings the next tick's rates start from."""
        self.t_ns.append(time.perf_counter_ns())
        tick = len(self.t_ns) - 1
        cpu = _per_cpu_times(self._files)
        self._system_tick(last_cpu, cpu)
        last_cpu = cpu
        if tick % DISK_EVERY_TICKS == 0:
            disk = _disk_read_bytes()
            dt = now - last_t
            last_t = now
            _put(self.system["disk_read_bytes_per_s"],
                 (disk - last_disk) / dt if disk is not None and last_disk is not None and dt > 0 else None)
            last_disk = disk
        else:
            _put(self.system["disk_read_bytes_per_s"], None)
        _put(self.system["shm_used_bytes"], _shm_used(self.shm_path))
        clock = None
        if tick % CLOCK_EVERY_TICKS == 0 and self._read_clock:
            began = time.perf_counter()
            clock = _cpu_mhz(self._files)
            # a kernel that asks every CPU for its clock on each read (large x86 machines): not worth its cost (the
            # first read also finds the files)
            self._read_clock = clock is not None and (tick == 0 or time.perf_counter() - began < CLOCK_MAX_READ_S)
        _put(self.system["cpu_mhz"], clock)
        for proc in tree:
            self._process_tick(proc, tick, with_uss=self._may_read_uss(proc) and now >= uss_due.setdefault(
                proc.pid, now + USS_MIN_PERIOD_S), with_io=tick % IO_EVERY_TICKS == 0)
            if self._last_uss_cost is not None:
                uss_due[proc.pid] = now + max(USS_MIN_PERIOD_S,
                                              self._last_uss_cost * len(tree) / USS_CORE_BUDGET)
                self._last_uss_cost = None
        for proc in servers:
            self._process_tick(proc, tick, with_uss=False, with_io=False, into=self.servers)
        if self._gpu is not None and self._gpu.handles:
            for key, values in self._gpu.read(with_pcie=tick % PCIE_EVERY_TICKS == 0).items():
                self.gpu_series.setdefault(key, []).append(values)
        if len(self.t_ns) >= MAX_TICKS:
            self.thin()
        return last_cpu, last_disk, last_t

    def thin(self) -> None:
        """Every other tick dropped and the interval doubled: a run of days keeps at most ``MAX_TICKS`` ticks, spread
        evenly over it. Cumulative figures (a process's CPU seconds, bytes read) lose nothing; a per-tick rate stays
        the rate over its own interval."""
        self.t_ns[:] = self.t_ns[::2]
        for name, values in self.system.items():
            self.system[name] = values[::2]
        for name, values in self.gpu_series.items():
            self.gpu_series[name] = values[::2]
        for entry in [*self.processes.values(), *self.servers.values()]:
            kept = [i for i, tick in enumerate(entry["ticks"]) if tick % 2 == 0]
            for name in ("cpu_s", "rss_bytes", "read_bytes"):
                entry[name] = array(entry[name].typecode, (entry[name][i] for i in kept))
            entry["ticks"] = array("q", (entry["ticks"][i] // 2 for i in kept))
            entry["uss_ticks"] = array("q", (tick // 2 for tick in entry["uss_ticks"]))
            entry["first"] = entry["first"] // 2
        self.interval_s *= 2

    def _local_servers(self, tree: list[psutil.Process], known: dict[int, psutil.Process]
                       ) -> dict[int, psutil.Process]:
        """The local servers of the job's connections found so far, each a process handle the ticks read."""
        for pid in self._server_finder.update(p.pid for p in tree):
            if pid not in known:
                try:
                    known[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
        return known

    def _may_read_uss(self, proc: psutil.Process) -> bool:
        """Not for training processes: the root, and torchrun's ranks (each walk of their mappings holds
        their memory-map lock for milliseconds, and one rank held up holds up all in the next all-reduce)."""
        if proc.pid == self.root_pid:
            return False
        known = self._training.get(proc.pid)
        if known is None:
            known = self._training[proc.pid] = _is_rank(proc.pid, _ppid(proc))
        return not known

    def _process_tree(self) -> list[psutil.Process]:
        """The job's processes. Linux lists each thread's children in /proc; that reads only the tree,
        where psutil's ``children()`` reads the parent of every process on the machine."""
        known = {p.pid: p for p in getattr(self, "_tree", [])}
        pids = _tree_pids(self.root_pid)
        try:
            if pids is None:
                root = psutil.Process(self.root_pid)
                tree = [root, *root.children(recursive=True)]
            else:
                tree = []
                for pid in pids:
                    proc = known.get(pid)
                    if proc is None:
                        try:
                            proc = psutil.Process(pid)
                        except psutil.NoSuchProcess:
                            continue
                    tree.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            tree = []
        self._tree = tree
        return tree

    def _system_tick(self, before: list[tuple[int, ...]], after: list[tuple[int, ...]]) -> None:
        """Per-core busy %, total busy % and iowait % between two reads of /proc/stat (jiffies)."""
        per_core: list[float] = []
        busy_total = all_total = iowait = 0
        for b, a in zip(before, after):
            total = sum(a) - sum(b)
            idle = (a[3] - b[3]) + (a[4] - b[4])  # idle + iowait
            per_core.append(round(100.0 * (total - idle) / total, 1) if total > 0 else 0.0)
            busy_total += total - idle
            all_total += total
            iowait += a[4] - b[4]
        self.system["per_core_percent"].append(array("d", per_core))
        _put(self.system["cpu_percent"], round(100.0 * busy_total / all_total, 1) if all_total > 0 else None)
        if before and len(before[0]) > 4:
            _put(self.system["iowait_percent"], round(100.0 * iowait / all_total, 2) if all_total > 0 else None)
        else:
            self.absent["iowait"] = "this platform does not report iowait"
            _put(self.system["iowait_percent"], None)

    def _process_tick(self, proc: psutil.Process, tick: int, with_uss: bool, with_io: bool,
                      into: dict[str, dict[str, Any]] | None = None) -> None:
        """CPU and RSS every tick from one read of /proc/PID/stat; bytes read and USS less often. Into ``into``
        (the job's processes where not given)."""
        into = self.processes if into is None else into
        key = str(proc.pid)
        uss = read_chars = None
        try:
            cpu_rss = _proc_stat(proc.pid, self._files)
            if cpu_rss is None:  # not Linux, or /proc unreadable: psutil's portable path
                with proc.oneshot():
                    times = proc.cpu_times()
                    cpu_rss = (times.user + times.system, proc.memory_info().rss)
            if with_io:
                try:
                    read_chars = getattr(proc.io_counters(), "read_chars", None)
                except (psutil.AccessDenied, AttributeError, NotImplementedError):
                    read_chars = None
            if with_uss:
                started = time.thread_time()
                try:
                    uss = proc.memory_full_info().uss
                except (psutil.AccessDenied, AttributeError, NotImplementedError):
                    uss = None
                self._last_uss_cost = time.thread_time() - started
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return
        entry = into.get(key)
        if entry is None:
            series = ("ticks", "cpu_s", "rss_bytes", "read_bytes", "uss_ticks", "uss_bytes")
            entry = into[key] = {"first": tick, "ppid": _ppid(proc), "name": _name(proc),
                                 **{name: _series(name) for name in series}}
            if into is self.servers:
                entry["port"] = self._server_finder.servers.get(proc.pid)
        entry["ticks"].append(tick)
        entry["cpu_s"].append(round(cpu_rss[0], 4))
        entry["rss_bytes"].append(cpu_rss[1])
        _put(entry["read_bytes"], read_chars)
        if uss is not None:
            entry["uss_ticks"].append(tick)
            entry["uss_bytes"].append(uss)


def _proc_stat(pid: int, files: _ProcFiles) -> tuple[float, int] | None:
    """(user+system CPU seconds, RSS bytes) from /proc/PID/stat, or None where that file is not there."""
    try:
        data = files.read(f"/proc/{pid}/stat")
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise psutil.NoSuchProcess(pid) from None
        return None
    except ProcessLookupError:  # the process this descriptor was opened on has gone
        raise psutil.NoSuchProcess(pid) from None
    except OSError:
        return None
    if not data:
        raise psutil.NoSuchProcess(pid)
    fields = data[data.rfind(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):  # exited: its counters are gone, not zero
        raise psutil.NoSuchProcess(pid)
    # After the command name: state is field 3 of proc(5); flags 9, utime 14, stime 15, rss 24 (1-based).
    flags, utime, stime, rss_pages = int(fields[6]), int(fields[11]), int(fields[12]), int(fields[21])
    if flags & _PF_EXITING or rss_pages == 0:
        # Exiting but not yet a zombie (the kernel has already dropped its memory map, so RSS reads 0),
        # or caught with no map at all: a running user process always maps pages. Skip the reading
        # rather than record a false zero.
        raise psutil.NoSuchProcess(pid)
    return (utime + stime) / _CLOCK_TICKS, rss_pages * _PAGE_SIZE


def _is_rank(pid: int, ppid: int | None) -> bool:
    """A torchrun rank: started with ``LOCAL_RANK`` in its environment by a parent without it (a rank's
    forked DataLoader workers inherit the variable from the rank, so they are not ranks)."""

    def has_local_rank(p: int | None) -> bool:
        if p is None:
            return False
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                return b"\0LOCAL_RANK=" in b"\0" + f.read()
        except OSError:
            return False

    return has_local_rank(pid) and not has_local_rank(ppid)


def _ppid(proc: psutil.Process) -> int | None:
    try:
        return proc.ppid()
    except psutil.Error:
        return None


def _name(proc: psutil.Process) -> str | None:
    try:
        return proc.name()
    except psutil.Error:
        return None


class _ProcFiles:
    """/proc files kept open and re-read with ``pread`` at offset 0, which regenerates their content.

    Ten reads a second of a handful of files is all the sampler does; opening and closing each
    file every time doubled the system calls, which cost real CPU on sandboxed kernels (gVisor).
    A descriptor of /proc/PID/stat stays bound to the process it was opened on: once that exits,
    reads fail with ESRCH rather than reading a new process that reused the pid.
    """

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def read(self, path: str) -> bytes:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            return os.pread(fd, 1 << 16, 0)
        except OSError:
            self.close(path)
            raise

    def close(self, path: str | None = None) -> None:
        for key in [path] if path is not None else list(self._fds):
            fd = self._fds.pop(key, None)
            if fd is not None:
                os.close(fd)


def _per_cpu_times(files: _ProcFiles) -> list[tuple[int, ...]]:
    """Jiffies per CPU (user, nice, system, idle, iowait, irq, softirq, steal) from /proc/stat.

    Read directly: psutil's equivalent builds named tuples and costs several times more, which
    matters ten times a second. Elsewhere psutil's values stand in (iowait then absent)."""
    try:
        lines = files.read("/proc/stat").split(b"\n")
    except OSError:
        return [(int(t.user * 100), 0, int(t.system * 100), int(t.idle * 100), 0)
                for t in psutil.cpu_times(percpu=True)]
    return [tuple(int(v) for v in line.split()[1:9]) for line in lines
            if line.startswith(b"cpu") and line[3:4].isdigit()]


def _tree_pids(root: int) -> list[int] | None:
    """``root`` and its descendants from /proc/PID/task/TID/children, or None where that is unavailable."""
    pids, queue = [], [root]
    while queue:
        pid = queue.pop()
        pids.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            if pid == root and not os.path.exists(f"/proc/{root}"):
                return []
            continue
        except OSError:
            return None
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    queue.extend(int(c) for c in f.read().split())
            except FileNotFoundError:
                if tid == str(pid) and not os.path.exists(f"/proc/{pid}/task/{tid}/stat"):
                    continue
                if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                    continue
                return None  # kernel without CONFIG_PROC_CHILDREN
            except OSError:
                continue
    return pids


_WHOLE_DISKS: set[str] | None = None


def _cpu_mhz(files: _ProcFiles) -> float | None:
    """The CPUs' current clock, mean MHz: cpufreq's ``scaling_cur_freq`` where the kernel has it, else the ``cpu
    MHz`` lines of /proc/cpuinfo (what a VM shows); None where neither can be read."""
    global _CPUFREQ
    if _CPUFREQ is None:
        base = "/sys/devices/system/cpu"
        try:
            _CPUFREQ = [f"{base}/{name}/cpufreq/scaling_cur_freq" for name in os.listdir(base)
                        if name[3:].isdigit() and name.startswith("cpu")
                        and os.path.exists(f"{base}/{name}/cpufreq/scaling_cur_freq")]
        except OSError:
            _CPUFREQ = []
    try:
        if _CPUFREQ:
            khz = [int(files.read(path)) for path in _CPUFREQ]
            return sum(khz) / len(khz) / 1000.0
        mhz = [float(line.split(b":")[1]) for line in files.read("/proc/cpuinfo").split(b"\n")
               if line.startswith(b"cpu MHz")]
    except (OSError, ValueError, IndexError):
        return None
    return sum(mhz) / len(mhz) if mhz else None


_CPUFREQ: list[str] | None = None


def _disk_read_bytes() -> int | None:
    """Bytes read from whole disks (not partitions) since boot, from /proc/diskstats."""
    global _WHOLE_DISKS
    try:
        if _WHOLE_DISKS is None:
            _WHOLE_DISKS = set(os.listdir("/sys/block"))
        with open("/proc/diskstats", "rb") as f:
            lines = f.read().decode().splitlines()
    except OSError:
        try:
            counters = psutil.disk_io_counters()
        except Exception:
            return None
        return counters.read_bytes if counters is not None else None
    sectors = 0
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[2] in _WHOLE_DISKS and not fields[2].startswith(("loop", "ram")):
            sectors += int(fields[5])
    return sectors * 512


def _shm_used(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize
