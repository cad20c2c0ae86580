"""Read, check and (optionally) shrink one source image; runs in the pack's worker processes.

Every image is decoded once here, fully, so a truncated or corrupt file is caught at pack
time and named in the report instead of crashing a training run hours later.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

from stallscope.data.crop_fit import CropFit
from stallscope.data.files import FileChangedError, NotRegularFileError, describe, read_regular
from stallscope.data.headers import HeaderError, jpeg_is_progressive, read_header

#: Problems that make a file unusable: skipped by default, fatal with ``--strict``. ``not-a-file``: a device,
#: FIFO, socket or folder (never opened); ``changed``: its size changed while it was read.
FATAL_KINDS = ("unreadable", "not-a-file", "changed", "empty", "not-an-image", "corrupt")

_EXT_FORMATS = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png", ".webp": "webp", ".bmp": "bmp",
                ".tif": "tiff", ".tiff": "tiff", ".ppm": "ppm", ".pgm": "ppm"}
_FORMAT_EXT = {"jpeg": "jpg", "png": "png", "webp": "webp", "bmp": "bmp", "tiff": "tif", "ppm": "ppm"}


@dataclass(frozen=True)
class Prepared:
    """The outcome for one source: bytes to store, or the problem that stops it (or both, for warnings)."""

    position: int
    source: str
    label: int
    data: bytes | None
    ext: str = ""
    width: int = 0
    height: int = 0
    problem_kind: str = ""
    problem_detail: str = ""
    #: a progressive JPEG stored as a sequential one (losslessly: ``sequential``)
    baseline: bool = False


def full_decode_check(data: bytes, is_jpeg: bool) -> None:
    """Raise if the image does not decode completely (truncation included)."""
    if is_jpeg:
        try:
            import simplejpeg

            simplejpeg.decode_jpeg(data, strict=True)
            return
        except ImportError:
            pass
        except ValueError:
            pass  # strict libjpeg warnings: let Pillow give the verdict (it rejects truncation)
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()


def shrink(data: bytes, max_side: int, quality: int) -> tuple[bytes, int, int]:
    """Re-encode as a JPEG whose longer side is at most ``max_side``."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.draft("RGB", (max_side, max_side))  # DCT-scaled decode when the JPEG is much larger
        rgb = im.convert("RGB")
        w, h = rgb.size
        factor = max_side / max(w, h)
        if factor < 1:
            size = (max(1, round(w * factor)), max(1, round(h * factor)))
            # Image.LANCZOS: Pillow sets its module aliases at run time, where its stubs do not see them
            rgb = rgb.resize(size, Image.LANCZOS)  # type: ignore[attr-defined]
        buf = io.BytesIO()
        rgb.save(buf, format="JPEG", quality=quality)
        return buf.getvalue(), rgb.size[0], rgb.size[1]


def sequential(data: bytes) -> tuple[bytes, bool]:
    """A progressive JPEG as a sequential one, losslessly (the same pixels, decoded 2-3 times as fast), and whether
    it was rewritten; the bytes unchanged where the JPEG is sequential already or no TurboJPEG 3 library is
    installed."""
    from stallscope.data.turbo import TurboJpegError, to_baseline

    try:
        if not jpeg_is_progressive(data):
            return data, False
        return to_baseline(data), True
    except (HeaderError, TurboJpegError, MemoryError):
        return data, False


def _size(path: str) -> str:
    try:
        return f"{os.stat(path).st_size:,} bytes"
    except OSError:
        return "size unknown"


def prepare(task: tuple[int, str, str, int, int | CropFit, int]) -> Prepared:
    """``task`` is (position, path, name in reports, label, max_side or 0, quality); ``max_side`` a
    :class:`CropFit` sizes each image for the crops its training takes (``pack --max-side auto``)."""
    position, path, name, label, limit, quality = task
    try:
        data = read_regular(path)
    except OSError as exc:
        kind = ("not-a-file" if isinstance(exc, NotRegularFileError) else
                "changed" if isinstance(exc, FileChangedError) else "unreadable")
        return Prepared(position, name, label, None, problem_kind=kind, problem_detail=describe(exc))
    except MemoryError:  # a regular file can be larger than memory (a sparse one, or not an image at all)
        return Prepared(position, name, label, None, problem_kind="unreadable",
                        problem_detail=f"too large to hold in memory ({_size(path)})")
    if not data:
        return Prepared(position, name, label, None, problem_kind="empty", problem_detail="zero-byte file")
    try:
        header = read_header(data)
    except HeaderError as exc:
        return Prepared(position, name, label, None, problem_kind="not-an-image", problem_detail=str(exc))
    try:
        full_decode_check(data, header.is_jpeg)
    except Exception as exc:  # noqa: BLE001 - any decoder failure means the file is unusable
        return Prepared(position, name, label, None, problem_kind="corrupt",
                        problem_detail=f"does not decode: {exc}")
    width, height, ext = header.width, header.height, _FORMAT_EXT.get(header.format, header.format)
    max_side = limit.longer_side(width, height) if isinstance(limit, CropFit) else limit
    baseline = False
    if max_side and max(width, height) > max_side:
        data, width, height = shrink(data, max_side, quality)
        ext = "jpg"
        header_format = "jpeg"
    else:
        header_format = header.format
        if header.is_jpeg:
            data, baseline = sequential(data)
    kind = detail = ""
    claimed = _EXT_FORMATS.get(Path(name).suffix.lower())
    if claimed is not None and claimed != header.format:
        kind, detail = "extension-mismatch", f"named {Path(name).suffix} but holds {header.format.upper()}"
    elif header_format != "jpeg":
        kind, detail = "not-jpeg", f"{header.format.upper()}: decoded by the slower Pillow path"
    return Prepared(position, name, label, data, ext, width, height, kind, detail, baseline)
