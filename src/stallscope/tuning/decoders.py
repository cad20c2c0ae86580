"""``stallscope bench --decoders DIR``: a JPEG decoder race on the user's own files, on one core.

The race runs in a child process pinned to a single CPU with every library told to use one
thread, so the figures are per-core rates a DataLoader worker would see. Each decoder decodes
the same in-memory files; the rate is the median of repeats. DCT-scaled variants (1/2, 1/4,
1/8) decode at reduced size inside the IDCT, which is what a crop much larger than the model's
input can use. nvJPEG (torchvision.io on the GPU) joins when a GPU is present; it is not
single-core and is labelled so.
"""

from __future__ import annotations

import io
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JPEG_SUFFIXES = (".jpg", ".jpeg", ".JPG", ".JPEG")
SCALES = (2, 4, 8)


@dataclass(frozen=True)
class DecoderRace:
    folder: str
    files: int
    megapixels: float  # mean size of the files
    cpu: int | None
    results: list[dict[str, Any]] = field(default_factory=list)  # decoder, scale, images_per_s, error

    def ranked(self) -> list[dict[str, Any]]:
        return sorted((r for r in self.results if r.get("images_per_s")), key=lambda r: -r["images_per_s"])

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "stallscope.decoder-race/1", "folder": self.folder, "files": self.files,
                "megapixels": self.megapixels, "cpu": self.cpu, "results": self.results}


def find_jpegs(folder: Path, limit: int) -> list[Path]:
    found: list[Path] = []
    for root, _dirs, names in os.walk(folder):
        for name in sorted(names):
            if name.endswith(JPEG_SUFFIXES):
                found.append(Path(root) / name)
                if len(found) >= limit:
                    return found
    return found


def race_decoders(folder: str | os.PathLike[str], *, files: int = 64, repeats: int = 3, min_seconds: float = 0.3,
                  timeout_s: float = 600.0) -> DecoderRace:
    """Race the installed decoders on up to ``files`` JPEGs of ``folder`` in a single-core child."""
    paths = find_jpegs(Path(folder), files)
    if not paths:
        raise FileNotFoundError(f"no JPEG files under {folder}")
    try:
        cpu: int | None = sorted(os.sched_getaffinity(0))[-1]
    except (AttributeError, OSError):
        cpu = None
    request = {"files": [str(p) for p in paths], "repeats": repeats, "min_seconds": min_seconds, "cpu": cpu}
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENCV_FOR_THREADS_NUM="1")
    proc = subprocess.run([sys.executable, "-c", "from stallscope.tuning.decoders import _child; _child()"],
                          input=json.dumps(request), capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"decoder race failed: {proc.stderr.strip()[-500:]}")
    data = json.loads(proc.stdout)
    return DecoderRace(folder=str(folder), files=len(paths), megapixels=data["megapixels"], cpu=cpu,
                       results=data["results"])


def _contenders() -> list[tuple[str, int, Callable[[bytes, int, int], Any]]]:
    """(decoder, scale, decode(data, width, height)) for every installed backend and scale."""
    out: list[tuple[str, int, Callable[[bytes, int, int], Any]]] = []
    try:
        import numpy as np
        from PIL import Image

        def pillow(data: bytes, w: int, h: int) -> Any:
            return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

        out.append(("pillow", 1, pillow))
        for s in SCALES:
            def pillow_draft(data: bytes, w: int, h: int, s: int = s) -> Any:
                img = Image.open(io.BytesIO(data))
                img.draft("RGB", (math.ceil(w / s), math.ceil(h / s)))
                return np.asarray(img.convert("RGB"))

            out.append(("pillow+draft", s, pillow_draft))
    except ImportError:
        pass
    try:
        import cv2
        import numpy as np

        cv2.setNumThreads(1)
        flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
                 8: cv2.IMREAD_REDUCED_COLOR_8}
        for s, flag in flags.items():
            def opencv(data: bytes, w: int, h: int, flag: int = flag) -> Any:
                return cv2.imdecode(np.frombuffer(data, np.uint8), flag)

            out.append(("opencv", s, opencv))
    except ImportError:
        pass
    try:
        import simplejpeg

        for s in (1, *SCALES):
            def sj(data: bytes, w: int, h: int, s: int = s) -> Any:
                return simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=math.ceil(w / s),
                                              min_height=math.ceil(h / s))

            out.append(("simplejpeg", s, sj))
    except ImportError:
        pass
    try:
        from stallscope.data.decoders import TurboJpegDecoder

        for fast in (True, False):
            turbo = TurboJpegDecoder(fast=fast)  # libjpeg-turbo 3 (extra ``turbo``): also decodes regions
            for s in (1, *SCALES):
                def tj(data: bytes, w: int, h: int, s: int = s, turbo: Any = turbo) -> Any:
                    return turbo.decode(data, w, h, s)

                out.append((turbo.name, s, tj))
    except (ImportError, OSError, RuntimeError, MemoryError, ValueError):  # no extra, no libturbojpeg 3 loads
        pass
    try:
        import torch
        from torchvision.io import decode_jpeg

        torch.set_num_threads(1)

        def tv(data: bytes, w: int, h: int) -> Any:
            return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8))

        out.append(("torchvision.io", 1, tv))
        if torch.cuda.is_available():
            def nvjpeg(data: bytes, w: int, h: int) -> Any:
                result = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), device="cuda")
                torch.cuda.synchronize()
                return result

            out.append(("nvjpeg (GPU)", 1, nvjpeg))
    except ImportError:
        pass
    return out


def _measure(fn: Callable[[bytes, int, int], Any], blobs: list[tuple[bytes, int, int]], repeats: int,
             min_seconds: float) -> float:
    for blob in blobs[:2]:
        fn(*blob)  # warm-up: library initialisation, first-call costs
    rates = []
    for _ in range(repeats):
        count = 0
        t0 = time.perf_counter()
        while True:
            for blob in blobs:
                fn(*blob)
            count += len(blobs)
            elapsed = time.perf_counter() - t0
            if elapsed >= min_seconds:
                break
        rates.append(count / elapsed)
    return statistics.median(rates)


def _child() -> None:
    request = json.loads(sys.stdin.read())
    if request.get("cpu") is not None:
        try:
            os.sched_setaffinity(0, {int(request["cpu"])})
        except (AttributeError, OSError):
            pass
    from PIL import Image

    blobs = []
    for path in request["files"]:
        data = Path(path).read_bytes()
        with Image.open(io.BytesIO(data)) as img:
            blobs.append((data, img.width, img.height))
    results = []
    for name, scale, fn in _contenders():
        entry: dict[str, Any] = {"decoder": name, "scale": scale, "images_per_s": None, "error": None}
        try:
            entry["images_per_s"] = round(_measure(fn, blobs, request["repeats"], request["min_seconds"]), 2)
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[:200]
        results.append(entry)
    mp = sum(w * h for _, w, h in blobs) / len(blobs) / 1e6
    json.dump({"megapixels": round(mp, 3), "results": results}, sys.stdout)


__all__ = ["DecoderRace", "find_jpegs", "race_decoders"]
