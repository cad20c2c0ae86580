"""Other programs keeping the CPUs busy: the load a shared machine or a CI runner puts beside a job.

``with CpuLoad() as load:`` starts one spinning process per CPU this process may use (``stress -c N``), and stops
and reaps them however the block ends. A test asserts that its "busy" machine was busy rather than trusting it:
``load.idle_fraction()`` is the share of those CPUs' time that was idle while the load ran (from /proc/stat; near 0
when the spinners kept them busy, whatever else ran), ``load.cpu_seconds()`` the CPU time the spinners took (psutil).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

#: A process that only burns CPU: no memory, no I/O, no output.
SPIN = "while True:\n    pass\n"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity), which is what a job here competes for."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_ticks() -> tuple[int, int]:
    """All and idle (idle + iowait) clock ticks so far of the CPUs this process may use, from /proc/stat."""
    cpus = {f"cpu{n}" for n in os.sched_getaffinity(0)}
    total = idle = 0
    with open("/proc/stat") as stat:
        for line in stat:
            name, *values = line.split()
            if name in cpus:
                ticks = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
                total += sum(ticks)
                idle += ticks[3] + ticks[4]
    return total, idle


class CpuLoad:
    """``processes`` spinning processes (default: one per usable CPU), for the length of a ``with`` block."""

    def __init__(self, processes: int | None = None) -> None:
        self.processes = processes if processes is not None else usable_cpus()
        self._spinners: list[subprocess.Popen] = []
        self._cpu_s: dict[int, float] = {}
        self._started = self._stopped = 0.0
        self._ticks_at_start: tuple[int, int] | None = None
        self._ticks_at_stop: tuple[int, int] | None = None
        #: every spinner was still running when the load was stopped (none died on the way)
        self.ran_throughout = False

    def __enter__(self) -> CpuLoad:
        self._started = time.monotonic()
        self._ticks_at_start = cpu_ticks()
        try:
            for _ in range(self.processes):
                self._spinners.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL,
                                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def cpu_seconds(self) -> float:
        """The CPU time the spinners have taken so far (their last reading, once stopped)."""
        for spinner in self._spinners:
            try:
                times = psutil.Process(spinner.pid).cpu_times()
                self._cpu_s[spinner.pid] = times.user + times.system
            except psutil.Error:  # gone: keep its last reading
                pass
        return sum(self._cpu_s.values())

    def busy_cpus(self) -> float:
        """The CPUs the spinners kept busy on average while they ran: CPU seconds over wall seconds."""
        cpu = self.cpu_seconds()
        wall = (self._stopped or time.monotonic()) - self._started
        return cpu / wall if wall > 0 else 0.0

    def idle_fraction(self) -> float:
        """The share of the usable CPUs' time (idle and waiting for I/O) that no process used while the load ran."""
        start, end = self._ticks_at_start, self._ticks_at_stop or cpu_ticks()
        if start is None:
            raise RuntimeError("the load was not started")
        total = end[0] - start[0]
        return (end[1] - start[1]) / total if total > 0 else 1.0

    def stop(self) -> None:
        """Read the spinners' CPU time one last time, then end and reap each (kill if a terminate is ignored)."""
        if self._stopped:
            return
        self.cpu_seconds()
        self._stopped = time.monotonic()
        self._ticks_at_stop = cpu_ticks()
        self.ran_throughout = bool(self._spinners) and all(s.poll() is None for s in self._spinners)
        for spinner in self._spinners:
            spinner.terminate()
        for spinner in self._spinners:
            try:
                spinner.wait(timeout=10)
            except subprocess.TimeoutExpired:
                spinner.kill()
                spinner.wait()
