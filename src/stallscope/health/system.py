"""Machine checks: usable CPUs, memory, shared memory, open-files limit, CPU governor and NUMA layout.

Each check reads through a ``Host`` and turns an unreadable source into status ``unknown`` with the reason.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from stallscope.health import cgroup
from stallscope.health.checks import FAIL, PASS, WARN, Check, fmt_bytes, not_applicable, unknown
from stallscope.health.host import Host, SourceError, meminfo_bytes, parse_cpulist, parse_kv, parse_mounts

#: Below this many usable CPUs a decode-heavy pipeline is CPU-bound on almost any GPU.
MIN_CPUS = 4
#: Below this much memory, workers, their prefetched batches and the page cache compete.
MIN_MEMORY = 8 << 30
#: PyTorch shares tensors between processes through file descriptors by default; thousands may be open.
MIN_NOFILE = 4096


@dataclass(frozen=True)
class LoaderAssumptions:
    """What the DataLoader is assumed to keep in flight when the real configuration is not known.

    The defaults describe an ImageNet-style job: 256 samples of 3x224x224 float32, two batches prefetched
    per worker, one worker per usable CPU.
    """

    num_workers: int | None = None
    prefetch_factor: int = 2
    batch_size: int = 256
    sample_bytes: int = 3 * 224 * 224 * 4

    def in_flight_bytes(self, usable_cpus: int) -> int:
        workers = self.num_workers if self.num_workers is not None else usable_cpus
        return max(1, workers) * self.prefetch_factor * self.batch_size * self.sample_bytes


def allowed_cpus(host: Host) -> tuple[set[int] | None, str]:
    """CPUs the scheduler may run this process on (affinity, which already reflects a cpuset). The status file shows
    the mask as set, which may name possible CPUs that are offline (hot-pluggable vCPUs, SMT switched off); like
    ``sched_getaffinity``, only the online ones count."""
    try:
        raw = parse_kv(host.read("/proc/self/status")).get("Cpus_allowed_list")
        if raw is None:
            raise SourceError("/proc/self/status", "/proc/self/status has no Cpus_allowed_list")
        cpus = parse_cpulist(raw)
        online = _online_set(host)
        return (cpus & online if online and cpus & online else cpus), "/proc/self/status"
    except (SourceError, ValueError) as exc:
        if host.live and hasattr(os, "sched_getaffinity"):
            return set(os.sched_getaffinity(0)), "sched_getaffinity"
        return None, exc.reason if isinstance(exc, SourceError) else f"bad Cpus_allowed_list ({exc})"


def _online_set(host: Host) -> set[int] | None:
    text = host.read_or_none("/sys/devices/system/cpu/online")
    try:
        return parse_cpulist(text) if text is not None else None
    except ValueError:
        return None


def online_cpus(host: Host) -> int | None:
    online = _online_set(host)
    if online is not None:
        return len(online)
    return os.cpu_count() if host.live else None


def physical_cores(host: Host, cpus: set[int] | None) -> int | None:
    """Physical cores that ``cpus`` span: hardware threads of one core (SMT, hyper-threading) count once. None
    where the topology is not visible (no sysfs, a CPU without its ``topology`` folder): each CPU then stands
    for a core of its own.

    The model needs it because a core's second hardware thread adds only a fraction of a core: a job that keeps
    all 16 CPUs of an 8-core, 16-thread machine busy gets nowhere near twice what 8 busy CPUs give."""
    groups = core_groups(host, cpus)
    return len(groups) if groups is not None else None


def core_groups(host: Host, cpus: set[int] | None) -> list[frozenset[int]] | None:
    """The cores ``cpus`` span, each as the set of its hardware threads (all of them, in ``cpus`` or not), in
    order; None where the topology is not visible (``physical_cores``)."""
    online = _online_set(host)
    if cpus and online:  # a mask may name possible CPUs that are offline (no topology folder)
        cpus = cpus & online
    if not cpus:
        return None
    cores: set[frozenset[int]] = set()
    for cpu in sorted(cpus):
        siblings = None
        for name in ("core_cpus_list", "thread_siblings_list"):  # the newer name, then the older one
            text = host.read_or_none(f"/sys/devices/system/cpu/cpu{cpu}/topology/{name}")
            if text is not None:
                try:
                    siblings = frozenset(parse_cpulist(text)) or None
                except ValueError:
                    siblings = None
                break
        if siblings is None or cpu not in siblings:
            return None
        cores.add(siblings)
    return sorted(cores, key=min)


def usable_cpu_count(host: Host) -> int | None:
    """CPUs this process can keep busy: affinity, tightened by the cgroup quota. None when neither is readable."""
    cpus, _ = allowed_cpus(host)
    quota = cgroup.quota_as_cpus(cgroup.cpu_quota(host))
    if cpus is None:
        return quota
    return min(len(cpus), quota) if quota is not None else len(cpus)


def check_cpus(host: Host) -> Check:
    title = "usable CPUs"
    why = ("DataLoader workers, decode and augmentation share these CPUs: with few of them a JPEG pipeline rarely "
           "keeps a GPU busy, and num_workers sized from os.cpu_count() above the affinity mask or cgroup quota "
           "oversubscribes and thrashes.")
    cpus, source = allowed_cpus(host)
    quota = cgroup.cpu_quota(host)
    online = online_cpus(host)
    if cpus is None and quota.value is None:
        return unknown("cpu.usable", title, source, why=why)
    affinity_n = len(cpus) if cpus is not None else None
    quota_n = cgroup.quota_as_cpus(quota)
    usable = min(x for x in (affinity_n, quota_n) if x is not None)
    parts = [f"{usable} usable"]
    parts.append(f"affinity {affinity_n}" if affinity_n is not None else f"affinity unknown ({source})")
    if quota.error:
        parts.append(f"cgroup quota unknown ({quota.error})")
    else:
        parts.append(f"cgroup quota {quota.value:g}" if quota.value is not None else "no cgroup quota")
    parts.append(f"os.cpu_count {online}" if online is not None else "os.cpu_count unknown")
    cores = physical_cores(host, cpus)
    if cores is not None and affinity_n is not None and cores < affinity_n:
        parts.append(f"the affinity's {affinity_n} CPUs are {cores} cores with {affinity_n / cores:g} hardware "
                     "threads each")
    data = {"usable": usable, "affinity": affinity_n, "quota_cpus": quota.value, "online": online,
            "physical_cores": cores}
    if usable < MIN_CPUS:
        status, fix = WARN, (f"Run on a machine or container with at least {MIN_CPUS} CPUs for the input pipeline, "
                             "or move decode to the GPU (DALI, torchvision.io.decode_jpeg on cuda).")
    elif online is not None and online > usable * 1.5:
        status, fix = WARN, (f"Size num_workers from the usable count ({usable}), e.g. len(os.sched_getaffinity(0)), "
                             "not os.cpu_count().")
    else:
        status, fix = PASS, ""
    return Check("cpu.usable", title, status, ", ".join(parts), f">= {MIN_CPUS} usable, not far below os.cpu_count",
                 why, fix, data)


def effective_memory(host: Host) -> tuple[int | None, int | None, cgroup.Limit]:
    """(MemTotal, the smaller of MemTotal and the cgroup limit, the cgroup limit read)."""
    limit = cgroup.memory_limit(host)
    text = host.read_or_none("/proc/meminfo")
    total = meminfo_bytes(text, "MemTotal") if text else None
    if total is None:
        return None, (int(limit.value) if limit.value is not None else None), limit
    return total, int(min(total, limit.value)) if limit.value is not None else total, limit


def check_memory(host: Host) -> Check:
    title = "memory and cgroup limit"
    why = ("Workers, their prefetched batches and the dataset's page cache share this memory; a container limit "
           "below what `free` shows ends in an OOM kill of a worker ('DataLoader worker killed by signal 9').")
    try:
        meminfo = host.read("/proc/meminfo")
    except SourceError as exc:
        return unknown("memory", title, exc.reason, why=why)
    total = meminfo_bytes(meminfo, "MemTotal")
    available = meminfo_bytes(meminfo, "MemAvailable")
    if total is None:
        return unknown("memory", title, "/proc/meminfo has no MemTotal", why=why)
    limit = cgroup.memory_limit(host)
    effective = int(min(total, limit.value)) if limit.value is not None else total
    value = f"{fmt_bytes(total)} total, {fmt_bytes(available)} available, "
    if limit.error:
        value += f"cgroup limit unknown ({limit.error})"
    else:
        value += f"cgroup limit {fmt_bytes(limit.value)}" if limit.value is not None else "no cgroup limit"
    data = {"total_bytes": total, "available_bytes": available, "cgroup_limit_bytes": limit.value,
            "effective_bytes": effective}
    if effective < MIN_MEMORY:
        status, fix = WARN, "Give the job more memory, or lower num_workers x prefetch_factor x batch size."
    elif limit.value is not None and limit.value < 0.5 * total:
        status, fix = WARN, (f"The container may use {fmt_bytes(limit.value)} of {fmt_bytes(total)}: size workers "
                             "and caches from the limit, or raise it (docker --memory, k8s resources.limits).")
    else:
        status, fix = PASS, ""
    return Check("memory", title, status, value, f">= {fmt_bytes(MIN_MEMORY)} usable", why, fix, data)


def _shm_size(host: Host) -> tuple[int | None, int | None, str]:
    """(size, free) of /dev/shm in bytes: statvfs on a live host or when injected, else the tmpfs size= option."""
    if host.live or host.statvfs is not None:
        try:
            st = host.fs_stat("/dev/shm")
            return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, "statvfs"
        except SourceError as exc:
            return None, None, exc.reason
    try:
        mounts = parse_mounts(host.read("/proc/mounts"))
    except SourceError as exc:
        return None, None, exc.reason
    for mount in reversed(mounts):
        if mount.mount_point == "/dev/shm":
            for opt in mount.options:
                m = re.fullmatch(r"size=(\d+)([kmgKMG]?)", opt)
                if m:
                    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
                    return int(m.group(1)) * scale, None, "/proc/mounts"
            return None, None, "/dev/shm is mounted without a size= option"
    return None, None, "/dev/shm is not a mount point"


def check_shm(host: Host, loader: LoaderAssumptions, usable_cpus: int | None) -> Check:
    title = "/dev/shm vs batches in flight"
    why = ("Worker processes hand batches to the main process through shared memory; when /dev/shm is smaller than "
           "the batches in flight, workers die with 'Bus error' or 'No space left on device' (Docker's default is "
           "64 MiB).")
    size, free, source = _shm_size(host)
    if size is None:
        return unknown("shm", title, source, why=why)
    workers = loader.num_workers if loader.num_workers is not None else (usable_cpus or 1)
    need = loader.in_flight_bytes(workers)
    value = f"{fmt_bytes(size)}" + (f" ({fmt_bytes(free)} free)" if free is not None else "")
    value += f" vs {fmt_bytes(need)} in flight"
    threshold = (f">= 2 x {workers} workers x {loader.prefetch_factor} prefetch x {loader.batch_size} samples x "
                 f"{fmt_bytes(loader.sample_bytes)}")
    room = free if free is not None else size
    data = {"size_bytes": size, "free_bytes": free, "in_flight_bytes": need, "workers": workers,
            "prefetch_factor": loader.prefetch_factor, "batch_size": loader.batch_size,
            "sample_bytes": loader.sample_bytes}
    fix = ("Enlarge it: docker run --shm-size=8g (or --ipc=host); k8s: mount an emptyDir with medium: Memory at "
           "/dev/shm. Or lower num_workers x prefetch_factor.")
    if room < need:
        return Check("shm", title, FAIL, value, threshold, why, fix, data)
    if room < 2 * need:
        return Check("shm", title, WARN, value, threshold, why, fix, data)
    return Check("shm", title, PASS, value, threshold, why, "", data)


def check_nofile(host: Host) -> Check:
    title = "open-files limit"
    why = ("PyTorch's default 'file_descriptor' sharing strategy keeps one descriptor per shared tensor; many workers "
           "with deep prefetch hit a low soft limit as 'received 0 items of ancdata' or 'Too many open files'.")
    try:
        text = host.read("/proc/self/limits")
    except SourceError as exc:
        return unknown("nofile", title, exc.reason, why=why)
    for line in text.splitlines():
        if line.startswith("Max open files"):
            fields = line[len("Max open files"):].split()
            try:
                soft = None if fields[0] == "unlimited" else int(fields[0])
                hard = None if fields[1] == "unlimited" else int(fields[1])
            except (IndexError, ValueError):
                return unknown("nofile", title, f"unparsable line {line.strip()!r}", why=why)
            value = (f"soft {soft if soft is not None else 'unlimited'}, "
                     f"hard {hard if hard is not None else 'unlimited'}")
            data = {"soft": soft, "hard": hard}
            if soft is not None and soft < MIN_NOFILE:
                fix = (f"ulimit -n {min(hard, 65536) if hard else 65536} before training, or "
                       "torch.multiprocessing.set_sharing_strategy('file_system').")
                return Check("nofile", title, WARN, value, f"soft >= {MIN_NOFILE}", why, fix, data)
            return Check("nofile", title, PASS, value, f"soft >= {MIN_NOFILE}", why, "", data)
    return unknown("nofile", title, "/proc/self/limits has no 'Max open files' line", why=why)


def check_governor(host: Host) -> Check:
    title = "CPU frequency governor"
    why = ("With 'powersave' (acpi-cpufreq) or 'conservative', cores stay at low clocks between bursts; the bursty "
           "decode work of a DataLoader runs slower than the CPU's rating.")
    cpus, _ = allowed_cpus(host)
    names = [n for n in host.listdir("/sys/devices/system/cpu") if re.fullmatch(r"cpu\d+", n)]
    if cpus is not None:
        names = [n for n in names if int(n[3:]) in cpus] or names
    if not names:
        return unknown("cpu.governor", title, "/sys/devices/system/cpu lists no CPUs", why=why)
    governors: dict[str, int] = {}
    reasons: set[str] = set()
    for name in names:
        try:
            gov = host.read(f"/sys/devices/system/cpu/{name}/cpufreq/scaling_governor").strip()
            governors[gov] = governors.get(gov, 0) + 1
        except SourceError as exc:
            reasons.add(exc.reason.replace(name, "cpuN"))
    if not governors:
        reason = "; ".join(sorted(reasons))
        if not host.exists(f"/sys/devices/system/cpu/{names[0]}/cpufreq"):
            reason = "no cpufreq in /sys (a VM or a kernel without cpufreq): the governor is not visible here"
        return unknown("cpu.governor", title, reason, why=why)
    value = ", ".join(f"{g} x{n}" for g, n in sorted(governors.items()))
    slow = {g for g in governors if g in ("powersave", "conservative", "userspace")}
    data = {"governors": governors}
    if slow:
        return Check("cpu.governor", title, WARN, value, "performance, schedutil or ondemand", why,
                     "sudo cpupower frequency-set -g performance (or set it in the BIOS / instance profile).", data)
    return Check("cpu.governor", title, PASS, value, "performance, schedutil or ondemand", why, "", data)


def check_numa(host: Host) -> Check:
    title = "NUMA nodes"
    why = ("On a multi-socket machine, memory and PCIe devices belong to one node; workers and pinned buffers on "
           "the far node pay the inter-socket link on every batch.")
    nodes = [n for n in host.listdir("/sys/devices/system/node") if re.fullmatch(r"node\d+", n)]
    if not nodes:
        return unknown("numa", title, "/sys/devices/system/node lists no nodes", why=why)
    node_cpus: dict[int, set[int]] = {}
    for name in nodes:
        try:
            node_cpus[int(name[4:])] = parse_cpulist(host.read(f"/sys/devices/system/node/{name}/cpulist"))
        except (SourceError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, SourceError) else f"bad cpulist ({exc})"
            return unknown("numa", title, reason, why=why)
    if len(node_cpus) == 1:
        return not_applicable("numa", title, "single NUMA node", nodes=1)
    cpus, _ = allowed_cpus(host)
    spans = sorted(n for n, c in node_cpus.items() if cpus is None or c & cpus)
    value = f"{len(node_cpus)} nodes; this process may run on node(s) {', '.join(map(str, spans))}"
    return Check("numa", title, PASS, value, "workers on the GPU's node (see gpu.numa)", why, "",
                 {"nodes": {str(n): sorted(c) for n, c in node_cpus.items()}, "process_nodes": spans})


def machine_checks(host: Host, loader: LoaderAssumptions | None = None) -> list[Check]:
    loader = loader or LoaderAssumptions()
    usable = usable_cpu_count(host)
    return [check_cpus(host), check_memory(host), check_shm(host, loader, usable), check_nofile(host),
            check_governor(host), check_numa(host)]

