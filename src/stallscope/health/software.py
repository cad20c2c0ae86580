"""Software checks: thread settings, Pillow's JPEG library, fast decoders, and torch/CUDA/driver versions.

These run on every ``stallscope run`` (through ``quick_checks``), so nothing here imports torch, torchvision or
OpenCV: versions come from package metadata and ``torch/version.py`` read as text, decoders from ``find_spec``.
Libraries the process has already imported are asked directly, since that costs nothing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from stallscope.health.checks import FAIL, PASS, WARN, Check, not_applicable, unknown
from stallscope.health.host import Host, SourceError

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

#: Oldest driver (major, minor) that runs any toolkit of a CUDA major version (CUDA minor-version compatibility).
MIN_DRIVER_FOR_CUDA: dict[int, tuple[int, int]] = {11: (450, 80), 12: (525, 60), 13: (580, 65)}

#: module name -> what users know it as; each decodes JPEG faster than stock Pillow in a DataLoader worker.
FAST_DECODERS: dict[str, str] = {
    "simplejpeg": "simplejpeg",
    "turbojpeg": "PyTurboJPEG",
    "cv2": "OpenCV",
    "nvidia.dali": "DALI",
    "torchvision": "torchvision.io",
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_threads(host: Host, usable_cpus: int | None) -> Check:
    title = "thread settings"
    why = ("Each worker process runs its own OpenMP/MKL/OpenCV thread pool; pools sized to the whole machine in every "
           "worker oversubscribe the CPUs and turn decode time into context switches.")
    env = {var: host.environ.get(var) for var in THREAD_VARS}
    parts = [f"{var.split('_')[0]}={val if val is not None else 'unset'}" for var, val in env.items()]
    data: dict[str, object] = {"env": env, "usable_cpus": usable_cpus}
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and hasattr(torch_mod, "get_num_threads"):
        data["torch_threads"] = torch_mod.get_num_threads()
        parts.append(f"torch={data['torch_threads']}")
    cv2_mod = sys.modules.get("cv2")
    if cv2_mod is not None and hasattr(cv2_mod, "getNumThreads"):
        data["opencv_threads"] = cv2_mod.getNumThreads()
        parts.append(f"OpenCV={data['opencv_threads']}")
    elif _installed("cv2"):
        parts.append("OpenCV=not imported (its default: a thread per CPU)")
    value = ", ".join(parts)
    threshold = f"each <= usable CPUs ({usable_cpus})" if usable_cpus else "each <= usable CPUs"
    too_many = []
    for var, val in env.items():
        if val is None:
            continue
        try:
            if usable_cpus is not None and int(val) > usable_cpus:
                too_many.append(f"{var}={val}")
        except ValueError:
            too_many.append(f"{var}={val!r} (not a number)")
    torch_threads = data.get("torch_threads")
    if isinstance(torch_threads, int) and usable_cpus is not None and torch_threads > usable_cpus:
        too_many.append(f"torch.get_num_threads()={torch_threads}")
    cv_fix = " With OpenCV in workers, call cv2.setNumThreads(1) in worker_init_fn." if _installed("cv2") else ""
    if too_many:
        return Check("threads", title, WARN, value, threshold, why,
                     f"Lower {', '.join(too_many)} to at most {usable_cpus}.{cv_fix}", data)
    return Check("threads", title, PASS, value, threshold, why, cv_fix.strip(), data)


def check_pillow_jpeg() -> Check:
    title = "Pillow's JPEG library"
    why = ("torchvision's ImageFolder decodes with Pillow; Pillow built against libjpeg-turbo decodes JPEG 2-6x "
           "faster than plain libjpeg (SIMD Huffman and IDCT).")
    if not _installed("PIL"):
        return not_applicable("decode.pillow_jpeg", title, "Pillow is not installed")
    try:
        import PIL
        from PIL import features
    except Exception as exc:  # a broken Pillow install must not stop the doctor
        return unknown("decode.pillow_jpeg", title, f"importing Pillow failed: {exc}", why=why)
    turbo = features.check_feature("libjpeg_turbo")
    version = features.version("jpg")
    simd = ".post" in PIL.__version__
    value = f"Pillow{'-SIMD' if simd else ''} {PIL.__version__}, libjpeg {version or 'missing'}"
    data: dict[str, Any] = {"pillow": PIL.__version__, "libjpeg": version, "libjpeg_turbo": turbo, "pillow_simd": simd}
    if version is None:
        return Check("decode.pillow_jpeg", title, FAIL, value, "JPEG support with libjpeg-turbo", why,
                     "Reinstall Pillow from a wheel (pip install --force-reinstall pillow): this build cannot read "
                     "JPEG.",
                     data)
    if turbo is None:
        return unknown("decode.pillow_jpeg", title, "this Pillow cannot tell whether it uses libjpeg-turbo", why=why,
                       **data)
    if turbo:
        return Check("decode.pillow_jpeg", title, PASS, value + " (libjpeg-turbo)", "libjpeg-turbo", why, "", data)
    return Check("decode.pillow_jpeg", title, WARN, value + " (not libjpeg-turbo)", "libjpeg-turbo", why,
                 "pip install --force-reinstall pillow (PyPI wheels bundle libjpeg-turbo), or decode with simplejpeg.",
                 data)


def check_decoders() -> Check:
    title = "fast decoders installed"
    why = ("When decode is the bottleneck, a faster decoder (simplejpeg, PyTurboJPEG with DCT-domain downscale, "
           "OpenCV, or GPU decode with DALI / torchvision.io.decode_jpeg on cuda) is the cheapest fix.")
    found = {label: _installed(module) for module, label in FAST_DECODERS.items()}
    value = ", ".join(f"{label} {'yes' if ok else 'no'}" for label, ok in found.items())
    cpu_fast = [label for label in ("simplejpeg", "PyTurboJPEG", "OpenCV", "DALI") if found[label]]
    data = {"installed": found}
    if cpu_fast:
        return Check("decode.fast_decoders", title, PASS, value, "one beyond Pillow", why, "", data)
    return Check("decode.fast_decoders", title, WARN, value, "one beyond Pillow", why,
                 "pip install 'stallscope[data]' (simplejpeg, OpenCV) and let `stallscope bench` race them on your "
                 "files.",
                 data)


def torch_cuda_build() -> tuple[str | None, str | None, str | None]:
    """(torch version, CUDA version it was built for or None for CPU/ROCm builds, HIP version), without importing
    torch."""
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and hasattr(torch_mod, "version"):
        v = torch_mod.version
        return str(torch_mod.__version__), getattr(v, "cuda", None), getattr(v, "hip", None)
    version = _dist_version("torch")
    if version is None:
        return None, None, None
    try:
        spec = importlib.util.find_spec("torch")
        origin = Path(spec.origin) if spec and spec.origin else None
        text = (origin.parent / "version.py").read_text() if origin else ""
    except (ImportError, OSError, ValueError):
        text = ""
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*'([^']+)'", text, re.M)
    hip = re.search(r"^hip\s*(?::[^=]*)?=\s*'([^']+)'", text, re.M)
    return version, cuda.group(1) if cuda else None, hip.group(1) if hip else None


def driver_version(host: Host) -> str | None:
    """The NVIDIA kernel driver version from ``/proc/driver/nvidia/version``; None when no driver is loaded.

    Raises ``SourceError`` when the file exists but cannot be read or parsed: that is not "no driver".
    """
    path = "/proc/driver/nvidia/version"
    if not host.exists(path):
        if host.exists("/dev/nvidiactl") or any(n.startswith("nvidia") and n[6:].isdigit()
                                                 for n in host.listdir("/dev")):
            # a sandbox or a container can pass the GPU through without the driver's /proc files
            raise SourceError(path, f"an NVIDIA device is present but {path} is not (a container or sandbox): "
                                    "stallscope doctor reads the driver through NVML")
        return None
    text = host.read(path)
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    if not m:
        raise SourceError(path, f"{path} names no driver version")
    return m.group(1)


def _major_minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_versions(host: Host, driver: str | None = None, driver_cuda: str | None = None) -> Check:
    """torch's CUDA build against the driver: a toolkit newer than the driver fails at the first CUDA call."""
    title = "torch / CUDA / driver versions"
    why = ("A CUDA build of torch needs a driver at least as new as its CUDA major version; a CPU-only torch on a GPU "
           "machine trains on the CPU without an error.")
    torch_version, cuda, hip = torch_cuda_build()
    if torch_version is None:
        return not_applicable("versions", title, "torch is not installed in this Python")
    if driver is None:
        try:
            driver = driver_version(host)
        except SourceError as exc:
            return unknown("versions", title, exc.reason, why=why, torch=torch_version, torch_cuda=cuda)
    tv = _dist_version("torchvision")
    build = f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else "CPU-only"
    value = f"torch {torch_version} ({build}), torchvision {tv or 'not installed'}, "
    value += f"driver {driver}" + (f" (CUDA {driver_cuda})" if driver_cuda else "") if driver else "no NVIDIA driver"
    data: dict[str, Any] = {"torch": torch_version, "torch_cuda": cuda, "torch_hip": hip, "torchvision": tv,
                            "driver": driver, "driver_cuda": driver_cuda}
    threshold = "driver supports torch's CUDA major version"
    if driver is None:
        return Check("versions", title, PASS, value, threshold, why, "", data)
    if cuda is None and hip is None:
        return Check("versions", title, FAIL, value, threshold, why,
                     "Install a CUDA build of torch (pip install torch --index-url "
                     "https://download.pytorch.org/whl/cu126 or the one matching your driver).", data)
    if cuda is None:
        return Check("versions", title, PASS, value, threshold, why, "", data)
    need = _major_minor(cuda)
    have_cuda = _major_minor(driver_cuda) if driver_cuda else None
    have_drv = _major_minor(driver)
    fix = "Update the NVIDIA driver, or install a torch build for an older CUDA."
    if need and have_cuda:
        if need[0] > have_cuda[0]:
            return Check("versions", title, FAIL, value, threshold, why, fix, data)
        if need > have_cuda:
            return Check("versions", title, WARN, value, "driver CUDA >= torch CUDA", why,
                         fix + " (minor-version compatibility works, but without PTX JIT)", data)
        return Check("versions", title, PASS, value, threshold, why, "", data)
    if need and have_drv and need[0] in MIN_DRIVER_FOR_CUDA:
        minimum = MIN_DRIVER_FOR_CUDA[need[0]]
        status = PASS if have_drv >= minimum else FAIL
        return Check("versions", title, status, value, f"driver >= {minimum[0]}.{minimum[1]} for CUDA {need[0]}.x",
                     why, "" if status == PASS else fix, data)
    return unknown("versions", title, f"no rule for torch CUDA {cuda} with driver {driver}", why=why, **data)


def software_checks(host: Host, usable_cpus: int | None, driver_cuda: str | None = None,
                    driver: str | None = None) -> list[Check]:
    return [check_threads(host, usable_cpus), check_pillow_jpeg(), check_decoders(),
            check_versions(host, driver=driver, driver_cuda=driver_cuda)]

