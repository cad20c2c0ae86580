"""Machine checks against fake /proc and /sys trees: values, thresholds, and 'unknown' for unreadable sources."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stallscope.health.host import Host, parse_cpulist, parse_mounts, mount_for
from stallscope.health.system import (
    LoaderAssumptions,
    allowed_cpus,
    check_cpus,
    check_governor,
    check_memory,
    check_nofile,
    check_numa,
    check_shm,
    machine_checks,
    physical_cores,
    usable_cpu_count,
)


def put(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def denying(*names: str):
    """An opener that raises PermissionError for the named files (tests run as root, so chmod 000 would not deny)."""

    def opener(path: Path) -> str:
        if path.name in names:
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    return opener


MEMINFO = "MemTotal:       67108864 kB\nMemFree:        1000 kB\nMemAvailable:   50331648 kB\n"
LIMITS = """Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            {soft}                 {hard}              files
"""


def machine(root: Path, cpus: str = "0-7", online: str = "0-63") -> Host:
    put(root, "/proc/self/status", f"Name:\tpython\nCpus_allowed:\tff\nCpus_allowed_list:\t{cpus}\n")
    put(root, "/sys/devices/system/cpu/online", online + "\n")
    put(root, "/proc/meminfo", MEMINFO)
    put(root, "/proc/self/limits", LIMITS.format(soft=1048576, hard=1048576))
    return Host(root, environ={})


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("") == set()
    with pytest.raises(ValueError):
        parse_cpulist("3-1")


def test_cpus_affinity_smaller_than_cpu_count_warns(tmp_path: Path) -> None:
    host = machine(tmp_path)
    check = check_cpus(host)
    assert check.status == "warn"
    assert check.data == {"usable": 8, "affinity": 8, "quota_cpus": None, "online": 64, "physical_cores": None}
    assert "sched_getaffinity" in check.fix


def smt_topology(root: Path, cores: int, threads: int, name: str = "core_cpus_list") -> None:
    """Linux's numbering on most x86 machines: CPU c and CPU c + cores are the two hardware threads of core c."""
    for core in range(cores):
        siblings = ",".join(str(core + t * cores) for t in range(threads))
        for t in range(threads):
            put(root, f"/sys/devices/system/cpu/cpu{core + t * cores}/topology/{name}", siblings + "\n")


@pytest.mark.parametrize("name", ["core_cpus_list", "thread_siblings_list"])
def test_hardware_threads_of_one_core_count_once(tmp_path: Path, name: str) -> None:
    host = machine(tmp_path, cpus="0-15", online="0-15")
    smt_topology(tmp_path, cores=8, threads=2, name=name)
    assert physical_cores(host, set(range(16))) == 8
    assert physical_cores(host, {0, 8}) == 1  # both threads of core 0
    assert physical_cores(host, {0, 1, 2, 3}) == 4  # first threads only: a core each
    check = check_cpus(host)
    assert check.data["physical_cores"] == 8
    assert "the affinity's 16 CPUs are 8 cores with 2 hardware threads each" in check.value


def test_offline_cpus_in_the_mask_are_left_out_of_the_topology(tmp_path: Path) -> None:
    host = machine(tmp_path, cpus="0-31", online="0-15")  # 32 possible CPUs, 16 online: 8 cores x 2 threads
    smt_topology(tmp_path, cores=8, threads=2)
    assert physical_cores(host, set(range(32))) == 8
    check = check_cpus(host)  # the mask as set names 32; like sched_getaffinity, only the 16 online count
    assert check.data["usable"] == check.data["affinity"] == 16 and check.data["physical_cores"] == 8
    assert "the affinity's 16 CPUs are 8 cores with 2 hardware threads each" in check.value


def test_a_topology_that_cannot_be_read_is_unknown_not_guessed(tmp_path: Path) -> None:
    host = machine(tmp_path, cpus="0-3", online="0-3")
    smt_topology(tmp_path, cores=2, threads=2)
    assert physical_cores(host, {0, 1, 2, 3}) == 2
    (tmp_path / "sys/devices/system/cpu/cpu3/topology/core_cpus_list").unlink()  # one CPU without its topology
    assert physical_cores(host, {0, 1, 2, 3}) is None
    put(tmp_path, "/sys/devices/system/cpu/cpu3/topology/core_cpus_list", "garbage\n")
    assert physical_cores(host, {0, 1, 2, 3}) is None
    put(tmp_path, "/sys/devices/system/cpu/cpu3/topology/core_cpus_list", "0\n")  # a list without the CPU itself
    assert physical_cores(host, {0, 1, 2, 3}) is None
    assert physical_cores(host, set()) is None
    assert "hardware threads" not in check_cpus(host).value


def test_cpus_quota_tightens_affinity(tmp_path: Path) -> None:
    host = machine(tmp_path, cpus="0-15", online="0-15")
    put(tmp_path, "/sys/fs/cgroup/cgroup.controllers", "cpu\n")
    put(tmp_path, "/sys/fs/cgroup/cpu.max", "350000 100000\n")
    check = check_cpus(host)
    assert check.data["usable"] == 4 and check.data["quota_cpus"] == 3.5
    assert check.status == "warn"  # 16 online vs 4 usable
    assert usable_cpu_count(host) == 4


def test_cpus_all_usable_passes(tmp_path: Path) -> None:
    check = check_cpus(machine(tmp_path, cpus="0-7", online="0-7"))
    assert check.status == "pass" and check.value.startswith("8 usable")


def test_cpus_unreadable_is_unknown(tmp_path: Path) -> None:
    machine(tmp_path)
    host = Host(tmp_path, environ={}, opener=denying("status"))
    assert allowed_cpus(host) == (None, "/proc/self/status: permission denied")
    check = check_cpus(host)
    assert check.status == "unknown" and "permission denied" in check.value


def test_cpus_missing_status_line_is_unknown(tmp_path: Path) -> None:
    put(tmp_path, "/proc/self/status", "Name:\tpython\n")
    check = check_cpus(Host(tmp_path, environ={}))
    assert check.status == "unknown" and "Cpus_allowed_list" in check.value


def test_memory_container_limit_far_below_host_warns(tmp_path: Path) -> None:
    host = machine(tmp_path)
    put(tmp_path, "/sys/fs/cgroup/cgroup.controllers", "memory\n")
    put(tmp_path, "/sys/fs/cgroup/memory.max", str(16 << 30) + "\n")
    check = check_memory(host)
    assert check.status == "warn"
    assert check.data["total_bytes"] == 64 << 30 and check.data["effective_bytes"] == 16 << 30
    assert "16 GiB" in check.value


def test_memory_pass_and_unknown(tmp_path: Path) -> None:
    host = machine(tmp_path)
    assert check_memory(host).status == "pass"
    assert check_memory(Host(tmp_path, environ={}, opener=denying("meminfo"))).status == "unknown"
    put(tmp_path, "/proc/meminfo", "Bogus: 1 kB\n")
    assert "MemTotal" in check_memory(host).value


def statvfs_of(size: int, free: int):
    result = os.statvfs_result((4096, 4096, size // 4096, free // 4096, free // 4096, 0, 0, 0, 0, 255))
    return lambda path: result


def test_shm_docker_default_fails(tmp_path: Path) -> None:
    host = Host(machine(tmp_path).root, environ={}, statvfs=statvfs_of(64 << 20, 64 << 20))
    check = check_shm(host, LoaderAssumptions(num_workers=8), usable_cpus=8)
    assert check.status == "fail"
    assert check.data["in_flight_bytes"] == 8 * 2 * 256 * 3 * 224 * 224 * 4
    assert "--shm-size" in check.fix


def test_shm_sizes(tmp_path: Path) -> None:
    loader = LoaderAssumptions(num_workers=2, batch_size=32, sample_bytes=1 << 20)  # 128 MiB in flight
    ok = Host(tmp_path, environ={}, statvfs=statvfs_of(1 << 30, 1 << 30))
    tight = Host(tmp_path, environ={}, statvfs=statvfs_of(1 << 30, 200 << 20))
    assert check_shm(ok, loader, 2).status == "pass"
    assert check_shm(tight, loader, 2).status == "warn"


def test_shm_from_mount_options_and_unknowns(tmp_path: Path) -> None:
    put(tmp_path, "/proc/mounts", "shm /dev/shm tmpfs rw,nosuid,nodev,size=65536k 0 0\n")
    host = Host(tmp_path, environ={})
    check = check_shm(host, LoaderAssumptions(), usable_cpus=4)
    assert check.data["size_bytes"] == 64 << 20 and check.status == "fail"
    put(tmp_path, "/proc/mounts", "/dev/vda / ext4 rw 0 0\n")
    assert check_shm(host, LoaderAssumptions(), 4).status == "unknown"

    def broken(path: str) -> os.statvfs_result:
        raise PermissionError(13, "Permission denied")

    denied = Host(tmp_path, environ={}, statvfs=broken)
    check = check_shm(denied, LoaderAssumptions(), 4)
    assert check.status == "unknown" and "Permission denied" in check.value


def test_nofile(tmp_path: Path) -> None:
    host = machine(tmp_path)
    assert check_nofile(host).status == "pass"
    put(tmp_path, "/proc/self/limits", LIMITS.format(soft=1024, hard=4096))
    low = check_nofile(host)
    assert low.status == "warn" and low.data == {"soft": 1024, "hard": 4096} and "ulimit -n 4096" in low.fix
    denied = check_nofile(Host(tmp_path, environ={}, opener=denying("limits")))
    assert denied.status == "unknown" and "permission denied" in denied.value
    put(tmp_path, "/proc/self/limits", "Max open files  lots\n")
    assert check_nofile(host).status == "unknown"
    (tmp_path / "proc/self/limits").unlink()
    assert check_nofile(host).status == "unknown"


def test_governor(tmp_path: Path) -> None:
    host = machine(tmp_path, cpus="0-1")
    for cpu in range(4):
        put(tmp_path, f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", "performance\n")
    check = check_governor(host)
    assert check.status == "pass" and check.data["governors"] == {"performance": 2}  # only the allowed CPUs
    put(tmp_path, "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "powersave\n")
    assert check_governor(host).status == "warn"
    denied = Host(tmp_path, environ={}, opener=denying("scaling_governor"))
    check = check_governor(denied)
    assert check.status == "unknown" and "permission denied" in check.value


def test_governor_without_cpufreq_is_unknown(tmp_path: Path) -> None:
    host = machine(tmp_path)
    (tmp_path / "sys/devices/system/cpu/cpu0").mkdir(parents=True)
    check = check_governor(host)
    assert check.status == "unknown" and "no cpufreq" in check.value


def test_numa(tmp_path: Path) -> None:
    host = machine(tmp_path, cpus="0-3")
    assert check_numa(host).status == "unknown"
    put(tmp_path, "/sys/devices/system/node/node0/cpulist", "0-7\n")
    assert check_numa(host).status == "n/a"
    put(tmp_path, "/sys/devices/system/node/node1/cpulist", "8-15\n")
    check = check_numa(host)
    assert check.status == "pass" and check.data["process_nodes"] == [0]
    assert check_numa(Host(tmp_path, environ={}, opener=denying("cpulist"))).status == "unknown"
    put(tmp_path, "/sys/devices/system/node/node1/cpulist", "garbage\n")
    assert check_numa(host).status == "unknown"


def test_machine_checks_on_empty_tree_never_crash(tmp_path: Path) -> None:
    checks = machine_checks(Host(tmp_path, environ={}))
    assert {c.id for c in checks} == {"cpu.usable", "memory", "shm", "nofile", "cpu.governor", "numa"}
    assert all(c.status == "unknown" for c in checks), [(c.id, c.status) for c in checks]


def test_mount_for_picks_longest_prefix() -> None:
    mounts = parse_mounts("/dev/vda / ext4 rw 0 0\nsrv:/data /mnt/data nfs4 rw 0 0\n"
                          "x /mnt/data\\040set fuse.s3fs rw 0 0\n")
    assert mount_for("/mnt/data/train/a.jpg", mounts).fs_type == "nfs4"
    assert mount_for("/mnt/data set/a", mounts).fs_type == "fuse.s3fs"
    assert mount_for("/mnt/database", mounts).fs_type == "ext4"
