"""Thread settings, Pillow/decoder detection, and torch CUDA build vs driver rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stallscope.health import software
from stallscope.health.host import Host


def put(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


DRIVER_550 = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
              "GCC version:  gcc version 12.3.0\n")


def test_threads_oversubscribed_env_warns(tmp_path: Path) -> None:
    host = Host(tmp_path, environ={"OMP_NUM_THREADS": "64", "MKL_NUM_THREADS": "two"})
    check = software.check_threads(host, usable_cpus=8)
    assert check.status == "warn"
    assert "OMP_NUM_THREADS=64" in check.fix and "MKL_NUM_THREADS='two'" in check.fix
    assert check.data["env"]["OMP_NUM_THREADS"] == "64"


def test_threads_unset_passes(tmp_path: Path) -> None:
    check = software.check_threads(Host(tmp_path, environ={}), usable_cpus=8)
    assert check.status == "pass" and "OMP=unset" in check.value


def test_pillow_and_decoders_report_what_is_installed() -> None:
    pillow = software.check_pillow_jpeg()
    assert pillow.status in ("pass", "warn", "n/a")
    if pillow.status != "n/a":
        assert pillow.data["libjpeg"] is not None
    decoders = software.check_decoders()
    assert set(decoders.data["installed"]) == {"simplejpeg", "PyTurboJPEG", "OpenCV", "DALI", "torchvision.io"}


def test_driver_version_parse(tmp_path: Path) -> None:
    host = Host(tmp_path, environ={})
    assert software.driver_version(host) is None
    put(tmp_path, "/proc/driver/nvidia/version", DRIVER_550)
    assert software.driver_version(host) == "550.54.15"
    put(tmp_path, "/proc/driver/nvidia/version",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build\n")
    assert software.driver_version(host) == "580.65.06"


@pytest.fixture
def torch_build(monkeypatch: pytest.MonkeyPatch):
    def set_build(version: str | None, cuda: str | None, hip: str | None = None) -> None:
        monkeypatch.setattr(software, "torch_cuda_build", lambda: (version, cuda, hip))

    return set_build


@pytest.mark.parametrize("cuda, driver, driver_cuda, status", [
    ("12.4", "550.54.15", None, "pass"),       # table: 12.x needs >= 525.60
    ("12.4", "470.82.01", None, "fail"),
    ("13.0", "550.54.15", None, "fail"),
    ("12.4", "550.54.15", "12.4", "pass"),     # NVML's answer wins over the table
    ("12.6", "550.54.15", "12.4", "warn"),     # minor-version compatibility
    ("13.0", "550.54.15", "12.4", "fail"),
    (None, "550.54.15", None, "fail"),         # CPU-only torch on a GPU machine
    ("12.4", None, None, "pass"),              # no driver: nothing to compare
])
def test_versions_rules(tmp_path: Path, torch_build, cuda, driver, driver_cuda, status) -> None:
    torch_build("2.6.0", cuda)
    check = software.check_versions(Host(tmp_path, environ={}), driver=driver, driver_cuda=driver_cuda)
    assert check.status == status, check.value
    assert check.data["torch_cuda"] == cuda and check.data["driver"] == driver


def test_a_passed_through_gpu_without_the_drivers_proc_file_is_unknown_not_no_driver(tmp_path: Path,
                                                                                      torch_build) -> None:
    """A sandbox (gVisor) or container may show /dev/nvidia0 but not /proc/driver/nvidia: that is not "no driver"."""
    torch_build("2.11.0", "13.0")
    put(tmp_path, "/dev/nvidia0", "")
    check = software.check_versions(Host(tmp_path, environ={}))
    assert check.status == "unknown" and "NVIDIA device is present" in check.value


def test_versions_reads_driver_from_proc(tmp_path: Path, torch_build) -> None:
    torch_build("2.6.0", "12.4")
    put(tmp_path, "/proc/driver/nvidia/version", DRIVER_550)
    check = software.check_versions(Host(tmp_path, environ={}))
    assert check.status == "pass" and check.data["driver"] == "550.54.15"


def test_versions_without_torch_is_not_applicable(tmp_path: Path, torch_build) -> None:
    torch_build(None, None)
    assert software.check_versions(Host(tmp_path, environ={})).status == "n/a"


def test_versions_unknown_rule(tmp_path: Path, torch_build) -> None:
    torch_build("2.6.0", "10.2")
    check = software.check_versions(Host(tmp_path, environ={}), driver="550.54.15")
    assert check.status == "unknown"


def test_torch_build_matches_torch_without_importing_it() -> None:
    """torch_cuda_build reads torch/version.py as text; compare with torch's own answer in a fresh process."""
    pytest.importorskip("torch")
    code = ("import sys; from stallscope.health.software import torch_cuda_build; b = torch_cuda_build(); "
            "assert 'torch' not in sys.modules; import torch; print(b[1] == torch.version.cuda)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_unreadable_driver_file_is_unknown_not_no_driver(tmp_path: Path, torch_build) -> None:
    torch_build("2.6.0", "12.4")
    put(tmp_path, "/proc/driver/nvidia/version", DRIVER_550)

    def opener(path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    check = software.check_versions(Host(tmp_path, environ={}, opener=opener))
    assert check.status == "unknown" and "permission denied" in check.value
    put(tmp_path, "/proc/driver/nvidia/version", "something else\n")
    assert software.check_versions(Host(tmp_path, environ={})).status == "unknown"


def test_without_pillow_or_decoders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(software, "_installed", lambda module: False)
    assert software.check_pillow_jpeg().status == "n/a"
    decoders = software.check_decoders()
    assert decoders.status == "warn" and not any(decoders.data["installed"].values())
