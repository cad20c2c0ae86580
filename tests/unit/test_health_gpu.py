"""GPU checks through a fake NVML module: PCIe, NUMA, persistence, errors; one real-GPU test, skipped without one."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from stallscope.health import gpu, quick_checks
from stallscope.health.host import Host, parse_cpulist


def put(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


class NVMLError(Exception):
    pass


class FakeNVML:
    """The subset of pynvml the doctor calls; each device is a dict, a missing key raises NVMLError (NotSupported)."""

    NVMLError = NVMLError

    def __init__(self, devices: list[dict], init_error: Exception | None = None, numa_api: bool = False) -> None:
        self.devices = devices
        self.init_error = init_error
        self.inits = self.shutdowns = 0
        if numa_api:
            self.nvmlDeviceGetNumaNodeId = lambda h: self._get(h, "numa")

    def _get(self, handle: int, key: str):
        if key not in self.devices[handle]:
            raise NVMLError("Not Supported")
        return self.devices[handle][key]

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self._get(h, "name")

    def nvmlDeviceGetPciInfo(self, h: int):
        return SimpleNamespace(busId=self._get(h, "bus"))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._get(h, "curr_gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._get(h, "max_gen")

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: int) -> int:
        return self._get(h, "gpu_max_gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._get(h, "curr_width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._get(h, "max_width")

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return self._get(h, "persistence")


def healthy(bus: str, **over) -> dict:
    dev = {"name": b"NVIDIA H100 80GB HBM3", "bus": bus, "curr_gen": 5, "max_gen": 5, "gpu_max_gen": 5,
           "curr_width": 16, "max_width": 16, "persistence": 1}
    dev.update(over)
    return dev


def two_socket(root: Path, process_cpus: str = "0-7") -> Host:
    put(root, "/proc/self/status", f"Cpus_allowed_list:\t{process_cpus}\n")
    put(root, "/sys/devices/system/node/node0/cpulist", "0-7\n")
    put(root, "/sys/devices/system/node/node1/cpulist", "8-15\n")
    put(root, "/sys/bus/pci/devices/0000:1b:00.0/numa_node", "0\n")
    put(root, "/sys/bus/pci/devices/0000:9a:00.0/numa_node", "1\n")
    put(root, "/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n")
    return Host(root, environ={})


def by_id(checks) -> dict:
    return {c.id: c for c in checks}


def test_healthy_gpus_on_the_right_node(tmp_path: Path) -> None:
    host = two_socket(tmp_path, process_cpus="0-7")
    nvml = FakeNVML([healthy("00000000:1B:00.0")])
    facts = gpu.read_gpus(host, nvml)
    assert nvml.inits == nvml.shutdowns == 1
    assert facts.driver == "550.54.15" and facts.cuda_driver == "12.4"
    checks = by_id(gpu.gpu_checks(host, facts))
    assert checks["gpu"].status == "pass" and "H100" in checks["gpu"].value
    assert checks["gpu.pcie"].status == "pass" and "Gen5 x16" in checks["gpu.pcie"].value
    assert "63 GB/s" in checks["gpu.pcie"].value
    assert checks["gpu.numa"].status == "pass"
    assert checks["gpu.numa"].data["gpus"] == [{"index": 0, "node": 0}]
    assert checks["gpu.persistence"].status == "pass"
    assert checks["gpu.allocator"].value == "unset (PyTorch defaults)"


def test_degraded_link_far_node_and_persistence_off(tmp_path: Path) -> None:
    host = two_socket(tmp_path, process_cpus="0-7")
    nvml = FakeNVML([healthy("00000000:1B:00.0", curr_width=8),
                     healthy("00000000:9A:00.0", max_gen=3, curr_gen=3, persistence=0)])
    checks = by_id(gpu.gpu_checks(host, gpu.read_gpus(host, nvml)))
    pcie = checks["gpu.pcie"]
    assert pcie.status == "warn"
    assert "trained at x8 of x16" in pcie.value and "slot limits a Gen5 GPU to Gen3" in pcie.value
    assert pcie.data["gpus"][1]["max_gen"] == 3
    assert checks["gpu.numa"].status == "fail"  # GPU1 lives on node 1, the process only on node 0
    assert "numactl" in checks["gpu.numa"].fix
    assert checks["gpu.persistence"].status == "warn" and "GPU1 off" in checks["gpu.persistence"].value


def test_idle_generation_drop_is_not_a_problem(tmp_path: Path) -> None:
    host = two_socket(tmp_path)
    checks = by_id(gpu.gpu_checks(host, gpu.read_gpus(host, FakeNVML([healthy("00000000:1B:00.0", curr_gen=1)]))))
    assert checks["gpu.pcie"].status == "pass" and "idle" in checks["gpu.pcie"].value


def test_numa_api_preferred_over_sysfs(tmp_path: Path) -> None:
    host = two_socket(tmp_path, process_cpus="0-15")
    nvml = FakeNVML([healthy("00000000:1B:00.0", numa=1)], numa_api=True)
    check = by_id(gpu.gpu_checks(host, gpu.read_gpus(host, nvml)))["gpu.numa"]
    assert check.data["gpus"] == [{"index": 0, "node": 1}]
    assert check.status == "warn"  # half of the process's CPUs are on the far node


def test_unsupported_queries_are_unknown_not_crashes(tmp_path: Path) -> None:
    host = two_socket(tmp_path)
    dev = healthy("00000000:1B:00.0")
    for key in ("curr_width", "max_width", "persistence", "bus"):
        del dev[key]
    checks = by_id(gpu.gpu_checks(host, gpu.read_gpus(host, FakeNVML([dev]))))
    assert checks["gpu.pcie"].status == "unknown" and "Not Supported" in checks["gpu.pcie"].value
    assert checks["gpu.persistence"].status == "unknown"
    assert checks["gpu.numa"].status == "unknown"


def test_sysfs_numa_unreadable_is_unknown(tmp_path: Path) -> None:
    two_socket(tmp_path)
    denied = Host(tmp_path, environ={}, opener=lambda p: (_ for _ in ()).throw(PermissionError(13, "denied"))
                  if p.name == "numa_node" else p.read_text())
    check = by_id(gpu.gpu_checks(denied, gpu.read_gpus(denied, FakeNVML([healthy("00000000:1B:00.0")]))))["gpu.numa"]
    assert check.status == "unknown" and "permission denied" in check.value


def test_no_driver_is_not_applicable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = Host(tmp_path, environ={})

    def no_pynvml():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu, "load_nvml", no_pynvml)
    assert [c.status for c in gpu.gpu_checks(host, gpu.read_gpus(host))] == ["n/a"]
    failing = FakeNVML([], init_error=NVMLError("Driver Not Loaded"))
    assert [c.status for c in gpu.gpu_checks(host, gpu.read_gpus(host, failing))] == ["n/a"]


def test_driver_without_nvml_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = two_socket(tmp_path)

    def no_pynvml():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu, "load_nvml", no_pynvml)
    checks = gpu.gpu_checks(host, gpu.read_gpus(host))
    assert [c.status for c in checks] == ["unknown"] and "nvidia-ml-py" in checks[0].value
    failing = FakeNVML([], init_error=NVMLError("Insufficient Permissions"))
    checks = gpu.gpu_checks(host, gpu.read_gpus(host, failing))
    assert checks[0].status == "unknown" and "Insufficient Permissions" in checks[0].value


def test_allocator_env(tmp_path: Path) -> None:
    host = Host(tmp_path, environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    check = gpu.check_allocator(host)
    assert check.value == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" and check.fix == ""


def test_sysfs_bus_id() -> None:
    assert gpu.sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"


def test_quick_checks_include_gpu_only_when_given_nvml(tmp_path: Path) -> None:
    host_root = two_socket(tmp_path).root
    without = {c.id for c in quick_checks(root=host_root, environ={})}
    assert not any(i.startswith("gpu") for i in without)
    with_gpu = by_id(quick_checks(root=host_root, environ={}, nvml=FakeNVML([healthy("00000000:1B:00.0")])))
    assert with_gpu["gpu.pcie"].status == "pass"
    assert with_gpu["versions"].data["driver_cuda"] == "12.4"


def _real_nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception:
        return None
    return pynvml if count else None


@pytest.mark.gpu
@pytest.mark.skipif(_real_nvml() is None, reason="needs an NVIDIA GPU and nvidia-ml-py")
def test_real_gpu_pcie_and_numa_are_read() -> None:
    """On whatever GPU machine this runs (a sandboxed one may answer few PCIe queries and show no NUMA nodes in
    sysfs), each check's status follows from the machine's own facts, read here apart from the checks' code."""
    host = Host()
    facts = gpu.read_gpus(host)
    assert facts.gpus and facts.error is None
    first = facts.gpus[0]
    readable = [g for g in facts.gpus if all(g.pcie.get(k) is not None for k in ("max_gen", "max_width", "curr_width"))]
    for g in readable:
        assert g.pcie["max_gen"] in gpu.PCIE_GBPS_PER_LANE and g.pcie["max_width"] >= 1
    assert first.numa_node is not None or first.numa_error
    checks = by_id(gpu.gpu_checks(host, facts))
    widths = [(g.pcie["curr_width"], g.pcie["max_width"]) for g in readable]
    slots = [(g.pcie["max_gen"], g.pcie.get("gpu_max_gen")) for g in readable]
    degraded = any(c < m for c, m in widths) or any(g is not None and m < g for m, g in slots)
    pcie = "warn" if degraded else "unknown" if len(readable) < len(facts.gpus) else "pass"
    assert checks["gpu.pcie"].status == pcie, checks["gpu.pcie"].value
    node_dir = "/sys/devices/system/node"
    nodes = [n for n in os.listdir(node_dir) if n.startswith("node") and n[4:].isdigit()] \
        if os.path.isdir(node_dir) else []
    numa = checks["gpu.numa"]
    cpulist = f"{node_dir}/node{first.numa_node}/cpulist"
    if len(nodes) == 1:
        assert numa.status == "n/a"
    elif len(facts.gpus) > 1:
        assert [row["node"] for row in numa.data["gpus"]] == [g.numa_node for g in facts.gpus
                                                               if g.numa_node is not None]
    elif first.numa_node is None or (first.numa_node >= 0 and not os.path.exists(cpulist)):
        assert numa.status == "unknown", numa.value
    elif first.numa_node < 0:
        assert numa.status == "n/a", numa.value
    else:
        with open(cpulist) as fh:
            node_cpus = parse_cpulist(fh.read())
        cpus = os.sched_getaffinity(0)
        local = len(cpus & node_cpus)
        assert numa.status == ("pass" if local == len(cpus) else "fail" if local == 0 else "warn")
