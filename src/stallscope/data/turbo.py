"""Region decoding through libjpeg-turbo's TurboJPEG 3 API, called with ctypes.

Why this exists: a RandomResizedCrop keeps on average about half of the image, yet every Python
JPEG binding with wheels (simplejpeg, OpenCV, Pillow, imagecodecs) decodes all of it. TurboJPEG 3
(``tj3SetCroppingRegion``) decodes only a region: rows above it are entropy-decoded but skip the
IDCT and colour conversion, rows below it are never read, and columns outside it skip the IDCT.
With the DCT scaling the crop allows, that decoded the crops of a RandomResizedCrop(224) with 9%
(500x400) to 19% (800x600) less CPU than simplejpeg's scaled whole decode, and as fast on 250x190
(the race is in :mod:`stallscope.data.decoders`). pyvips also decodes on demand, but its per-image
cost exceeded what it saved.

The library is found, in order: the copy that the ``turbojpeg`` wheel bundles (extra ``turbo``, pinned to
0.0.2, whose wheels carry a libjpeg-turbo development build with the TurboJPEG 3 API, "2.1.92"), then a
system ``libturbojpeg`` of version 3 or later. That wheel's module is named ``turbojpeg`` like PyTurboJPEG's and
shadows it: an environment that uses PyTurboJPEG should not install the ``turbo`` extra. Without one, the
other decoders are used as before. Nothing here is compiled: the TurboJPEG API takes an opaque
handle, integers and two small structs, which ctypes passes safely, and reports errors by return
value, so a corrupt file raises instead of jumping out of the library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import threading
from ctypes import Structure, c_char_p, c_int, c_size_t, c_void_p

import numpy as np

_INIT_DECOMPRESS, _INIT_TRANSFORM = 1, 2
#: tjtransform's ``op`` and ``options``: no spatial change; optimized Huffman tables (no progressive flag: sequential)
_XOP_NONE, _XOPT_OPTIMIZE = 0, 256
_PARAM_SUBSAMP, _PARAM_WIDTH, _PARAM_HEIGHT = 4, 5, 6
_PARAM_FASTUPSAMPLE, _PARAM_FASTDCT = 9, 10
_PF_RGB = 0
#: Width in pixels of one MCU per subsampling (TJSAMP_444, 422, 420, GRAY, 440, 411, 441).
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)


class _Region(Structure):
    _fields_ = [("x", c_int), ("y", c_int), ("w", c_int), ("h", c_int)]


class _Scale(Structure):
    _fields_ = [("num", c_int), ("denom", c_int)]


class _Transform(Structure):
    _fields_ = [("r", _Region), ("op", c_int), ("options", c_int), ("data", c_void_p), ("customFilter", c_void_p)]


def _candidate_paths() -> list[str]:
    """Library files to try: the ``turbojpeg`` wheel's bundled copy first, then the system's."""
    paths: list[str] = []
    spec = importlib.util.find_spec("turbojpeg")
    if spec is not None and spec.origin:
        site = os.path.dirname(spec.origin)
        # Where auditwheel (Linux), delocate (macOS) and delvewheel (Windows) put the bundled library.
        for pattern in ("turbojpeg.libs/libturbojpeg*", "turbojpeg.dylibs/libturbojpeg*", "turbojpeg-*.dll"):
            paths.extend(sorted(glob.glob(os.path.join(site, pattern))))
    system = ctypes.util.find_library("turbojpeg")
    if system:
        paths.append(system)
    return paths


def _load() -> ctypes.CDLL | None:
    """The first candidate library that has the TurboJPEG 3 cropping API, with its signatures set."""
    for path in _candidate_paths():
        try:
            lib = ctypes.CDLL(path)
            lib.tj3SetCroppingRegion  # noqa: B018 - absent before libjpeg-turbo 3.0
        except (OSError, AttributeError):
            continue
        lib.tj3Init.restype = c_void_p
        lib.tj3Init.argtypes = [c_int]
        lib.tj3Destroy.argtypes = [c_void_p]
        lib.tj3Set.argtypes = [c_void_p, c_int, c_int]
        lib.tj3Get.argtypes = [c_void_p, c_int]
        lib.tj3DecompressHeader.argtypes = [c_void_p, c_char_p, c_size_t]
        lib.tj3SetScalingFactor.argtypes = [c_void_p, _Scale]
        lib.tj3SetCroppingRegion.argtypes = [c_void_p, _Region]
        lib.tj3Decompress8.argtypes = [c_void_p, c_char_p, c_size_t, c_void_p, c_int, c_int]
        lib.tj3GetErrorStr.restype = c_char_p
        lib.tj3GetErrorStr.argtypes = [c_void_p]
        lib.tj3Transform.argtypes = [c_void_p, c_char_p, c_size_t, c_int, ctypes.POINTER(c_void_p),
                                     ctypes.POINTER(c_size_t), ctypes.POINTER(_Transform)]
        lib.tj3Free.argtypes = [c_void_p]
        return lib
    return None


_LIB: ctypes.CDLL | None = None
_LOADED = False


def turbojpeg_library() -> ctypes.CDLL | None:
    """The loaded TurboJPEG 3 library, or None where none is installed (looked up once per process)."""
    global _LIB, _LOADED
    if not _LOADED:
        _LIB, _LOADED = _load(), True
    return _LIB


class TurboJpegError(ValueError):
    """TurboJPEG refused the data (corrupt, CMYK to RGB, ...): the caller falls back to another decoder."""


class _Owned:
    """One thread's decompressor handle, destroyed with it: when the thread ends (its thread-local state is
    dropped) or the TurboJpeg object goes."""

    def __init__(self, lib: ctypes.CDLL, handle: int) -> None:
        self.lib, self.handle = lib, handle

    def __del__(self) -> None:
        if self.handle:
            self.lib.tj3Destroy(self.handle)
            self.handle = 0


class _Handle(threading.local):
    owned: _Owned | None = None


class TurboJpeg:
    """One decompressor per thread; ``fast`` selects the fast integer IDCT.

    Fast chroma upsampling is never used: with it, the bundled libjpeg-turbo skips rows above a region
    through its merged upsampler, which reads and writes outside its buffers (valgrind: invalid
    reads and writes in ``read_and_discard_scanlines``; regions decoded after it came out as noise
    in about one image in twenty). The fast IDCT alone is clean under valgrind.
    """

    def __init__(self, fast: bool = False) -> None:
        lib = turbojpeg_library()
        if lib is None:
            raise ImportError("no libjpeg-turbo 3 TurboJPEG library (pip install 'stallscope[turbo]')")
        self._lib = lib
        self.fast = fast
        self._local = _Handle()

    def _handle(self) -> int:
        owned = self._local.owned
        if owned is None:
            handle = self._lib.tj3Init(_INIT_DECOMPRESS)
            if not handle:
                raise MemoryError("tj3Init failed")
            owned = self._local.owned = _Owned(self._lib, handle)
            self._lib.tj3Set(handle, _PARAM_FASTDCT, int(self.fast))
            self._lib.tj3Set(handle, _PARAM_FASTUPSAMPLE, 0)
        return owned.handle

    def _fail(self, handle: int) -> TurboJpegError:
        return TurboJpegError((self._lib.tj3GetErrorStr(handle) or b"TurboJPEG error").decode(errors="replace"))

    def decode(self, data: bytes, scale: int = 1,
               box: tuple[int, int, int, int] | None = None) -> tuple[np.ndarray, int, int]:
        """RGB pixels of ``box`` = (x0, y0, x1, y1) in the 1/``scale`` image (all of it when None).

        Returns ``(pixels, x, y)``: the decoded region starts at (x, y) of the scaled image and
        covers ``box``, usually with a few columns more on each side. TurboJPEG can start a
        region only at an MCU column, and its chroma upsampling treats the region's first and
        last columns as image edges; one MCU more on each side keeps every pixel of ``box``
        equal to the full decode's.
        """
        if not isinstance(data, bytes):  # a memoryview or bytearray: ctypes passes only bytes as char*
            data = bytes(data)
        lib, handle = self._lib, self._handle()
        if lib.tj3DecompressHeader(handle, data, len(data)) != 0:
            raise self._fail(handle)
        width, height = lib.tj3Get(handle, _PARAM_WIDTH), lib.tj3Get(handle, _PARAM_HEIGHT)
        subsamp = lib.tj3Get(handle, _PARAM_SUBSAMP)
        if lib.tj3SetScalingFactor(handle, _Scale(1, scale)) != 0:
            raise self._fail(handle)
        scaled_w, scaled_h = -(-width // scale), -(-height // scale)
        if box is None or not 0 <= subsamp < len(_MCU_WIDTH):  # an unusual layout: no known MCU, decode all
            x, y, x1, y1 = 0, 0, scaled_w, scaled_h
        else:
            if not (0 <= box[0] < box[2] <= scaled_w and 0 <= box[1] < box[3] <= scaled_h):
                # an empty or outside box: TurboJPEG would read a height of 0 as "to the bottom" and overrun
                raise TurboJpegError(f"region {box} is empty or outside the {scaled_w}x{scaled_h} image")
            mcu = max(1, _MCU_WIDTH[subsamp] // scale)
            x = max(0, (box[0] // mcu - 1) * mcu)
            y, y1 = box[1], box[3]
            x1 = min(scaled_w, box[2] + mcu)
        region = _Region(0, 0, 0, 0) if (x, y, x1, y1) == (0, 0, scaled_w, scaled_h) else _Region(x, y, x1 - x, y1 - y)
        if lib.tj3SetCroppingRegion(handle, region) != 0:
            raise self._fail(handle)
        out = np.empty((y1 - y, x1 - x, 3), np.uint8)
        if lib.tj3Decompress8(handle, data, len(data), out.ctypes.data, out.strides[0], _PF_RGB) != 0:
            raise self._fail(handle)
        return out, x, y



def decode_jpeg(decompressor: TurboJpeg, data: bytes, scale: int = 1,
                box: tuple[int, int, int, int] | None = None) -> tuple[np.ndarray, int, int]:
    """``decompressor.decode(data, scale, box)``, as a module-level function that callers look up at each call.

    Why: stallscope's recorder times decoders by wrapping module functions when their module is
    imported (``simplejpeg.decode_jpeg``, ``cv2.imdecode``); a wrapper installed here is seen by
    every decode, so this backend's time can be charged to ``decode`` like theirs.
    """
    return decompressor.decode(data, scale, box)


_transformer = _Handle()


def to_baseline(data: bytes) -> bytes:
    """A progressive JPEG rewritten as a sequential (baseline) one, losslessly: the same DCT coefficients, so the
    same pixels from any decoder, and markers (EXIF, ICC) kept; why: a progressive file takes its decoder 2-3 times
    as long (every coefficient is visited once per scan). Raises :class:`TurboJpegError` where the library is
    missing or refuses the data."""
    lib = turbojpeg_library()
    if lib is None:
        raise TurboJpegError("no TurboJPEG 3 library installed (the 'turbo' extra)")
    owned = _transformer.owned
    if owned is None:
        handle = lib.tj3Init(_INIT_TRANSFORM)
        if not handle:
            raise MemoryError("tj3Init failed")
        owned = _transformer.owned = _Owned(lib, handle)
    out, size = c_void_p(), c_size_t(0)
    transform = _Transform(_Region(0, 0, 0, 0), _XOP_NONE, _XOPT_OPTIMIZE, None, None)
    if lib.tj3Transform(owned.handle, data, len(data), 1, ctypes.byref(out), ctypes.byref(size),
                        ctypes.byref(transform)) != 0:
        if out:
            lib.tj3Free(out)
        raise TurboJpegError((lib.tj3GetErrorStr(owned.handle) or b"TurboJPEG error").decode(errors="replace"))
    try:
        return ctypes.string_at(out, size.value)
    finally:
        lib.tj3Free(out)
