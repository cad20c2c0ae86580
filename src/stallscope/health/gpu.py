"""GPU checks through NVML: PCIe link, NUMA placement, persistence mode, allocator configuration.

``pynvml`` (package ``nvidia-ml-py``, the ``gpu`` extra) is imported lazily. Tests pass any object with the same
functions as ``nvml=``; the code only calls documented NVML entry points and treats every NVML error on one query
as "unknown" for that GPU, because older drivers and some boards do not support every query.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stallscope.health.checks import FAIL, NA, PASS, UNKNOWN, WARN, Check, not_applicable, unknown
from stallscope.health.host import Host, SourceError, parse_cpulist
from stallscope.health.system import allowed_cpus

#: Usable GB/s per lane and direction after line encoding, by PCIe generation.
PCIE_GBPS_PER_LANE: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


@dataclass
class GpuInfo:
    index: int
    name: str | None = None
    bus_id: str | None = None
    pcie: dict[str, int | None] = field(default_factory=dict)
    numa_node: int | None = None
    numa_error: str | None = None
    persistence: bool | None = None
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class GpuFacts:
    """What NVML said, or why it said nothing: ``absent`` (no GPU here) and ``error`` (could not ask)."""

    gpus: list[GpuInfo] = field(default_factory=list)
    driver: str | None = None
    cuda_driver: str | None = None
    absent: str | None = None
    error: str | None = None


def load_nvml() -> Any:
    import pynvml  # noqa: PLC0415 - optional dependency, imported only when a GPU check runs

    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ask(nvml: Any, info: GpuInfo, key: str, fn_name: str, *args: Any) -> Any:
    """One NVML query; an unsupported or failing query is recorded on the GPU, never guessed."""
    fn = getattr(nvml, fn_name, None)
    if fn is None:
        info.errors[key] = f"{fn_name} not in this NVML"
        return None
    try:
        return fn(*args)
    except Exception as exc:  # NVMLError subclasses; any failure means "not known"
        info.errors[key] = f"{fn_name}: {exc}"
        return None


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` -> sysfs's ``0000:3b:00.0``."""
    domain, rest = bus_id.split(":", 1)
    return f"{domain[-4:]}:{rest}".lower()


def read_gpus(host: Host, nvml: Any | None = None) -> GpuFacts:
    """Ask NVML about every GPU. Without NVML, distinguishes "no GPU here" from "a GPU we cannot ask"."""
    has_driver = host.exists("/proc/driver/nvidia/version")
    if nvml is None:
        try:
            nvml = load_nvml()
        except ImportError:
            if has_driver:
                return GpuFacts(error="nvidia-ml-py is not installed (pip install 'stallscope[gpu]')")
            return GpuFacts(absent="no NVIDIA driver and no NVML")
    try:
        nvml.nvmlInit()
    except Exception as exc:
        if not has_driver:
            return GpuFacts(absent=f"no NVIDIA driver (nvmlInit: {exc})")
        return GpuFacts(error=f"nvmlInit failed: {exc}")
    try:
        facts = GpuFacts()
        try:
            facts.driver = _text(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            pass
        try:
            v = int(nvml.nvmlSystemGetCudaDriverVersion())
            facts.cuda_driver = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:
            pass
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            return GpuFacts(error=f"nvmlDeviceGetCount: {exc}", driver=facts.driver, cuda_driver=facts.cuda_driver)
        if count == 0:
            facts.absent = "NVML reports no GPUs"
        for index in range(count):
            facts.gpus.append(_read_one(host, nvml, index))
        return facts
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _read_one(host: Host, nvml: Any, index: int) -> GpuInfo:
    info = GpuInfo(index)
    handle = _ask(nvml, info, "handle", "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        return info
    name = _ask(nvml, info, "name", "nvmlDeviceGetName", handle)
    info.name = _text(name) if name is not None else None
    pci = _ask(nvml, info, "pci", "nvmlDeviceGetPciInfo", handle)
    if pci is not None:
        raw = getattr(pci, "busId", None) or getattr(pci, "busIdLegacy", None)
        info.bus_id = _text(raw) if raw is not None else None
    for key, fn in (("curr_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                    ("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                    ("gpu_max_gen", "nvmlDeviceGetGpuMaxPcieLinkGeneration"),
                    ("curr_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                    ("max_width", "nvmlDeviceGetMaxPcieLinkWidth")):
        value = _ask(nvml, info, key, fn, handle)
        info.pcie[key] = int(value) if value is not None else None
    mode = _ask(nvml, info, "persistence", "nvmlDeviceGetPersistenceMode", handle)
    info.persistence = bool(int(mode)) if mode is not None else None
    node = (_ask(nvml, info, "numa", "nvmlDeviceGetNumaNodeId", handle) if hasattr(nvml, "nvmlDeviceGetNumaNodeId")
            else None)
    if node is not None:
        info.numa_node = int(node)
    elif info.bus_id:
        path = f"/sys/bus/pci/devices/{sysfs_bus_id(info.bus_id)}/numa_node"
        try:
            info.numa_node = int(host.read(path).strip())
        except SourceError as exc:
            info.numa_error = exc.reason
        except ValueError:
            info.numa_error = f"{path} is not a number"
    else:
        info.numa_error = info.errors.get("pci", "no PCI bus id from NVML")
    return info


def _link(gen: int | None, width: int | None) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def _bandwidth(gen: int | None, width: int | None) -> float | None:
    return PCIE_GBPS_PER_LANE[gen] * width if gen in PCIE_GBPS_PER_LANE and width else None


def _pcie_status(gpu: GpuInfo) -> tuple[str, str]:
    p = gpu.pcie
    max_gen, max_width, gpu_max_gen = p.get("max_gen"), p.get("max_width"), p.get("gpu_max_gen")
    curr_gen, curr_width = p.get("curr_gen"), p.get("curr_width")
    if max_gen is None or max_width is None or curr_width is None:
        return UNKNOWN, f"GPU{gpu.index}: PCIe link not readable ({'; '.join(gpu.errors.values()) or 'no answer'})"
    text = (f"GPU{gpu.index}: {_link(curr_gen, curr_width)} now, max {_link(max_gen, max_width)}"
            f" ({_bandwidth(max_gen, max_width) or 0:.0f} GB/s per direction)")
    if curr_width < max_width:
        return WARN, text + f": link trained at x{curr_width} of x{max_width}"
    if gpu_max_gen is not None and max_gen < gpu_max_gen:
        return WARN, text + f": slot limits a Gen{gpu_max_gen} GPU to Gen{max_gen}"
    if curr_gen is not None and curr_gen < max_gen:
        text += " (an idle GPU lowers its link generation; it rises under load)"
    return PASS, text


_SEVERITY = {PASS: 0, NA: 0, UNKNOWN: 1, WARN: 2, FAIL: 3}


def _worst(statuses: list[str]) -> str:
    return max(statuses, key=lambda s: _SEVERITY[s]) if statuses else NA


def check_pcie(facts: GpuFacts) -> Check:
    title = "GPU PCIe link"
    why = ("Every batch crosses this link host-to-device; a link trained below its width or capped by the slot "
           "cuts transfer bandwidth and shows up as time in the transfer node.")
    results = [_pcie_status(g) for g in facts.gpus]
    status = _worst([s for s, _ in results])
    fix = ("Reseat the GPU or its riser, check BIOS PCIe settings (bifurcation, link speed), and use a full-width "
           "slot wired to the CPU.") if status == WARN else ""
    return Check("gpu.pcie", title, status, "; ".join(t for _, t in results), "current width = max width, slot "
                 "not below GPU generation", why, fix, {"gpus": [{"index": g.index, **g.pcie} for g in facts.gpus]})


def check_numa(host: Host, facts: GpuFacts) -> Check:
    title = "GPU NUMA node vs process CPUs"
    why = ("Pinned host buffers and DataLoader workers on the GPU's own NUMA node avoid the inter-socket link on "
           "every host-to-device copy.")
    node_names = [n for n in host.listdir("/sys/devices/system/node") if n.startswith("node") and n[4:].isdigit()]
    if len(node_names) == 1:
        return not_applicable("gpu.numa", title, "single NUMA node")
    cpus, cpu_source = allowed_cpus(host)
    parts, statuses, rows = [], [], []
    for gpu in facts.gpus:
        if gpu.numa_node is None:
            statuses.append(UNKNOWN)
            parts.append(f"GPU{gpu.index}: node unknown ({gpu.numa_error})")
            continue
        rows.append({"index": gpu.index, "node": gpu.numa_node})
        if gpu.numa_node < 0:
            statuses.append(NA)
            parts.append(f"GPU{gpu.index}: no NUMA affinity reported")
            continue
        try:
            node_cpus = parse_cpulist(host.read(f"/sys/devices/system/node/node{gpu.numa_node}/cpulist"))
        except (SourceError, ValueError) as exc:
            statuses.append(UNKNOWN)
            parts.append(f"GPU{gpu.index}: node {gpu.numa_node}, its CPUs unknown "
                         f"({exc.reason if isinstance(exc, SourceError) else exc})")
            continue
        if cpus is None:
            statuses.append(UNKNOWN)
            parts.append(f"GPU{gpu.index}: node {gpu.numa_node}, process CPUs unknown ({cpu_source})")
            continue
        local = len(cpus & node_cpus)
        statuses.append(PASS if local == len(cpus) else FAIL if local == 0 else WARN)
        parts.append(f"GPU{gpu.index}: node {gpu.numa_node}, {local} of the process's {len(cpus)} CPUs on it")
    status = _worst(statuses)
    fix = ("Bind each rank to its GPU's node: numactl --cpunodebind=N --membind=N python train.py "
           "(or taskset with the node's cpulist).") if status in (WARN, FAIL) else ""
    return Check("gpu.numa", title, status, "; ".join(parts), "all process CPUs on the GPU's node", why, fix,
                 {"gpus": rows})


def check_persistence(facts: GpuFacts) -> Check:
    title = "GPU persistence mode"
    why = "Without persistence mode the driver tears the GPU down between processes; each job start pays 1-3 s of init."
    states = [g.persistence for g in facts.gpus]
    value = ", ".join(f"GPU{g.index} {'on' if g.persistence else 'off' if g.persistence is not None else 'unknown'}"
                      for g in facts.gpus)
    data: dict[str, Any] = {"gpus": [{"index": g.index, "persistence": g.persistence} for g in facts.gpus]}
    if all(s is None for s in states):
        return unknown("gpu.persistence", title, "; ".join(g.errors.get("persistence", "?") for g in facts.gpus),
                       why=why, **data)
    if any(s is False for s in states):
        return Check("gpu.persistence", title, WARN, value, "on", why,
                     "sudo nvidia-smi -pm 1 (or enable nvidia-persistenced).", data)
    return Check("gpu.persistence", title, PASS, value, "on", why, "", data)


def check_allocator(host: Host) -> Check:
    title = "CUDA caching allocator config"
    why = ("Fragmentation in the caching allocator causes cudaMalloc retries and synchronizations mid-step; "
           "expandable_segments:True avoids most of them when batch shapes vary.")
    conf = {var: host.environ[var] for var in ALLOC_VARS if var in host.environ}
    value = ", ".join(f"{k}={v}" for k, v in conf.items()) or "unset (PyTorch defaults)"
    return Check("gpu.allocator", title, PASS, value, "", why,
                 "" if conf else "If batch shapes vary: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                 {"env": conf})


def gpu_checks(host: Host, facts: GpuFacts) -> list[Check]:
    if facts.error:
        return [unknown("gpu", "NVIDIA GPUs", facts.error)]
    if facts.absent or not facts.gpus:
        return [not_applicable("gpu", "NVIDIA GPUs", facts.absent or "no GPUs")]
    names = ", ".join(f"GPU{g.index} {g.name or '?'}" for g in facts.gpus)
    summary = Check("gpu", "NVIDIA GPUs", PASS,
                    f"{names}; driver {facts.driver or '?'} (CUDA {facts.cuda_driver or '?'})",
                    data={"count": len(facts.gpus), "driver": facts.driver, "cuda_driver": facts.cuda_driver,
                          "names": [g.name for g in facts.gpus]})
    return [summary, check_pcie(facts), check_numa(host, facts), check_persistence(facts), check_allocator(host)]
