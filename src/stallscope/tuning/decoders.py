"""``stallscope bench --decoders DIR``: a JPEG decoder race on the user's own files, on one core.

The race runs in a child process pinned to a single CPU with every library told to use one
thread, so the figures are per-core rates a DataLoader worker would see. Each decoder decodes
the same in-memory files; the rate is the median of repeats. DCT-scaled variants (1/2, 1/4,
1/8) decode at reduced size inside the IDCT, which is what a crop much larger than the model's
input can use. nvJPEG (torchvision.io on the GPU) joins when a GPU is present; it is not
single-core and is labelled so.

stallscope's own TurboJPEG 3 binding (:mod:`stallscope.data.turbo`, extra ``turbo``) races at
full size and at each DCT scale, with the fast IDCT ("turbojpeg-fast", what ``FastImageFolder``
picks) and the accurate one, wherever its library loads; like every other missing library, an
absent one just leaves its rows out. Its real advantage is the region decode, which no full-image
row shows, so one more row decodes what the fast path decodes for an average RandomResizedCrop:
the centre region of half the image's area (:func:`crop_plan`), at the DCT scale the fast path
picks for it. That row is labelled a crop; its rate is images per second *of that crop*, so it
reads against the full-image rows as the cost of a training sample, not of a whole decode.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stallscope.data.crops import CropPlan

JPEG_SUFFIXES = (".jpg", ".jpeg", ".JPG", ".JPEG")
SCALES = (2, 4, 8)
#: The crop row's region: RandomResizedCrop's scale range (0.08, 1) averages about half the area.
CROP_AREA = 0.5
#: ... and the output it is resized to, which bounds the DCT scale (the crop stays at least this size).
CROP_OUTPUT = 224


@dataclass(frozen=True)
class DecoderRace:
    folder: str
    files: int
    megapixels: float  # mean size of the files
    cpu: int | None
    results: list[dict[str, Any]] = field(default_factory=list)  # decoder, scale, images_per_s, error
    skipped: list[dict[str, str]] = field(default_factory=list)  # path, error: files Pillow cannot decode

    def ranked(self) -> list[dict[str, Any]]:
        return sorted((r for r in self.results if r.get("images_per_s")), key=lambda r: -r["images_per_s"])

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "stallscope.decoder-race/1", "folder": self.folder, "files": self.files,
                "megapixels": self.megapixels, "cpu": self.cpu, "results": self.results, "skipped": self.skipped}


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
    """Race the installed decoders on up to ``files`` JPEGs of ``folder`` in a single-core child.

    Files Pillow cannot decode whole (empty, truncated, not a JPEG inside), and paths that are no regular file (a
    device, a FIFO), are left out of the race and listed in ``skipped``: one bad file in a dataset is common, and it
    says nothing about the decoders."""
    root = Path(folder)
    if not root.exists():
        raise FileNotFoundError(f"no such folder: {folder}")
    if not root.is_dir():
        raise FileNotFoundError(f"not a folder: {folder} (give the folder that holds the JPEGs)")
    paths = find_jpegs(root, files)
    if not paths:
        raise FileNotFoundError(f"no JPEG files under {folder}")
    try:
        cpu: int | None = max(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpu = None
    request = {"files": [str(p) for p in paths], "repeats": repeats, "min_seconds": min_seconds, "cpu": cpu}
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENCV_FOR_THREADS_NUM="1")
    proc = subprocess.run([sys.executable, "-c", "from stallscope.tuning.decoders import _child; _child()"],
                          input=json.dumps(request), capture_output=True, text=True, timeout=timeout_s, env=env,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"decoder race failed: {proc.stderr.strip()[-500:]}")
    data = json.loads(proc.stdout)
    skipped = data.get("skipped", [])
    if len(skipped) == len(paths):
        first = skipped[0]
        raise RuntimeError(f"none of the {len(paths)} JPEG files under {folder} could be decoded "
                           f"(first: {first['path']}: {first['error']})")
    return DecoderRace(folder=str(folder), files=len(paths) - len(skipped), megapixels=data["megapixels"], cpu=cpu,
                       results=data["results"], skipped=skipped)


def crop_plan(width: int, height: int) -> CropPlan:
    """The crop row's region of a ``width`` x ``height`` image: centred, half its area, its aspect ratio.

    A fixed region rather than random ones, so every decoder-race run decodes the same pixels.
    """
    from stallscope.data.crops import CropPlan

    side = math.sqrt(CROP_AREA)
    w, h = max(1, round(width * side)), max(1, round(height * side))
    return CropPlan((width - w) // 2, (height - h) // 2, w, h, CROP_OUTPUT, CROP_OUTPUT)


def crop_scale(sizes: Sequence[tuple[int, int]]) -> int:
    """The crop row's DCT scale: the fast path's choice (:meth:`CropPlan.dct_scale`) for every file's region.

    One scale for the row, so its ``scale`` column is true: in a folder of one size it is the fast
    path's, in a mixed folder the smallest of theirs (the row can then only understate the fast path).
    """
    return min((crop_plan(w, h).dct_scale() for w, h in sizes), default=1)


def _contenders(sizes: Sequence[tuple[int, int]]) -> list[tuple[str, int, Callable[[bytes, int, int], Any]]]:
    """(decoder, scale, decode(data, width, height)) for every installed backend and scale.

    ``sizes`` are the (width, height) of the files, from which the crop row takes its DCT scale.
    """
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
            if fast:  # the fast path's decoder, on the fast path's region
                from stallscope.data.cropdecode import scaled_box

                region_scale = crop_scale(sizes)

                def tj_crop(data: bytes, w: int, h: int, s: int = region_scale, turbo: Any = turbo) -> Any:
                    # as decode_jpeg_crop does it, less the resize: the box in the scaled image, then its region
                    box = scaled_box(crop_plan(w, h), w, h, -(-w // s), -(-h // s))
                    return turbo.decode_region(data, w, h, s, box)[0]

                out.append((f"{turbo.name} crop (centre, {CROP_AREA:.0%} of area)", region_scale, tj_crop))
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
    from PIL import Image, UnidentifiedImageError

    from stallscope.data.files import describe, read_regular

    blobs = []
    skipped = []
    for path in request["files"]:
        try:
            data = read_regular(path)  # a device or a FIFO named *.jpg is named, never read to its end or waited on
        except OSError as exc:
            skipped.append({"path": path, "error": describe(exc)})
            continue
        try:
            with Image.open(io.BytesIO(data)) as img:
                img.load()  # a truncated file opens; it fails here, as it would in every decoder's row
                blobs.append((data, img.width, img.height))
        except UnidentifiedImageError:  # its message names an in-memory buffer, not the file
            skipped.append({"path": path, "error": "not an image Pillow can identify"})
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            skipped.append({"path": path, "error": f"{type(exc).__name__}: {exc}"[:200]})
    if not blobs:
        json.dump({"megapixels": 0.0, "results": [], "skipped": skipped}, sys.stdout)
        return
    results = []
    for name, scale, fn in _contenders([(w, h) for _, w, h in blobs]):
        entry: dict[str, Any] = {"decoder": name, "scale": scale, "images_per_s": None, "error": None}
        try:
            entry["images_per_s"] = round(_measure(fn, blobs, request["repeats"], request["min_seconds"]), 2)
        except Exception as exc:  # noqa: BLE001 - one decoder failing on these files is a row, not the race
            entry["error"] = f"{type(exc).__name__}: {exc}"[:200]
        results.append(entry)
    mp = sum(w * h for _, w, h in blobs) / len(blobs) / 1e6
    json.dump({"megapixels": round(mp, 3), "results": results, "skipped": skipped}, sys.stdout)


__all__ = ["DecoderRace", "crop_plan", "crop_scale", "find_jpegs", "race_decoders"]
