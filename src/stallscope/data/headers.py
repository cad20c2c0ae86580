"""Image size and format from the first bytes of a file, without decoding pixels.

The crop is chosen before decoding (see :mod:`stallscope.data.crops`), so the size must come
from the header: the SOF segment of a JPEG, the IHDR chunk of a PNG. Parsing a few hundred
bytes in Python costs microseconds, against about a millisecond for the decode it steers.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# SOF0..SOF15 carry the frame size; C4 (DHT), C8 (JPG extension) and CC (DAC) share the range.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers that stand alone, without a length field.
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01, 0xD8}


class HeaderError(ValueError):
    """The bytes are not an image this module (or Pillow) can size."""


@dataclass(frozen=True)
class ImageHeader:
    """Size and container format (``"jpeg"``, ``"png"`` or Pillow's format name, lower case)."""

    width: int
    height: int
    format: str

    @property
    def is_jpeg(self) -> bool:
        return self.format == "jpeg"


def sniff_format(data: bytes) -> str | None:
    """``"jpeg"`` or ``"png"`` from the magic bytes, else None (meaning: ask Pillow)."""
    if data[:3] == JPEG_MAGIC:
        return "jpeg"
    if data[:8] == PNG_MAGIC:
        return "png"
    return None


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the first SOF segment of a JPEG."""
    return _jpeg_frame(data)[1:]


#: The frame markers of progressive JPEGs (Huffman and arithmetic coded).
_PROGRESSIVE_SOF = frozenset({0xC2, 0xC6, 0xCA, 0xCE})


def jpeg_is_progressive(data: bytes) -> bool:
    """Whether a JPEG is progressive (its frame header is SOF2, 6, 10 or 14); raises :class:`HeaderError` as
    :func:`jpeg_size` does."""
    return _jpeg_frame(data)[0] in _PROGRESSIVE_SOF


def _jpeg_frame(data: bytes) -> tuple[int, int, int]:
    """(frame marker, width, height) from the first SOF segment of a JPEG."""
    if data[:3] != JPEG_MAGIC:
        raise HeaderError("not a JPEG (no SOI marker)")
    pos, end = 2, len(data)
    while pos < end:
        if data[pos] != 0xFF:
            raise HeaderError(f"JPEG marker expected at byte {pos}")
        while pos < end and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= end:
            break
        marker = data[pos]
        pos += 1
        if marker in _STANDALONE:
            continue
        if marker == 0xD9 or marker == 0xDA:  # EOI or start of scan before any frame header
            break
        if pos + 2 > end:
            break
        (length,) = struct.unpack_from(">H", data, pos)
        if marker in _SOF_MARKERS:
            if pos + 7 > end:
                break
            height, width = struct.unpack_from(">HH", data, pos + 3)
            if width == 0 or height == 0:
                raise HeaderError("JPEG frame header with zero size")
            return marker, width, height
        pos += length
    raise HeaderError("JPEG without a frame header (truncated?)")


def png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != PNG_MAGIC or len(data) < 24 or data[12:16] != b"IHDR":
        raise HeaderError("not a PNG (no IHDR chunk)")
    width, height = struct.unpack_from(">II", data, 16)
    return width, height


def read_header(data: bytes) -> ImageHeader:
    """Size and format of an encoded image; raises :class:`HeaderError` for anything else."""
    if not data:
        raise HeaderError("empty file (zero bytes)")
    kind = sniff_format(data)
    if kind == "jpeg":
        return ImageHeader(*jpeg_size(data), "jpeg")
    if kind == "png":
        return ImageHeader(*png_size(data), "png")
    try:
        from PIL import Image, UnidentifiedImageError

        with Image.open(io.BytesIO(data)) as im:
            width, height = im.size
            fmt = (im.format or "unknown").lower()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise HeaderError(f"not an image Pillow recognises ({exc.__class__.__name__})") from exc
    return ImageHeader(width, height, "jpeg" if fmt in ("jpeg", "mpo") else fmt)
