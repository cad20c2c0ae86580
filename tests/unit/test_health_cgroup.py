"""cgroup v1 and v2 limits read from fake trees, including unreadable and malformed files."""

from __future__ import annotations

from pathlib import Path

from stallscope.health import cgroup
from stallscope.health.host import Host


def put(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


V2_MOUNTINFO = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTINFO = (
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
)


def v2_tree(root: Path) -> None:
    put(root, "/proc/self/cgroup", "0::/kubepods/pod1/ctr\n")
    put(root, "/proc/self/mountinfo", V2_MOUNTINFO)
    put(root, "/sys/fs/cgroup/cgroup.controllers", "cpu memory\n")
    put(root, "/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n")
    put(root, "/sys/fs/cgroup/kubepods/pod1/cpu.max", "250000 100000\n")
    put(root, "/sys/fs/cgroup/kubepods/cpu.max", "400000 100000\n")
    put(root, "/sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "4294967296\n")
    put(root, "/sys/fs/cgroup/kubepods/pod1/memory.max", "2147483648\n")
    put(root, "/sys/fs/cgroup/kubepods/memory.max", "max\n")


def v1_tree(root: Path, quota: str = "200000", limit: str = "1073741824") -> None:
    put(root, "/proc/self/cgroup", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    put(root, "/proc/self/mountinfo", V1_MOUNTINFO)
    put(root, "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", quota + "\n")
    put(root, "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    put(root, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    put(root, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    put(root, "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", limit + "\n")
    put(root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")


def test_v2_tightest_ancestor_wins(tmp_path: Path) -> None:
    v2_tree(tmp_path)
    host = Host(tmp_path, environ={})
    dirs = cgroup.locate(host)
    assert dirs.v2[0] == "/sys/fs/cgroup/kubepods/pod1/ctr" and dirs.v2[-1] == "/sys/fs/cgroup"
    quota = cgroup.cpu_quota(host, dirs)
    assert quota.known and quota.value == 2.5
    assert cgroup.quota_as_cpus(quota) == 3
    memory = cgroup.memory_limit(host, dirs)
    assert memory.known and memory.value == 2147483648


def test_v1_quota_and_limit(tmp_path: Path) -> None:
    v1_tree(tmp_path)
    host = Host(tmp_path, environ={})
    assert cgroup.cpu_quota(host).value == 2.0
    assert cgroup.memory_limit(host).value == 1073741824


def test_v1_unlimited_reads_as_no_limit(tmp_path: Path) -> None:
    v1_tree(tmp_path, quota="-1", limit="9223372036854771712")
    host = Host(tmp_path, environ={})
    quota, memory = cgroup.cpu_quota(host), cgroup.memory_limit(host)
    assert quota.known and quota.value is None
    assert memory.known and memory.value is None


def test_v1_namespaced_mount_root_maps_to_mount_point(tmp_path: Path) -> None:
    """Without a cgroup namespace, /proc/self/cgroup shows host paths while the container mounts its own subtree."""
    put(tmp_path, "/proc/self/cgroup", "3:cpu,cpuacct:/docker/abc\n")
    put(tmp_path, "/proc/self/mountinfo",
        "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n")
    put(tmp_path, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "50000\n")
    put(tmp_path, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    quota = cgroup.cpu_quota(Host(tmp_path, environ={}))
    assert quota.value == 0.5 and cgroup.quota_as_cpus(quota) == 1


def test_fallback_without_mountinfo_finds_v2(tmp_path: Path) -> None:
    put(tmp_path, "/sys/fs/cgroup/cgroup.controllers", "cpu\n")
    put(tmp_path, "/sys/fs/cgroup/cpu.max", "100000 50000\n")
    assert cgroup.cpu_quota(Host(tmp_path, environ={})).value == 2.0


def test_no_cgroup_at_all_is_no_limit_not_an_error(tmp_path: Path) -> None:
    host = Host(tmp_path, environ={})
    quota = cgroup.cpu_quota(host)
    assert quota.value is None and quota.error is None
    assert "no cgroup" in quota.source


def test_permission_error_is_an_error_not_a_value(tmp_path: Path) -> None:
    """Tests run as root, so chmod cannot deny a read: the opener raises PermissionError instead."""
    v2_tree(tmp_path)

    def opener(path: Path) -> str:
        if path.name in ("cpu.max", "memory.max"):
            raise PermissionError(13, "Permission denied", str(path))
        return path.read_text()

    host = Host(tmp_path, environ={}, opener=opener)
    quota, memory = cgroup.cpu_quota(host), cgroup.memory_limit(host)
    assert quota.value is None and "permission denied" in quota.error
    assert memory.value is None and "permission denied" in memory.error


def test_directory_where_file_expected(tmp_path: Path) -> None:
    v2_tree(tmp_path)
    target = tmp_path / "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max"
    target.unlink()
    target.mkdir()
    quota = cgroup.cpu_quota(Host(tmp_path, environ={}))
    assert quota.value is None and "is a directory" in quota.error


def test_garbage_is_reported_unparsable(tmp_path: Path) -> None:
    v2_tree(tmp_path)
    put(tmp_path, "/sys/fs/cgroup/kubepods/pod1/cpu.max", "lots 100000\n")
    put(tmp_path, "/sys/fs/cgroup/kubepods/pod1/memory.max", "a lot\n")
    host = Host(tmp_path, environ={})
    assert "unparsable" in cgroup.cpu_quota(host).error
    assert "unparsable" in cgroup.memory_limit(host).error
