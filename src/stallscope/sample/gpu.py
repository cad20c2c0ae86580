"""GPU facts through NVML (``nvidia-ml-py``), read from the launcher so the target never sees it.

Absent pieces are reported with the reason (no package, no driver, no device), never as zeros.
"""

from __future__ import annotations

from typing import Any


class GpuProbe:
    """Per-tick readings of every visible GPU; ``absent`` says why there are none."""

    def __init__(self, nvml: Any | None = None) -> None:
        self.nvml: Any = nvml  # the pynvml module (or a stand-in); None only until found or when absent
        self.handles: list[Any] = []
        self.absent: str | None = None
        self.names: list[str] = []
        if self.nvml is None:
            try:
                import pynvml  # from the nvidia-ml-py package
            except ImportError:
                self.absent = "nvidia-ml-py is not installed (pip install 'stallscope[gpu]')"
                return
            self.nvml = pynvml
        try:
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
        except Exception as exc:
            self.absent = f"NVML unavailable: {exc}"
            return
        if count == 0:
            self.absent = "NVML found no GPU"
            return
        self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        for handle in self.handles:
            name = self.nvml.nvmlDeviceGetName(handle)
            self.names.append(name.decode() if isinstance(name, bytes) else str(name))

    def read(self, with_pcie: bool = True) -> dict[str, list[float | None]]:
        """One reading per GPU: utilization %, memory used bytes, PCIe rx/tx bytes/s, SM clock MHz.

        NVML samples PCIe throughput over a window of its own (~20 ms per call), so the sampler asks
        for it only every few ticks (``with_pcie``); the other ticks hold None there (not measured)."""
        out: dict[str, list[float | None]] = {"util_percent": [], "mem_used_bytes": [], "pcie_rx_bytes_per_s": [],
                                              "pcie_tx_bytes_per_s": [], "sm_clock_mhz": []}
        for handle in self.handles:
            self._read_one(handle, with_pcie, out)
        return out

    def _read_one(self, handle: Any, with_pcie: bool, out: dict[str, list[float | None]]) -> None:
        """Appends one GPU's readings to ``out`` (its own function, so each reading's lambda has its own handle)."""
        nvml = self.nvml
        out["util_percent"].append(_try(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)))
        out["mem_used_bytes"].append(_try(lambda: float(nvml.nvmlDeviceGetMemoryInfo(handle).used)))
        out["pcie_rx_bytes_per_s"].append(_try(lambda: 1024.0 * nvml.nvmlDeviceGetPcieThroughput(
            handle, nvml.NVML_PCIE_UTIL_RX_BYTES)) if with_pcie else None)
        out["pcie_tx_bytes_per_s"].append(_try(lambda: 1024.0 * nvml.nvmlDeviceGetPcieThroughput(
            handle, nvml.NVML_PCIE_UTIL_TX_BYTES)) if with_pcie else None)
        out["sm_clock_mhz"].append(_try(lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))))

    def close(self) -> None:
        if self.handles:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass


def _try(read: Any) -> float | None:
    try:
        return read()
    except Exception:
        return None
