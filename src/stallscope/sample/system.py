"""System and process-tree sampling from the launcher, about ten times a second.

Read per tick: CPU time and RSS of every process of the job (the script, its DataLoader workers,
their children), bytes they read, system-wide per-core busy %, iowait %, disk read bytes/s,
/dev/shm use, and NVML readings when a GPU is present. The process list is refreshed once a
second, not every tick, which keeps the sampler itself well under 1% of a core.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil

from stallscope.sample.gpu import GpuProbe

SAMPLES_SCHEMA = "stallscope.samples/1"
#: Disk counters cost more to read than everything else together; every 5th tick is enough for a rate.
DISK_EVERY_TICKS = 5
#: Unique set size (private pages) needs /proc/PID/smaps_rollup: read it once a second. It is what grows
#: when a worker's copy-on-write pages get copied (reading Python objects touches their refcounts).
USS_EVERY_TICKS = 30
#: Bytes read per process (for the dataset-size estimate) change slowly; once a second is plenty.
IO_EVERY_TICKS = 10
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class SystemSampler:
    def __init__(self, root_pid: int, interval_s: float = 0.1, nvml: Any | None = None,
                 gpu: bool = True, shm_path: str = "/dev/shm") -> None:
        self.root_pid = root_pid
        self.interval_s = interval_s
        self.shm_path = shm_path
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu = GpuProbe(nvml) if gpu else None
        self.t_ns: list[int] = []
        self.system: dict[str, list[Any]] = {"cpu_percent": [], "per_core_percent": [], "iowait_percent": [],
                                             "disk_read_bytes_per_s": [], "shm_used_bytes": []}
        self.processes: dict[str, dict[str, Any]] = {}
        self.gpu_series: dict[str, list[Any]] = {}
        self.absent: dict[str, str] = {}
        self._cost_cpu_s = 0.0
        self._wall_s = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="stallscope-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._gpu is not None:
            self._gpu.close()
        return self.result()

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
            "t_ns": self.t_ns,
            "system": self.system,
            "processes": self.processes,
            "gpu": gpu,
            "absent": self.absent,
            "cost": {"cpu_s": round(self._cost_cpu_s, 6), "wall_s": round(self._wall_s, 6),
                     "core_fraction": round(self._cost_cpu_s / self._wall_s, 6) if self._wall_s > 0 else None},
        }

    # -- the loop -----------------------------------------------------------------------------------------

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        wall0 = time.perf_counter()
        tree: list[psutil.Process] = []
        refreshed = 0.0
        last_cpu = psutil.cpu_times(percpu=True)
        last_disk = _disk_read_bytes()
        last_t = time.perf_counter()
        try:
            while not self._stop.wait(self.interval_s):
                now = time.perf_counter()
                if now - refreshed > 1.0:
                    tree = self._process_tree()
                    refreshed = now
                self.t_ns.append(time.perf_counter_ns())
                tick = len(self.t_ns) - 1
                cpu = psutil.cpu_times(percpu=True)
                self._system_tick(last_cpu, cpu)
                last_cpu = cpu
                if tick % DISK_EVERY_TICKS == 0:
                    disk = _disk_read_bytes()
                    dt = now - last_t
                    last_t = now
                    self.system["disk_read_bytes_per_s"].append(
                        (disk - last_disk) / dt if disk is not None and last_disk is not None and dt > 0 else None)
                    last_disk = disk
                else:
                    self.system["disk_read_bytes_per_s"].append(None)
                self.system["shm_used_bytes"].append(_shm_used(self.shm_path))
                for proc in tree:
                    self._process_tick(proc, tick, with_uss=tick % USS_EVERY_TICKS == 0,
                                       with_io=tick % IO_EVERY_TICKS == 0)
                if self._gpu is not None and self._gpu.handles:
                    for key, values in self._gpu.read().items():
                        self.gpu_series.setdefault(key, []).append(values)
        finally:
            self._cost_cpu_s = time.thread_time() - cpu0
            self._wall_s = time.perf_counter() - wall0

    def _process_tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.root_pid)
            return [root, *root.children(recursive=True)]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return []

    def _system_tick(self, before: list[Any], after: list[Any]) -> None:
        per_core: list[float] = []
        busy_total = all_total = iowait = 0.0
        for b, a in zip(before, after):
            total = sum(a) - sum(b)
            idle = (a.idle - b.idle) + (getattr(a, "iowait", 0.0) - getattr(b, "iowait", 0.0))
            per_core.append(round(100.0 * (total - idle) / total, 1) if total > 0 else 0.0)
            busy_total += total - idle
            all_total += total
            iowait += getattr(a, "iowait", 0.0) - getattr(b, "iowait", 0.0)
        self.system["per_core_percent"].append(per_core)
        self.system["cpu_percent"].append(round(100.0 * busy_total / all_total, 1) if all_total > 0 else None)
        if hasattr(after[0], "iowait"):
            self.system["iowait_percent"].append(round(100.0 * iowait / all_total, 2) if all_total > 0 else None)
        else:
            self.absent["iowait"] = "this platform does not report iowait"
            self.system["iowait_percent"].append(None)

    def _process_tick(self, proc: psutil.Process, tick: int, with_uss: bool, with_io: bool) -> None:
        """CPU and RSS every tick from one read of /proc/PID/stat; bytes read and USS less often."""
        key = str(proc.pid)
        uss = read_chars = None
        try:
            cpu_rss = _proc_stat(proc.pid)
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
                try:
                    uss = proc.memory_full_info().uss
                except (psutil.AccessDenied, AttributeError, NotImplementedError):
                    uss = None
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return
        entry = self.processes.get(key)
        if entry is None:
            entry = self.processes[key] = {"first": tick, "ppid": _ppid(proc), "name": _name(proc),
                                           "ticks": [], "cpu_s": [], "rss_bytes": [], "read_bytes": [],
                                           "uss_ticks": [], "uss_bytes": []}
        entry["ticks"].append(tick)
        entry["cpu_s"].append(round(cpu_rss[0], 4))
        entry["rss_bytes"].append(cpu_rss[1])
        entry["read_bytes"].append(read_chars)
        if uss is not None:
            entry["uss_ticks"].append(tick)
            entry["uss_bytes"].append(uss)


def _proc_stat(pid: int) -> tuple[float, int] | None:
    """(user+system CPU seconds, RSS bytes) from /proc/PID/stat, or None where that file is not there."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise psutil.NoSuchProcess(pid) from None
        return None
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    # After the command name: state is field 3 of proc(5); utime 14, stime 15, rss 24 (1-based).
    utime, stime, rss_pages = int(fields[11]), int(fields[12]), int(fields[21])
    return (utime + stime) / _CLOCK_TICKS, rss_pages * _PAGE_SIZE


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


def _disk_read_bytes() -> int | None:
    try:
        counters = psutil.disk_io_counters()
    except Exception:
        return None
    return counters.read_bytes if counters is not None else None


def _shm_used(path: str) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize
