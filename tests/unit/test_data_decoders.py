"""Header parsing and decoders: every backend agrees with Pillow, scaled or not."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from stallscope.data.cropdecode import decode_crop
from stallscope.data.crops import (
    CropPlan,
    FullImage,
    RandomResizedCrop,
    ResizeCenterCrop,
)
from stallscope.data.decoders import (
    DECODER_ORDER,
    DecodeError,
    available_decoders,
    get_decoder,
    measure_decode_rate,
)
from stallscope.data.headers import HeaderError, read_header


def _photo(width: int = 320, height: int = 240, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    """A smooth gradient with texture: a fair test of decoders without a photo on disk."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([(x * 255 // width), (y * 255 // height), ((x + y) * 3) % 256], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).convert(mode).save(buf, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return buf.getvalue()


def _pillow(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.int16)


@pytest.mark.parametrize("fmt,kind", [("JPEG", "jpeg"), ("PNG", "png"), ("BMP", "bmp"), ("WEBP", "webp")])
def test_header_size_matches_pillow(fmt, kind):
    data = _photo(321, 203, fmt)
    header = read_header(data)
    assert (header.width, header.height, header.format) == (321, 203, kind)


def test_progressive_and_grayscale_jpeg_headers():
    buf = io.BytesIO()
    Image.open(io.BytesIO(_photo(100, 60))).save(buf, format="JPEG", progressive=True)
    progressive = read_header(buf.getvalue())
    assert (progressive.width, progressive.height, progressive.format) == (100, 60, "jpeg")
    gray = _photo(90, 70, mode="L")
    assert (read_header(gray).width, read_header(gray).height) == (90, 70)


@pytest.mark.parametrize("data,words", [(b"", "empty"), (b"hello world\n", "not an image"),
                                        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "frame header")])
def test_header_errors_say_why(data, words):
    with pytest.raises(HeaderError, match=words):
        read_header(data)


def test_available_decoders_are_ranked_and_pillow_is_always_there():
    names = available_decoders()
    assert "pillow" in names
    assert names == [n for n in DECODER_ORDER if n in names]
    assert get_decoder("auto").name == names[0]
    with pytest.raises(ValueError, match="unknown decoder"):
        get_decoder("libjpeg9000")


@pytest.mark.parametrize("name", DECODER_ORDER)
def test_decoders_agree_with_pillow_at_full_size(name):
    if name not in available_decoders():
        pytest.skip(f"{name} not installed")
    data = _photo()
    out = decode_crop(data, FullImage(), get_decoder(name))
    ref = _pillow(data)
    assert out.shape == ref.shape and out.dtype == np.uint8
    # The exact decoders share libjpeg-turbo's accurate IDCT; the fast one trades ~1-2 levels.
    assert np.abs(out.astype(np.int16) - ref).mean() < (3.0 if name.endswith("-fast") else 1.5)


@pytest.mark.parametrize("name", DECODER_ORDER)
@pytest.mark.parametrize("scale", [2, 4, 8])
def test_dct_scaled_decode_agrees_with_a_resized_pillow_decode(name, scale):
    if name not in available_decoders():
        pytest.skip(f"{name} not installed")
    data = _photo(640, 480)
    dec = get_decoder(name)
    out = dec.decode(data, 640, 480, scale)
    if dec.bgr:
        out = out[:, :, ::-1]
    assert out.shape == (480 // scale, 640 // scale, 3)
    ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((640 // scale, 480 // scale),
                                                                            Image.BOX)).astype(np.int16)
    assert np.abs(out.astype(np.int16) - ref).mean() < 4.0


@pytest.mark.parametrize("crop", [RandomResizedCrop(64), ResizeCenterCrop(72, 64)])
def test_crop_then_decode_matches_decode_then_crop(crop):
    """DCT scaling and crop-first resizing give the pixels torchvision's order would, within tolerance."""
    import random

    data = _photo(640, 480)
    plan = crop.plan(640, 480, random.Random(3))
    fixed = type("Fixed", (), {"plan": lambda self, w, h, rng=None: plan})()
    for name in available_decoders():
        out = decode_crop(data, fixed, get_decoder(name)).astype(np.int16)
        full = Image.open(io.BytesIO(data)).convert("RGB")
        ref = full.resize((plan.out_width, plan.out_height), Image.BILINEAR,
                          box=(plan.left, plan.top, plan.left + plan.width, plan.top + plan.height))
        ref = np.asarray(ref).astype(np.int16)
        if plan.flip:
            ref = ref[:, ::-1]
        assert out.shape == (64, 64, 3)
        assert np.abs(out - ref).mean() < 6.0, name


def test_png_and_cmyk_fall_back_to_pillow():
    png = _photo(80, 50, "PNG")
    out = decode_crop(png, FullImage(), get_decoder("auto"))
    assert np.array_equal(out, _pillow(png).astype(np.uint8))
    cmyk = _photo(80, 50, "JPEG", mode="CMYK")
    out = decode_crop(cmyk, RandomResizedCrop(32), get_decoder("auto"))
    assert out.shape == (32, 32, 3)


def test_decode_errors_name_the_problem():
    with pytest.raises(DecodeError, match="empty"):
        decode_crop(b"", FullImage(), get_decoder("auto"))
    with pytest.raises(DecodeError):
        decode_crop(_photo()[:400], FullImage(), get_decoder("auto"))


def test_flip_mirrors_the_output():
    data = _photo(100, 80)
    a = decode_crop(data, type("P", (), {"plan": lambda s, w, h, r=None: CropPlan(0, 0, w, h, w, h, False)})(),
                    get_decoder("auto"))
    b = decode_crop(data, type("P", (), {"plan": lambda s, w, h, r=None: CropPlan(0, 0, w, h, w, h, True)})(),
                    get_decoder("auto"))
    assert np.array_equal(a[:, ::-1], b)


def test_measure_decode_rate_is_positive():
    assert measure_decode_rate("auto", [_photo(64, 48)], min_seconds=0.05) > 0
