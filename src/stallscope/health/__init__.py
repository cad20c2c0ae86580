"""``stallscope doctor``: the machine, GPU and dataset around an input pipeline, checked in seconds.

Two entry points: ``run_doctor`` (everything, the ``doctor`` verb) and ``quick_checks`` (machine and software only,
under 0.3 s, attached to every ``run`` so the diagnosis can cite them). Each finding is a ``Check`` with the
number behind it; a source that cannot be read gives status ``unknown`` with the reason, never a guess.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stallscope.health.checks import (
    DOCTOR_SCHEMA,
    FAIL,
    NA,
    PASS,
    STATUSES,
    UNKNOWN,
    WARN,
    Check,
    DoctorReport,
    not_applicable,
)
from stallscope.health.cpu_probe import PROBE_S, check_cpu_capacity
from stallscope.health.dataset import BenchOptions, dataset_checks
from stallscope.health.gpu import GpuFacts, gpu_checks, read_gpus
from stallscope.health.host import Host
from stallscope.health.software import software_checks
from stallscope.health.system import LoaderAssumptions, effective_memory, machine_checks, usable_cpu_count


def _host(root: str | os.PathLike[str], environ: Mapping[str, str] | None) -> Host:
    return Host(Path(root), dict(environ) if environ is not None else dict(os.environ))


def validate_data_dir(data_dir: str | os.PathLike[str]) -> Path:
    """The dataset folder, or an ``OSError`` subclass whose message the CLI prints as is."""
    path = Path(data_dir).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"dataset folder {str(path)!r} does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"{str(path)!r} is a file, not a folder: pass the folder the DataLoader reads")
    try:
        with os.scandir(path) as it:
            next(it, None)
    except PermissionError:
        raise PermissionError(f"dataset folder {str(path)!r} cannot be listed: permission denied") from None
    except OSError as exc:
        raise OSError(f"dataset folder {str(path)!r} cannot be listed: {exc.strerror or exc}") from None
    return path


def quick_checks(*, root: str | os.PathLike[str] = "/", nvml: Any | None = None,
                 environ: Mapping[str, str] | None = None, loader: LoaderAssumptions | None = None) -> list[Check]:
    """Machine and software checks cheap enough for every run: no dataset, no benchmark, no torch import.

    GPU checks are included only when an NVML module is passed (the launcher's sampler already holds one):
    initializing NVML here would cost more than the rest together on a machine without persistence mode.
    """
    host = _host(root, environ)
    checks = machine_checks(host, loader)
    facts: GpuFacts | None = read_gpus(host, nvml) if nvml is not None else None
    if facts is not None:
        checks.extend(gpu_checks(host, facts))
    checks.extend(software_checks(host, usable_cpu_count(host), driver_cuda=facts.cuda_driver if facts else None,
                                  driver=facts.driver if facts else None))
    return checks


def run_doctor(data_dir: str | os.PathLike[str] | None = None, *, root: str | os.PathLike[str] = "/",
               nvml: Any | None = None, gpu: bool = True, bench_seconds: float = 3.0, bench_fraction: float = 0.05,
               bench_max_bytes: int = 256 << 20, loader: LoaderAssumptions | None = None,
               environ: Mapping[str, str] | None = None, cpu_probe_seconds: float = 0.0) -> DoctorReport:
    """All checks: machine (with the CPU capacity probe), GPU (NVML, imported lazily unless ``nvml`` is given),
    software, and the dataset.

    ``bench_seconds <= 0`` skips the storage micro-benchmark. ``cpu_probe_seconds``: how long each of the CPU
    probe's 6 busy loops runs (``PROBE_S``, 0.5, in ``stallscope doctor``); off by default here, as the probe forks
    (a caller's threads and locks are copied into each child). Raises ``OSError`` for a bad ``data_dir``.
    """
    start = time.perf_counter()
    folder = validate_data_dir(data_dir) if data_dir is not None else None
    host = _host(root, environ)
    checks = machine_checks(host, loader)
    checks.append(check_cpu_capacity(host, cpu_probe_seconds))
    facts = read_gpus(host, nvml) if gpu else GpuFacts(absent="GPU checks disabled")
    checks.extend(gpu_checks(host, facts))
    checks.extend(software_checks(host, usable_cpu_count(host), driver_cuda=facts.cuda_driver, driver=facts.driver))
    if folder is None:
        checks.append(not_applicable("dataset", "dataset", "no DATA_DIR given: pass one to check its layout, file "
                                     "system and storage speed"))
    else:
        _, memory, _ = effective_memory(host)
        options = BenchOptions(bench_seconds, bench_fraction, bench_max_bytes)
        data_checks, _, _ = dataset_checks(host, str(folder), memory, options)
        checks.extend(data_checks)
    return DoctorReport(tuple(checks), str(folder) if folder else None, time.perf_counter() - start)


__all__ = [
    "DOCTOR_SCHEMA", "FAIL", "NA", "PASS", "PROBE_S", "STATUSES", "UNKNOWN", "WARN", "BenchOptions", "Check",
    "DoctorReport",
    "Host", "LoaderAssumptions", "quick_checks", "run_doctor", "validate_data_dir",
]
