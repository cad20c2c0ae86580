"""Bytes in, cropped and resized uint8 pixels out, decoding no more than the crop needs.

The order is the point: read the size from the header, choose the crop, decode at the
largest DCT reduction the crop allows (only the crop's region, where the decoder can), then
resize only the crop. torchvision's recipe decodes every pixel at full size, converts the
whole image, then throws most of it away.
"""

from __future__ import annotations

import math
import random

import numpy as np

from stallscope.data.crops import CropPlan, CropSpec, FullImage
from stallscope.data.decoders import DecodeError, Decoder, decode_any
from stallscope.data.headers import HeaderError, read_header

try:  # OpenCV resizes a crop several times faster than Pillow; both are optional.
    import cv2 as _cv2
except ImportError:  # pragma: no cover - exercised where OpenCV is absent
    _cv2 = None  # type: ignore[assignment]  # optional: every use checks for None

_CV2_SINGLE_THREAD = False


def _cv2_single_thread() -> None:
    """Inside DataLoader workers OpenCV's own thread pool only oversubscribes the cores."""
    global _CV2_SINGLE_THREAD
    if _cv2 is None or _CV2_SINGLE_THREAD:
        return
    _CV2_SINGLE_THREAD = True
    try:
        import torch.utils.data

        if torch.utils.data.get_worker_info() is not None:
            _cv2.setNumThreads(1)
    except ImportError:  # pragma: no cover
        pass


def scaled_box(plan: CropPlan, full_width: int, full_height: int, width: int, height: int) -> tuple[int, int, int, int]:
    """``plan``'s box (full-size coordinates) in a ``width`` x ``height`` decode of the image: (x0, y0, x1, y1).

    The decode may be DCT-reduced, so the box is rescaled by the actual ratio of sizes and
    widened to whole pixels; it is never empty and never leaves the image.
    """
    fx, fy = width / full_width, height / full_height
    x0 = min(width - 1, int(math.floor(plan.left * fx)))
    y0 = min(height - 1, int(math.floor(plan.top * fy)))
    x1 = max(x0 + 1, min(width, int(math.ceil((plan.left + plan.width) * fx))))
    y1 = max(y0 + 1, min(height, int(math.ceil((plan.top + plan.height) * fy))))
    return x0, y0, x1, y1


def crop_resize(pixels: np.ndarray, plan: CropPlan, full_width: int, full_height: int) -> np.ndarray:
    """Cut ``plan``'s box (given in full-size coordinates) from ``pixels`` and resize it to the output.

    ``pixels`` may be a DCT-reduced decode, so the box is rescaled by the actual ratio of sizes.
    """
    h, w = pixels.shape[:2]
    return resize_box(pixels, scaled_box(plan, full_width, full_height, w, h), plan)


def resize_box(pixels: np.ndarray, box: tuple[int, int, int, int], plan: CropPlan) -> np.ndarray:
    """Resize ``pixels[y0:y1, x0:x1]`` to ``plan``'s output size, flipped if the plan says so."""
    h, w = pixels.shape[:2]
    x0, y0, x1, y1 = box
    out_size = (plan.out_width, plan.out_height)
    if (x0, y0, x1, y1) == (0, 0, w, h) and (w, h) == out_size:
        out = pixels
    elif _cv2 is not None:
        # A compact copy of the crop resizes faster than the strided view (~80 vs ~100 us at 224 px).
        region = np.ascontiguousarray(pixels[y0:y1, x0:x1])
        shrink = max((x1 - x0) / plan.out_width, (y1 - y0) / plan.out_height)
        # Bilinear is exact enough up to 2x down; beyond that it aliases and area averaging is right.
        interp = _cv2.INTER_AREA if shrink > 2.0 else _cv2.INTER_LINEAR
        out = _cv2.resize(region, out_size, interpolation=interp)
    else:
        from PIL import Image

        out = np.asarray(
            Image.fromarray(pixels).resize(out_size, Image.BILINEAR, box=(x0, y0, x1, y1))
        )
    if plan.flip:
        out = _cv2.flip(out, 1) if _cv2 is not None else out[:, ::-1]
    return out


def decode_jpeg_crop(data: bytes, plan: CropPlan, width: int, height: int, decoder: Decoder,
                     scale: int) -> np.ndarray:
    """``plan``'s crop of a ``width`` x ``height`` JPEG, decoded at 1/``scale``, resized to the output.

    A decoder that decodes regions gets only the crop's box; the result is the same as decoding
    the whole image at that scale and cropping, pixel for pixel.
    """
    if decoder.decodes_regions:
        scaled_w, scaled_h = -(-width // scale), -(-height // scale)
        box = scaled_box(plan, width, height, scaled_w, scaled_h)
        pixels, x, y = decoder.decode_region(data, width, height, scale, box)
        _check_rgb(pixels)
        return resize_box(pixels, (box[0] - x, box[1] - y, box[2] - x, box[3] - y), plan)
    pixels = decoder.decode(data, width, height, scale)
    _check_rgb(pixels)
    return crop_resize(pixels, plan, width, height)


def _check_rgb(pixels: np.ndarray) -> None:
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise DecodeError(f"decoder returned shape {pixels.shape}, expected HxWx3")


def decode_crop(
    data: bytes,
    crop: CropSpec,
    decoder: Decoder,
    rng: random.Random | None = None,
    dct_scaling: bool = True,
    planes: np.ndarray | None = None,
) -> np.ndarray:
    """Decode ``data`` to the HxWx3 RGB uint8 array that ``crop`` asks for.

    JPEGs go through ``decoder`` at the DCT reduction the crop allows (disable with
    ``dct_scaling=False``); anything else, or a JPEG the fast backend rejects (CMYK,
    arithmetic coding), goes through Pillow at full size. Raises :class:`DecodeError`.

    ``planes``: a 3xHxW uint8 array (one slot of a channels-first batch). When the crop's
    output is HxW, the result is written there as R, G, B planes and ``planes`` is returned;
    otherwise it is left alone and the HxWx3 array is returned as usual.
    """
    _cv2_single_thread()
    try:
        header = read_header(data)
    except HeaderError as exc:
        raise DecodeError(str(exc)) from exc
    plan = crop.plan(header.width, header.height, rng)
    bgr = False
    out = None
    if header.is_jpeg:
        scale = plan.dct_scale() if dct_scaling else 1
        try:
            out = decode_jpeg_crop(data, plan, header.width, header.height, decoder, scale)
            bgr = decoder.bgr
        except (ValueError, OSError, DecodeError):
            pass
    if out is None:
        pixels = decode_any(data)
        _check_rgb(pixels)
        out = crop_resize(pixels, plan, header.width, header.height)
    if planes is not None and planes.shape == (3, plan.out_height, plan.out_width):
        write_planes(out, planes, bgr)
        return planes
    if bgr:
        out = _cv2.cvtColor(out, _cv2.COLOR_BGR2RGB) if _cv2 is not None else out[:, :, ::-1]
    out = np.ascontiguousarray(out)
    return out if out.flags.writeable else out.copy()  # torch warns on read-only arrays


def write_planes(pixels: np.ndarray, planes: np.ndarray, bgr: bool = False) -> None:
    """Copy HxWx3 ``pixels`` into 3xHxW ``planes`` as R, G, B (swapping B and R when ``bgr``).

    OpenCV's channel split does this in about a tenth of a strided NumPy copy's time, and
    channels-first uint8 batches turn into float NCHW without a transpose later.
    """
    if _cv2 is not None:
        _cv2.split(np.ascontiguousarray(pixels), [planes[2], planes[1], planes[0]] if bgr else list(planes))
    else:
        np.copyto(planes, (pixels[:, :, ::-1] if bgr else pixels).transpose(2, 0, 1))


def decode_full(data: bytes, decoder: Decoder) -> np.ndarray:
    """The whole image at full size, RGB."""
    return decode_crop(data, FullImage(), decoder)
