"""``pack --max-side auto`` (data/crop_fit.py): the smallest image at which every crop of the training's transform
still holds its output's pixels, checked against torchvision's own crop sampler; the pack it makes and its
prediction."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import pytest
from PIL import Image

from stallscope.data.crop_fit import CropFit
from stallscope.data.packing import PackOptions, pack
from stallscope.data.packing.estimate import estimate
from stallscope.data.sources import open_source


def _smallest_crop(width: int, height: int, fit: CropFit, draws: int = 5_000) -> tuple[int, int]:
    """The narrowest and the shortest crop torchvision's RandomResizedCrop takes of a width x height image."""
    torch = pytest.importorskip("torch")
    transforms = pytest.importorskip("torchvision.transforms")
    torch.manual_seed(0)
    image = torch.empty(3, height, width)
    narrowest = shortest = 10**9
    for _ in range(draws):
        _, _, h, w = transforms.RandomResizedCrop.get_params(image, (fit.scale_min, 1.0), fit.ratio)
        narrowest, shortest = min(narrowest, w), min(shortest, h)
    return narrowest, shortest


@pytest.mark.parametrize("aspect", [1.0, 0.75, 0.5])
def test_every_crop_of_an_auto_sized_image_holds_the_outputs_pixels_and_a_smaller_one_would_not(aspect):
    fit = CropFit()
    side = fit.longer_side(10_000, round(10_000 * aspect))
    width, height = side, round(side * aspect)
    narrowest, shortest = _smallest_crop(width, height, fit)
    assert narrowest >= 224 and shortest >= 224, (side, narrowest, shortest)
    # the bound is tight: 10% smaller, the least crops (scale near 0.08 at the extreme ratios) fall under 224
    small = round(side * 0.9)
    narrowest, shortest = _smallest_crop(small, round(small * aspect), fit)
    assert min(narrowest, shortest) < 224


def test_the_least_area_and_the_shapes_it_gives():
    fit = CropFit()
    assert fit.least_area() == pytest.approx(224 * 224 / (0.08 * 0.75))
    assert fit.longer_side(4000, 4000) == math.ceil(math.sqrt(fit.least_area())) + 1  # 916
    assert fit.longer_side(4000, 3000) == fit.longer_side(3000, 4000) == 1057  # portrait as landscape
    assert fit.longer_side(640, 480) == 640  # never larger than it is
    evaluation = CropFit(resize_shorter=256)
    assert evaluation.longer_side(4000, 3000) == math.ceil(256 / 0.75) + 1
    assert "RandomResizedCrop(224, scale=(0.08, 1)" in fit.describe() and evaluation.describe() == "Resize(256)"
    for bad in ({"scale_min": 0.0}, {"ratio": (1.5, 1.0)}, {"size": (0, 224)}, {"resize_shorter": 0}):
        with pytest.raises(ValueError):
            CropFit(**bad)


def _photos(root, shapes):
    """Real photo content (scikit-image's astronaut) at the given sizes, one class folder."""
    data = pytest.importorskip("skimage.data")
    photo = Image.fromarray(data.astronaut())
    (root / "a").mkdir(parents=True)
    for i, (w, h) in enumerate(shapes):
        photo.resize((w, h), Image.BICUBIC).save(root / "a" / f"{i}.jpg", quality=92)
    return root


def test_an_auto_pack_stores_each_image_at_its_own_size_and_the_prediction_names_the_shrunk(tmp_path):
    pytest.importorskip("webdataset")
    shapes = [(2400, 1600), (1600, 1600), (800, 600), (3000, 2000), (1200, 1600)]
    src = _photos(tmp_path / "src", shapes)
    fit = CropFit()
    found = estimate([str(p) for p, _ in open_source(src).samples], fit, 5, quality=90)
    assert found.sampled == 5 and found.shrunk == 4 and found.decode_ms is not None
    out = tmp_path / "out"
    pack(src, out, PackOptions(format="wds", crop_fit=fit, workers=0))
    from stallscope.data import PackedImageDataset

    stored = PackedImageDataset(out)
    sizes = sorted(Image.open(io.BytesIO(stored.raw(i)[0])).size for i in range(len(stored)))
    wanted = sorted((w, h) if max(w, h) <= fit.longer_side(w, h) else
                    (round(w * fit.longer_side(w, h) / max(w, h)), round(h * fit.longer_side(w, h) / max(w, h)))
                    for w, h in shapes)
    assert sizes == wanted
    packed = sum(len(stored.raw(i)[0]) for i in range(len(stored)))
    assert abs(found.packed_bytes - packed) / packed < 0.15, (found.packed_bytes, packed)  # all re-encoded measured


def test_the_cli_refuses_a_bad_crop_before_packing(tmp_path):
    src = _photos(tmp_path / "src", [(1200, 900)])
    done = subprocess.run([sys.executable, "-m", "stallscope", "pack", str(src), str(tmp_path / "out"),
                           "--max-side", "auto", "--crop-scale", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "crop scale 0" in done.stderr and not (tmp_path / "out").exists()
    done = subprocess.run([sys.executable, "-m", "stallscope", "pack", str(src), str(tmp_path / "out"),
                           "--max-side", "big"], capture_output=True, text=True)
    assert done.returncode == 2 and "a number of pixels, or auto" in done.stderr


def _collage(width: int, height: int) -> bytes:
    """Photos at their own resolution (scikit-image's), tiled over a canvas: real detail at the pixel scale, as a
    large photo has, where an upsampled photo would be smooth."""
    data = pytest.importorskip("skimage.data")
    natives = [Image.fromarray(getattr(data, name)()).convert("RGB") for name in
               ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry")]
    canvas = Image.new("RGB", (width, height))
    x = y = k = row = 0
    while y < height:
        tile = natives[k % len(natives)]
        k += 1
        canvas.paste(tile, (x, y))
        x, row = x + tile.width, max(row, tile.height)
        if x >= width:
            x, y, row = 0, y + row, 0
    out = io.BytesIO()
    canvas.save(out, "JPEG", quality=92)
    return out.getvalue()


def _crops_psnr(original: bytes, stored: bytes, draws: int = 48):
    """PSNR of each of ``draws`` RandomResizedCrop(224) crops taken at the same relative place of both images,
    resampled to 224 x 224 by area-weighted bilinear sampling (roi_align: exact, fractional boxes on both)."""
    torch = pytest.importorskip("torch")
    ops = pytest.importorskip("torchvision.ops")
    transforms = pytest.importorskip("torchvision.transforms")
    import numpy as np

    def pixels(data: bytes):
        rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32)
        return torch.from_numpy(rgb).permute(2, 0, 1)[None]

    big, small = pixels(original), pixels(stored)
    torch.manual_seed(0)
    boxes = []
    for _ in range(draws):
        top, left, h, w = transforms.RandomResizedCrop.get_params(big[0], (0.08, 1.0), (3 / 4, 4 / 3))
        boxes.append((left / big.shape[3], top / big.shape[2], (left + w) / big.shape[3], (top + h) / big.shape[2]))

    def crops(image):
        height, width = image.shape[2:]
        scaled = torch.tensor([[0, a * width, b * height, c * width, d * height] for a, b, c, d in boxes])
        return ops.roi_align(image, scaled, output_size=224, sampling_ratio=-1, aligned=True)

    mse = ((crops(big) - crops(small)) ** 2).mean(dim=(1, 2, 3))
    return 10 * torch.log10(255.0**2 / mse.clamp_min(1e-10))


#: The worst crop's PSNR at the auto size, against the original's crop. Measured (2026-12-07, these collages, 48
#: crops each): worst 36.8-39.5 dB at the auto size; 33.0-34.9 dB at 0.7 of it and 28.7-30.6 dB at half, where the
#: smallest crops are upsampled. 36 dB is an RMS error of 4 levels in 255.
CROP_PSNR_DB = 36.0


@pytest.mark.parametrize("shape", [(2400, 1600), (1800, 1350), (1200, 1200)])
def test_the_crops_of_an_auto_sized_image_are_those_of_the_original(shape):
    """The crop-equivalence proof: the same 48 random crops of the original and of the image stored at the auto
    size (shrunk with Lanczos, re-encoded at quality 90) differ by no more than CROP_PSNR_DB allows; 30% smaller,
    the worst crop does not hold it (the bound sits where crops start to lose detail)."""
    from stallscope.data.packing.prepare import shrink

    original = _collage(*shape)
    fit = CropFit()
    side = fit.longer_side(*shape)
    assert _crops_psnr(original, shrink(original, side, 90)[0]).min() >= CROP_PSNR_DB
    assert _crops_psnr(original, shrink(original, int(side * 0.7), 90)[0]).min() < CROP_PSNR_DB


@pytest.mark.parametrize("shape", [(256, 192), (500, 375), (900, 600)])
def test_images_already_below_the_auto_size_are_stored_as_they_are(tmp_path, shape):
    """The small and ImageNet-sized bands: nothing to shrink, the bytes kept (no re-encode, no loss)."""
    from stallscope.data.packing.prepare import prepare

    path = tmp_path / "x.jpg"
    path.write_bytes(_collage(*shape))
    prepared = prepare((0, str(path), "x.jpg", 0, CropFit(), 90))
    assert prepared.data == path.read_bytes()
