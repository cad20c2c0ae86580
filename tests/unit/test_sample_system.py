"""The launcher-side sampler on a real child process, and NVML readings through a fake NVML."""

from __future__ import annotations

import subprocess
import sys
import time

from stallscope.sample.gpu import GpuProbe
from stallscope.sample.system import SAMPLES_SCHEMA, SystemSampler


def test_samples_a_busy_child_and_its_own_cost():
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nend=time.time()+1.2\nx=0\nwhile time.time()<end: x+=1\n"])
    sampler = SystemSampler(child.pid, interval_s=0.05, gpu=False)
    sampler.start()
    child.wait()
    time.sleep(0.1)
    result = sampler.stop()
    assert result["schema"] == SAMPLES_SCHEMA
    assert len(result["t_ns"]) >= 5
    entry = result["processes"][str(child.pid)]
    assert entry["cpu_s"][-1] > entry["cpu_s"][0]
    assert all(r > 0 for r in entry["rss_bytes"])
    assert len(result["system"]["cpu_percent"]) == len(result["t_ns"])
    assert result["absent"]["gpu"] == "GPU sampling disabled"
    assert result["gpu"] is None
    assert 0 <= result["cost"]["core_fraction"] < 1


class FakeNvml:
    NVML_PCIE_UTIL_RX_BYTES, NVML_PCIE_UTIL_TX_BYTES, NVML_CLOCK_SM = 0, 1, 2

    class Util:
        gpu = 37

    class Mem:
        used = 5 << 30

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, handle):
        return b"Fake H200"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self.Util()

    def nvmlDeviceGetMemoryInfo(self, handle):
        if handle == 1:
            raise RuntimeError("not supported")
        return self.Mem()

    def nvmlDeviceGetPcieThroughput(self, handle, counter):
        return 1000 if counter == self.NVML_PCIE_UTIL_RX_BYTES else 10

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1980


def test_gpu_probe_reads_every_device_and_keeps_unreadable_values_absent():
    probe = GpuProbe(FakeNvml())
    assert probe.absent is None and probe.names == ["Fake H200", "Fake H200"]
    reading = probe.read()
    assert reading["util_percent"] == [37.0, 37.0]
    assert reading["mem_used_bytes"] == [float(5 << 30), None]
    assert reading["pcie_rx_bytes_per_s"] == [1024000.0, 1024000.0]
    assert reading["sm_clock_mhz"] == [1980.0, 1980.0]
    between = probe.read(with_pcie=False)  # the slow PCIe query is skipped on most ticks: absent, not zero
    assert between["pcie_rx_bytes_per_s"] == [None, None] and between["util_percent"] == [37.0, 37.0]


def test_gpu_probe_without_nvml_says_why():
    class Broken(FakeNvml):
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    probe = GpuProbe(Broken())
    assert probe.handles == [] and "NVML unavailable" in probe.absent


def test_torchrun_ranks_are_told_from_their_workers():
    """A process started with LOCAL_RANK by a parent without it is a rank (no USS reads); its own child,
    which inherits the variable, is not; nor is a process without it."""
    import os

    from stallscope.sample.system import _is_rank

    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3)'])\n"
            "print(child.pid, flush=True)\n"
            "child.wait()\n")
    rank = subprocess.Popen([sys.executable, "-c", code], env={**env, "LOCAL_RANK": "0"},
                            stdout=subprocess.PIPE, text=True)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], env=env)
    try:
        worker = int(rank.stdout.readline())
        assert _is_rank(rank.pid, os.getpid())
        assert not _is_rank(worker, rank.pid)
        assert not _is_rank(plain.pid, os.getpid())
    finally:
        for proc in (rank, plain):
            proc.kill()
            proc.wait()


class _OneStatFile:
    """Serves one /proc/PID/stat line, as the sampler's descriptor cache would read it."""

    def __init__(self, line: str) -> None:
        self.line = line.encode()

    def read(self, path: str) -> bytes:
        return self.line


def _stat_line(state: str, flags: int, rss_pages: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice threads itrealvalue starttime vsize rss ...
    return (f"42 (py (x) thon) {state} 1 42 42 0 -1 {flags} 10 0 0 0 150 50 0 0 20 0 1 0 99 "
            f"3133440 {rss_pages} 18446744073709551615 0 0")


def test_proc_stat_reads_cpu_and_rss_and_treats_an_exiting_process_as_gone():
    import psutil
    import pytest

    from stallscope.sample import system

    cpu_s, rss = system._proc_stat(42, _OneStatFile(_stat_line("R", 0x400000, 388)))
    assert cpu_s == 200 / system._CLOCK_TICKS
    assert rss == 388 * system._PAGE_SIZE
    # Exiting before it turns zombie: the flag is set, or the memory map is already gone (RSS 0).
    for line in (_stat_line("R", 0x400004, 388), _stat_line("D", 0x400000, 0), _stat_line("Z", 0, 0)):
        with pytest.raises(psutil.NoSuchProcess):
            system._proc_stat(42, _OneStatFile(line))


def test_a_long_run_keeps_at_most_max_ticks_spread_over_it(monkeypatch):
    """Past MAX_TICKS every other tick goes and the interval doubles: the samples stay bounded, still read the same
    way (every series one value per tick, a process's values at its own ticks, cumulative CPU never decreasing)."""
    from stallscope.sample import system
    from stallscope.system_samples import SystemSamples

    monkeypatch.setattr(system, "MAX_TICKS", 16)
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nend=time.time()+2.0\nx=0\nwhile time.time()<end: x+=1\n"])
    sampler = SystemSampler(child.pid, interval_s=0.02, gpu=False)
    sampler.start()
    child.wait()
    result = sampler.stop()
    assert 8 <= len(result["t_ns"]) < 16 and result["interval_s"] >= 0.04
    assert all(len(values) == len(result["t_ns"]) for values in result["system"].values())
    assert result["t_ns"] == sorted(result["t_ns"])
    entry = result["processes"][str(child.pid)]
    assert len(entry["ticks"]) == len(entry["cpu_s"]) and max(entry["ticks"]) < len(result["t_ns"])
    assert entry["cpu_s"] == sorted(entry["cpu_s"]) and entry["cpu_s"][-1] > 0.2  # 2 s busy, on a loaded machine
    assert SystemSamples.read(result).processes  # the reader takes it as any other run's


def test_a_snapshot_taken_while_it_samples_reads_back_whole():
    """The launcher saves ``snapshot()`` as the job runs (a killed launcher leaves it to ``report``): taken between
    ticks, each one is whole JSON with every series one value per tick, however often it is taken."""
    import json

    from stallscope.system_samples import SystemSamples

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    sampler = SystemSampler(child.pid, interval_s=0.005, gpu=False)
    sampler.start()
    taken = []
    while child.poll() is None:
        taken.append(json.loads(sampler.snapshot()))
    sampler.stop()
    assert len(taken) > 10 and taken[-1]["t_ns"]
    for snap in taken:
        assert all(len(values) == len(snap["t_ns"]) for values in snap["system"].values())
    assert SystemSamples.read(taken[-1]).processes


def test_readings_not_taken_read_back_as_none_and_each_tick_is_held_in_few_bytes():
    """The launcher holds up to MAX_TICKS ticks: each reading in 8 bytes, not a Python object; what was not read on
    a tick (disk rate between its reads, bytes read between a process's I/O reads) reads back as None, not 0."""
    import tracemalloc

    from stallscope.sample import system

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    sampler = SystemSampler(child.pid, interval_s=0.01, gpu=False)
    sampler.start()
    child.wait()
    result = sampler.stop()
    disk = result["system"]["disk_read_bytes_per_s"]
    assert disk[0] is None or isinstance(disk[0], float)
    assert None in disk[1:system.DISK_EVERY_TICKS]  # read every DISK_EVERY_TICKS ticks only
    entry = result["processes"][str(child.pid)]
    assert None in entry["read_bytes"] and all(isinstance(v, int) for v in entry["rss_bytes"])
    assert all(isinstance(v, float) for v in result["system"]["per_core_percent"][0])

    tracemalloc.start()
    held = SystemSampler(child.pid, gpu=False)
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(1000):  # a tick's readings, as _tick appends them, on a 64-core machine
        held.t_ns.append(time.perf_counter_ns())
        held._system_tick([(1, 2, 3, 4, 5)] * 64, [(2, 4, 6, 8, 10)] * 64)
        for name in ("disk_read_bytes_per_s", "shm_used_bytes", "cpu_mhz"):
            system._put(held.system[name], None)
    per_tick = (tracemalloc.get_traced_memory()[0] - before) / 1000
    tracemalloc.stop()
    assert per_tick < 64 * 8 + 200, per_tick  # as lists of floats: about 64 * 32 + 300
