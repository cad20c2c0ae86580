"""The machine and checkout a run happens on: its fingerprint, its git commit, and the CPUs it may use.

"Usable CPUs" has one rule, the doctor's: the scheduler's affinity mask, tightened by the cgroup CPU quota
(``health.system.usable_cpu_count``). ``usable_cpus()`` applies it to this machine now;
``recorded_usable_cpus()`` reads what a saved session says, for analysing it later on another machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

GIT_TIMEOUT_S = 2.0


def affinity_cpus() -> int:
    """CPUs the scheduler may run this process on (the cpuset included), without the cgroup quota."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cpus() -> int:
    """CPUs this process can keep busy now: affinity, tightened by the cgroup quota."""
    from stallscope.health.host import Host
    from stallscope.health.system import usable_cpu_count

    try:
        usable = usable_cpu_count(Host())
    except Exception:  # an unreadable /proc or cgroup tree: the affinity still holds
        usable = None
    return usable or affinity_cpus()


def recorded_usable_cpus(environment: Mapping[str, Any], checks: Sequence[Mapping[str, Any]]) -> int:
    """The usable CPUs of a recorded run: the doctor's figure when its check ran, else the affinity."""
    for check in checks:
        data = check.get("data") or {}
        usable = data.get("usable") if check.get("id") == "cpu.usable" else None
        if isinstance(usable, (int, float)) and usable > 0:
            return max(1, int(usable))
    return int(environment.get("cpus_affinity") or environment.get("cpu_count") or 1)


def recorded_cpu_capacity(environment: Mapping[str, Any], checks: Sequence[Mapping[str, Any]]) -> float:
    """The CPU time a recorded run could use per second, unrounded: its affinity, or its cgroup quota where that is
    less (half a CPU is half, where ``recorded_usable_cpus`` says 1)."""
    for check in checks:
        data = (check.get("data") or {}) if check.get("id") == "cpu.usable" else {}
        limits = [v for v in (data.get("affinity"), data.get("quota_cpus"))
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]
        if limits:
            return float(min(limits))
    return float(recorded_usable_cpus(environment, checks))


def recorded_physical_cores(checks: Sequence[Mapping[str, Any]]) -> int | None:
    """The physical cores a recorded run's CPUs were hardware threads of (the doctor's ``cpu.usable`` check), or
    None where the check did not see the topology (then each CPU counts as a core)."""
    for check in checks:
        cores = (check.get("data") or {}).get("physical_cores") if check.get("id") == "cpu.usable" else None
        if isinstance(cores, int) and not isinstance(cores, bool) and cores > 0:
            return cores
    return None


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def fingerprint() -> dict[str, Any]:
    """What makes two runs comparable: machine, Python, library versions, visible GPUs."""
    import stallscope

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "cpus_affinity": affinity_cpus(),
        "stallscope": stallscope.__version__,
        "torch": _package_version("torch"),
        "torchvision": _package_version("torchvision"),
        "pillow": _package_version("pillow"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def fingerprint_hash(environment: Mapping[str, Any]) -> str:
    """A short hash of a fingerprint, so runs on different machines or library versions stand out."""
    blob = json.dumps(dict(environment), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def git_commit(cwd: str | None, timeout_s: float = GIT_TIMEOUT_S) -> str | None:
    """HEAD of the repository the run started in (a ``+dirty`` suffix when tracked files changed)."""
    if not cwd or not Path(cwd).is_dir():
        return None
    try:
        head = subprocess.run(["git", "-C", cwd, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=timeout_s)
        if head.returncode != 0:
            return None
        commit = head.stdout.strip() or None
        status = subprocess.run(["git", "-C", cwd, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=timeout_s)
        if commit and status.returncode == 0 and status.stdout.strip():
            commit += "+dirty"
        return commit
    except (OSError, subprocess.SubprocessError):
        return None
