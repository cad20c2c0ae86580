"""Region decoding: a decoded region equals the full decode, cropped, at every DCT scale and on every path.

The JPEGs are cut from a real photo (scikit-image's astronaut) at odd sizes, in each chroma layout
libjpeg-turbo treats differently (4:2:0, 4:2:2, 4:4:4, grayscale) and progressive, because the
region's edges fall on different MCU widths in each.
"""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from stallscope.data.cropdecode import decode_crop, decode_jpeg_crop, scaled_box
from stallscope.data.crops import CropPlan, RandomResizedCrop, ResizeCenterCrop
from stallscope.data.decoders import Decoder, available_decoders, get_decoder
from stallscope.data.headers import read_header

needs_turbo = pytest.mark.skipif("turbojpeg" not in available_decoders(),
                                 reason="no libjpeg-turbo 3 library (extra 'turbo')")

LAYOUTS = {
    "420": {"quality": 90},
    "422": {"quality": 88, "subsampling": 1},
    "444": {"quality": 95, "subsampling": 0},
    "gray": {"quality": 85},
    "progressive": {"quality": 80, "progressive": True},
}


def _jpeg(layout: str, width: int = 517, height: int = 389) -> bytes:
    import skimage.data

    image = Image.fromarray(skimage.data.astronaut()).resize((width, height), Image.BILINEAR)
    if layout == "gray":
        image = image.convert("L")
    buf = io.BytesIO()
    image.save(buf, format="JPEG", **LAYOUTS[layout])
    return buf.getvalue()


def _boxes(width: int, height: int, rng: random.Random) -> list[tuple[int, int, int, int]]:
    """Each edge case of a region (touching each border, one pixel, full rows and columns) and random ones."""
    fixed = [
        (0, 0, width, height), (0, 0, 1, 1), (width - 1, height - 1, width, height),
        (0, 0, width // 3, height // 3), (width // 2, height // 2, width, height),
        (0, height // 4, width, height // 2), (width // 4, 0, width // 2, height),
        (7, 9, 7 + 17, 9 + 23), (width - 33, 5, width, 40),
    ]
    randoms = []
    for _ in range(12):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        randoms.append((x0, y0, rng.randrange(x0 + 1, width + 1), rng.randrange(y0 + 1, height + 1)))
    return fixed + randoms


@needs_turbo
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", ["turbojpeg", "turbojpeg-fast"])
def test_region_equals_full_decode_then_crop_at_every_scale(layout, name):
    decoder = get_decoder(name)
    data = _jpeg(layout)
    rng = random.Random(layout)
    for scale in (1, 2, 4, 8):
        full = decoder.decode(data, 517, 389, scale)
        height, width = full.shape[:2]
        assert (width, height) == (-(-517 // scale), -(-389 // scale))
        for box in _boxes(width, height, rng):
            pixels, x, y = decoder.decode_region(data, 517, 389, scale, box)
            x0, y0, x1, y1 = box
            assert x <= x0 and y <= y0 and x + pixels.shape[1] >= x1 and y + pixels.shape[0] >= y1
            np.testing.assert_array_equal(pixels[y0 - y:y1 - y, x0 - x:x1 - x], full[y0:y1, x0:x1],
                                          err_msg=f"{layout} scale 1/{scale} box {box}")


@needs_turbo
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_region_agrees_with_simplejpeg_full_decode_within_jpeg_rounding(layout):
    """Another libjpeg-turbo build (simplejpeg's), full decode then crop: the same pixels, give or take one level."""
    if "simplejpeg" not in available_decoders():
        pytest.skip("simplejpeg not installed")
    turbo, other = get_decoder("turbojpeg"), get_decoder("simplejpeg")
    data = _jpeg(layout)
    for scale in (1, 2, 4, 8):
        full = other.decode(data, 517, 389, scale).astype(np.int16)
        box = (full.shape[1] // 5, full.shape[0] // 3, full.shape[1] * 4 // 5, full.shape[0] - 1)
        pixels, x, y = turbo.decode_region(data, 517, 389, scale, box)
        x0, y0, x1, y1 = box
        assert np.abs(pixels[y0 - y:y1 - y, x0 - x:x1 - x] - full[y0:y1, x0:x1]).max() <= 1


class _WholeImage(Decoder):
    """The same backend with region decoding turned off: the reference path (decode all, then crop)."""

    def __init__(self, inner: Decoder) -> None:
        self.inner, self.name, self.bgr = inner, inner.name + "-whole", inner.bgr

    def decode(self, data: bytes, width: int, height: int, scale: int = 1) -> np.ndarray:
        return self.inner.decode(data, width, height, scale)


@needs_turbo
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("crop", [RandomResizedCrop(64), RandomResizedCrop(160, scale=(0.5, 1.0)),
                                  ResizeCenterCrop(72, 64), ResizeCenterCrop(256, 224)])
def test_cropped_output_is_identical_with_and_without_region_decoding(layout, crop):
    """decode_crop through a region equals decode_crop through the whole image, for every crop a plan makes."""
    region = get_decoder("turbojpeg-fast")
    whole = _WholeImage(region)
    data = _jpeg(layout)
    for seed in range(8):
        with_region = decode_crop(data, crop, region, rng=random.Random(seed))
        without = decode_crop(data, crop, whole, rng=random.Random(seed))
        np.testing.assert_array_equal(with_region, without)


@needs_turbo
def test_every_dct_scale_goes_through_the_region_path():
    """Plans whose crops allow 1/1 to 1/8 each decode only their region, and match the whole-image path."""
    region = get_decoder("turbojpeg")
    data = _jpeg("420", 1600, 1200)
    header = read_header(data)
    for side, expected in ((200, 1), (300, 2), (600, 4), (1000, 8)):
        plan = CropPlan(123, 77, side, side, 120, 120, flip=side == 300)
        assert plan.dct_scale() == expected
        scaled = (-(-header.width // expected), -(-header.height // expected))
        box = scaled_box(plan, header.width, header.height, *scaled)
        pixels, _, _ = region.decode_region(data, header.width, header.height, expected, box)
        assert pixels.shape[0] * pixels.shape[1] < scaled[0] * scaled[1]  # less than the whole image
        out = decode_jpeg_crop(data, plan, header.width, header.height, region, expected)
        ref = decode_jpeg_crop(data, plan, header.width, header.height, _WholeImage(region), expected)
        np.testing.assert_array_equal(out, ref)


def test_decoders_without_regions_decode_the_whole_image():
    """The fallback (simplejpeg, OpenCV, Pillow): decode_region is the whole decode, starting at (0, 0)."""
    decoder = get_decoder("pillow")
    data = _jpeg("420", 200, 150)
    pixels, x, y = decoder.decode_region(data, 200, 150, 2, (10, 10, 20, 20))
    assert (x, y) == (0, 0) and pixels.shape == (75, 100, 3) and not decoder.decodes_regions


@needs_turbo
def test_corrupt_and_cmyk_jpegs_fall_back_instead_of_failing():
    region = get_decoder("turbojpeg-fast")
    data = _jpeg("420", 200, 150)
    with pytest.raises(ValueError):
        region.decode_region(data[:300], 200, 150, 1, (0, 0, 50, 50))
    buf = io.BytesIO()
    Image.new("CMYK", (96, 64), (10, 200, 30, 0)).save(buf, format="JPEG")
    out = decode_crop(buf.getvalue(), RandomResizedCrop(32), region)
    assert out.shape == (32, 32, 3)


def test_an_empty_or_outside_region_is_refused_not_decoded():
    """TurboJPEG reads a region height of 0 as 'to the bottom': an empty box would overrun the output buffer."""
    if "turbojpeg" not in available_decoders():
        pytest.skip("the turbo extra is not installed")
    from stallscope.data.turbo import TurboJpeg, TurboJpegError

    data = _jpeg("420")
    decoder = TurboJpeg()
    for box in ((0, 10, 50, 10), (0, 0, 10_000, 10), (-1, 0, 5, 5), (20, 0, 10, 5)):
        with pytest.raises(TurboJpegError, match="empty or outside"):
            decoder.decode(data, 1, box)
    whole, x, y = decoder.decode(memoryview(data), 1)  # any bytes-like input, as simplejpeg takes
    assert (x, y) == (0, 0) and whole.ndim == 3
