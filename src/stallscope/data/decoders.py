"""JPEG decoders, found at import time and ranked, with DCT-scaled and region decoding.

All three backends wrap libjpeg-turbo, yet their per-image overheads differ: simplejpeg decodes
the most images per core, then OpenCV, then Pillow (whose ``convert`` and array export add copies).
The order below is that ranking (calibration: data-decoder-order); :func:`measure_decode_rate`
re-measures it on the user's own files.

``"auto"`` picks the first installed of :data:`DECODER_ORDER`: turbojpeg with the fast integer
IDCT ("turbojpeg-fast"), else simplejpeg with the fast IDCT and fast chroma upsampling
("simplejpeg-fast"), as FFCV does: more images per core, for pixel differences of
about one grey level that random crops and resizes drown anyway. Ask for ``"turbojpeg"`` or
``"simplejpeg"`` for the exact decode.

Every backend can decode at 1/2, 1/4 or 1/8 scale inside the IDCT, which skips most of the
work when the crop is much larger than the output. ``"turbojpeg"`` (libjpeg-turbo 3 through
ctypes, see :mod:`stallscope.data.turbo`; extra ``turbo``) also decodes only the crop's region,
and ranks first where installed: the region saves most on larger images, where crops leave more
rows unread. turbojpeg's full decode is slower than simplejpeg-fast's because it keeps
libjpeg-turbo's accurate chroma upsampling (see :mod:`stallscope.data.turbo`). The figures per
size band are in the calibration table; ``benchmarks/fastpath.py --sizes --race`` re-measures them.

Non-JPEG input always goes through Pillow.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Sequence

import numpy as np

#: Preference order, fastest first (calibration: data-decoder-order).
DECODER_ORDER: tuple[str, ...] = ("turbojpeg-fast", "turbojpeg", "simplejpeg-fast", "simplejpeg", "opencv", "pillow")


class DecodeError(ValueError):
    """The bytes could not be decoded by any backend."""


class Decoder:
    """A JPEG backend. ``decode`` returns an HxWx3 uint8 array, in BGR order when ``bgr`` is set.

    Returning BGR lets OpenCV skip its colour swap on the full image; the caller swaps the
    channels of the much smaller output instead.
    """

    name: str = "abstract"
    bgr: bool = False
    #: ``decode_region`` decodes less than the whole image (otherwise it decodes all and says so).
    decodes_regions: bool = False

    def decode(self, data: bytes, width: int, height: int, scale: int = 1) -> np.ndarray:
        raise NotImplementedError

    def decode_region(self, data: bytes, width: int, height: int, scale: int,
                      box: tuple[int, int, int, int]) -> tuple[np.ndarray, int, int]:
        """Pixels covering ``box`` = (x0, y0, x1, y1) of the 1/``scale`` image, and where they start in it.

        Every pixel inside ``box`` equals the full decode's at that scale; the array may extend
        beyond ``box``. The default decodes the whole image: ``(pixels, 0, 0)``.
        """
        return self.decode(data, width, height, scale), 0, 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class SimpleJpegDecoder(Decoder):
    name = "simplejpeg"

    def __init__(self, fast: bool = False) -> None:
        import simplejpeg

        self._decode = simplejpeg.decode_jpeg
        self.fast = fast
        self.name = "simplejpeg-fast" if fast else "simplejpeg"

    def decode(self, data: bytes, width: int, height: int, scale: int = 1) -> np.ndarray:
        # Asking for at least ceil(size / scale) makes libjpeg-turbo pick exactly 1/scale.
        return self._decode(
            data,
            colorspace="RGB",
            fastdct=self.fast,
            fastupsample=self.fast,
            min_width=-(-width // scale) if scale > 1 else 0,
            min_height=-(-height // scale) if scale > 1 else 0,
        )


class TurboJpegDecoder(Decoder):
    """libjpeg-turbo 3's TurboJPEG API: DCT scaling and region decoding (see :mod:`stallscope.data.turbo`)."""

    name = "turbojpeg"
    decodes_regions = True

    def __init__(self, fast: bool = False) -> None:
        from stallscope.data import turbo

        self._module = turbo  # decode_jpeg is looked up at each call, so a recorder's wrapper sees it
        self._turbo = turbo.TurboJpeg(fast)
        self.fast = fast
        self.name = "turbojpeg-fast" if fast else "turbojpeg"

    def decode(self, data: bytes, width: int, height: int, scale: int = 1) -> np.ndarray:
        return self._module.decode_jpeg(self._turbo, data, scale)[0]

    def decode_region(self, data: bytes, width: int, height: int, scale: int,
                      box: tuple[int, int, int, int]) -> tuple[np.ndarray, int, int]:
        return self._module.decode_jpeg(self._turbo, data, scale, box)


class OpenCVDecoder(Decoder):
    name = "opencv"
    bgr = True

    def __init__(self) -> None:
        import cv2

        self._cv2 = cv2
        ignore = cv2.IMREAD_IGNORE_ORIENTATION  # match Pillow and torchvision: no EXIF rotation
        self._flags = {
            1: cv2.IMREAD_COLOR | ignore,
            2: cv2.IMREAD_REDUCED_COLOR_2 | ignore,
            4: cv2.IMREAD_REDUCED_COLOR_4 | ignore,
            8: cv2.IMREAD_REDUCED_COLOR_8 | ignore,
        }

    def decode(self, data: bytes, width: int, height: int, scale: int = 1) -> np.ndarray:
        out = self._cv2.imdecode(np.frombuffer(data, np.uint8), self._flags[scale])
        if out is None:
            raise DecodeError("OpenCV could not decode the image")
        return out


class PillowDecoder(Decoder):
    name = "pillow"

    def __init__(self) -> None:
        from PIL import Image

        self._image = Image

    def decode(self, data: bytes, width: int, height: int, scale: int = 1) -> np.ndarray:
        with self._image.open(io.BytesIO(data)) as im:
            if scale > 1 and im.format == "JPEG":
                im.draft("RGB", (-(-width // scale), -(-height // scale)))
            return np.asarray(im.convert("RGB"))


def decode_any(data: bytes) -> np.ndarray:
    """Full-size RGB array of any format Pillow reads (PNG, WebP, CMYK JPEG...): the slow, safe path."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DecodeError(f"Pillow could not decode the image: {exc}") from exc


_FACTORIES = {
    "turbojpeg-fast": lambda: TurboJpegDecoder(fast=True),
    "turbojpeg": TurboJpegDecoder,
    "simplejpeg-fast": lambda: SimpleJpegDecoder(fast=True),
    "simplejpeg": SimpleJpegDecoder,
    "opencv": OpenCVDecoder,
    "pillow": PillowDecoder,
}


def available_decoders() -> list[str]:
    """Names of the installed backends, fastest first."""
    names = []
    for name in DECODER_ORDER:
        try:
            _FACTORIES[name]()
        except ImportError:
            continue
        names.append(name)
    return names


def get_decoder(name: str | Decoder = "auto") -> Decoder:
    """The named backend, or with ``"auto"`` the fastest installed one (see ``Decoder.name``)."""
    if isinstance(name, Decoder):
        return name
    if name == "auto":
        for candidate in DECODER_ORDER:
            try:
                return _FACTORIES[candidate]()
            except ImportError:
                continue
        raise ImportError("no JPEG decoder: install Pillow (pip install pillow)")  # pragma: no cover
    if name not in _FACTORIES:
        raise ValueError(f"unknown decoder {name!r}; choose one of: auto, {', '.join(DECODER_ORDER)}")
    try:
        return _FACTORIES[name]()
    except ImportError as exc:
        extra = "turbo" if name.startswith("turbojpeg") else "data"
        raise ImportError(f"decoder {name!r} is not installed (pip install 'stallscope[{extra}]')") from exc


def measure_decode_rate(decoder: Decoder | str, blobs: Sequence[bytes], min_seconds: float = 1.0) -> float:
    """Full-size decodes per second on one core (this thread) over ``blobs``, repeated for ``min_seconds``.

    This is the ceiling a pipeline of the same decoder can reach per core; a pipeline's
    images/s per core divided by it says how much the rest of the pipeline costs.
    """
    from stallscope.data.headers import read_header

    dec = get_decoder(decoder)
    sizes = [read_header(b) for b in blobs]
    if not blobs:
        raise ValueError("no images to measure")
    count, start = 0, time.perf_counter()
    while True:
        for blob, header in zip(blobs, sizes):
            if header.is_jpeg:
                dec.decode(blob, header.width, header.height, 1)
            else:
                decode_any(blob)
        count += len(blobs)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return count / elapsed


def scaled_size(width: int, height: int, scale: int) -> tuple[int, int]:
    """Output size of a 1/scale DCT decode (libjpeg rounds up)."""
    return math.ceil(width / scale), math.ceil(height / scale)
