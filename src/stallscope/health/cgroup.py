"""Container limits from cgroups v1 and v2: the CPU quota and memory limit this process actually runs under.

``os.cpu_count()`` and ``/proc/meminfo`` describe the host; a container with ``--cpus 4 --memory 16g`` on a
64-core machine still reports 64 cores, and a DataLoader sized from that count thrashes. Limits are
hierarchical, so the effective one is the tightest among the process's cgroup and its ancestors.
"""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass

from stallscope.health.host import Host, SourceError

#: cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit value; anything this large is unlimited.
V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class Limit:
    """A limit read from cgroups: ``value`` None with ``error`` None means "no limit set anywhere"."""

    value: float | None
    source: str
    error: str | None = None

    @property
    def known(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class CgroupDirs:
    """This process's cgroup directories on the inspected machine, leaf first, up to the mount root."""

    v2: tuple[str, ...]
    v1: dict[str, tuple[str, ...]]


def _parse_self_cgroup(text: str) -> tuple[str | None, dict[str, str]]:
    """``/proc/self/cgroup`` -> (v2 path, {v1 controller: path})."""
    v2_path: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2_path = path
        else:
            for ctrl in controllers.split(","):
                if ctrl:
                    v1[ctrl.removeprefix("name=")] = path
    return v2_path, v1


@dataclass(frozen=True)
class _CgroupMount:
    root: str
    mount_point: str
    fs_type: str
    super_options: tuple[str, ...]


def _parse_mountinfo(text: str) -> list[_CgroupMount]:
    mounts = []
    for line in text.splitlines():
        if " - " not in line:
            continue
        left, right = line.split(" - ", 1)
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3 or rf[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append(_CgroupMount(lf[3], lf[4], rf[0], tuple(rf[2].split(","))))
    return mounts


def _chain(host: Host, mount_point: str, mount_root: str, path: str) -> tuple[str, ...]:
    """Directories from the process's cgroup up to the mount point, as paths of the inspected machine.

    Without a cgroup namespace, ``/proc/self/cgroup`` shows host paths while the container mounts a subtree;
    the mount's root tells which prefix to strip. When the mapped directory does not exist (a namespaced view),
    the mount point itself is the process's cgroup.
    """
    rel = path
    if mount_root not in ("", "/") and (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        rel = path[len(mount_root.rstrip("/")):]
    leaf = posixpath.normpath(posixpath.join(mount_point, rel.lstrip("/")))
    if not host.is_dir(leaf):
        leaf = mount_point
    chain = [leaf]
    while leaf != mount_point and leaf.startswith(mount_point):
        leaf = posixpath.dirname(leaf)
        chain.append(leaf)
    return tuple(chain)


def locate(host: Host) -> CgroupDirs:
    """Find this process's cgroup directories; falls back to the conventional mount points under ``/sys/fs/cgroup``."""
    self_text = host.read_or_none("/proc/self/cgroup") or ""
    v2_path, v1_paths = _parse_self_cgroup(self_text)
    mounts = _parse_mountinfo(host.read_or_none("/proc/self/mountinfo") or "")
    v2: tuple[str, ...] = ()
    v1: dict[str, tuple[str, ...]] = {}
    for mount in mounts:
        if mount.fs_type == "cgroup2" and not v2:
            v2 = _chain(host, mount.mount_point, mount.root, v2_path or "/")
        elif mount.fs_type == "cgroup":
            for ctrl in ("cpu", "memory", "cpuset"):
                if ctrl in mount.super_options and ctrl not in v1:
                    v1[ctrl] = _chain(host, mount.mount_point, mount.root, v1_paths.get(ctrl, "/"))
    if not mounts:
        if host.exists("/sys/fs/cgroup/cgroup.controllers"):
            v2 = _chain(host, "/sys/fs/cgroup", "/", v2_path or "/")
        for ctrl in ("cpu", "memory", "cpuset"):
            candidates = [f"/sys/fs/cgroup/{ctrl}"] + (["/sys/fs/cgroup/cpu,cpuacct"] if ctrl == "cpu" else [])
            for candidate in candidates:
                if ctrl not in v1 and host.is_dir(candidate):
                    v1[ctrl] = _chain(host, candidate, "/", v1_paths.get(ctrl, "/"))
    return CgroupDirs(v2=v2, v1=v1)


def cpu_quota(host: Host, dirs: CgroupDirs | None = None) -> Limit:
    """CPUs' worth of time the cgroup may use per period (``1.5`` = one and a half CPUs), tightest in the chain."""
    dirs = dirs or locate(host)
    tightest: float | None = None
    sources: list[str] = []
    try:
        for d in dirs.v2:
            if not host.exists(f"{d}/cpu.max"):
                continue
            fields = host.read(f"{d}/cpu.max").split()
            if len(fields) < 1 or fields[0] == "max":
                continue
            quota, period = int(fields[0]), int(fields[1]) if len(fields) > 1 else 100_000
            cpus = quota / period
            sources.append(f"{d}/cpu.max")
            tightest = cpus if tightest is None else min(tightest, cpus)
        for d in dirs.v1.get("cpu", ()):
            if not host.exists(f"{d}/cpu.cfs_quota_us"):
                continue
            quota = int(host.read(f"{d}/cpu.cfs_quota_us").strip())
            if quota <= 0:
                continue
            period = int(host.read(f"{d}/cpu.cfs_period_us").strip())
            cpus = quota / period
            sources.append(f"{d}/cpu.cfs_quota_us")
            tightest = cpus if tightest is None else min(tightest, cpus)
    except SourceError as exc:
        return Limit(None, exc.path, exc.reason)
    except (ValueError, ZeroDivisionError) as exc:
        return Limit(None, "cgroup cpu", f"unparsable cgroup CPU quota ({exc})")
    if not dirs.v2 and "cpu" not in dirs.v1:
        return Limit(None, "no cgroup cpu controller found")
    return Limit(tightest, ", ".join(sources) or "cgroup (no quota set)")


def memory_limit(host: Host, dirs: CgroupDirs | None = None) -> Limit:
    """Bytes the cgroup may hold before the kernel OOM-kills it (page cache of the dataset counts too)."""
    dirs = dirs or locate(host)
    tightest: float | None = None
    sources: list[str] = []
    try:
        for d in dirs.v2:
            if not host.exists(f"{d}/memory.max"):
                continue
            text = host.read(f"{d}/memory.max").strip()
            if text == "max":
                continue
            sources.append(f"{d}/memory.max")
            tightest = float(int(text)) if tightest is None else min(tightest, float(int(text)))
        for d in dirs.v1.get("memory", ()):
            if not host.exists(f"{d}/memory.limit_in_bytes"):
                continue
            value = int(host.read(f"{d}/memory.limit_in_bytes").strip())
            if value >= V1_UNLIMITED:
                continue
            sources.append(f"{d}/memory.limit_in_bytes")
            tightest = float(value) if tightest is None else min(tightest, float(value))
    except SourceError as exc:
        return Limit(None, exc.path, exc.reason)
    except ValueError as exc:
        return Limit(None, "cgroup memory", f"unparsable cgroup memory limit ({exc})")
    if not dirs.v2 and "memory" not in dirs.v1:
        return Limit(None, "no cgroup memory controller found")
    return Limit(tightest, ", ".join(sources) or "cgroup (no limit set)")


def quota_as_cpus(limit: Limit) -> int | None:
    """A fractional quota rounded up: 1.5 CPUs of quota keeps two workers busy part of the time."""
    return None if limit.value is None else max(1, math.ceil(limit.value - 1e-9))
