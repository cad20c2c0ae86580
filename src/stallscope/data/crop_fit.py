"""The smallest image that keeps a training crop the same: ``pack --max-side auto``.

A training transform such as ``RandomResizedCrop(224)`` takes a crop of ``scale`` times the image's area, of aspect
``ratio``, and resizes it to 224 x 224. Stored larger than needed, an image costs decode time for pixels the resize
throws away; stored too small, some crops are upsampled and the model sees blurrier inputs than it did. The size
that is just enough: the smallest crop the transform can take (the least scale at the extreme ratios) still holds
the output's pixels across, in both directions. For an image of longer side ``L`` and aspect ``a`` (shorter over
longer side) the area is ``a L^2``, so ``L`` follows from the least area the crops need, image by image.

An evaluation transform ``Resize(S)`` then ``CenterCrop`` needs the shorter side to be at least ``S``.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CropFit:
    """The training's crop, as ``RandomResizedCrop(size, scale=(scale_min, ...), ratio=ratio)``; or, with
    ``resize_shorter``, an evaluation's ``Resize(resize_shorter)`` (its centre crop is smaller)."""
    size: tuple[int, int] = (224, 224)  # the crop's output (height, width)
    scale_min: float = 0.08
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    resize_shorter: int | None = None

    def __post_init__(self) -> None:
        if min(self.size) < 1:
            raise ValueError(f"crop size {self.size}: at least 1 pixel each way")
        if not 0 < self.scale_min <= 1:
            raise ValueError(f"crop scale {self.scale_min}: above 0 and at most 1")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"crop ratio {self.ratio}: two positive numbers, the smaller first")
        if self.resize_shorter is not None and self.resize_shorter < 1:
            raise ValueError(f"resize {self.resize_shorter}: at least 1 pixel")

    def least_area(self) -> float:
        """The image area (pixels) at which the smallest crop holds the output's pixels across in both directions:
        its width ``sqrt(scale * A * r)`` is least at the smallest ratio, its height ``sqrt(scale * A / r)`` at the
        largest."""
        height, width = self.size
        return max(width * width / (self.scale_min * self.ratio[0]), height * height * self.ratio[1] / self.scale_min)

    def longer_side(self, width: int, height: int) -> int:
        """The smallest longer side an image of this shape can be stored at, keeping every crop as sharp as the
        original gives it (one pixel of margin for the transform's rounding); never more than it is."""
        longer, shorter = max(width, height), min(width, height)
        if shorter < 1:
            return longer
        aspect = shorter / longer
        if self.resize_shorter is not None:
            needed = math.ceil(self.resize_shorter / aspect)
        else:
            needed = math.ceil(math.sqrt(self.least_area() / aspect))
        return min(longer, needed + 1)

    def describe(self) -> str:
        if self.resize_shorter is not None:
            return f"Resize({self.resize_shorter})"
        height, width = self.size
        size = str(width) if width == height else f"({height}, {width})"
        return (f"RandomResizedCrop({size}, scale=({self.scale_min:g}, 1), "
                f"ratio=({self.ratio[0]:.3g}, {self.ratio[1]:.3g}))")


@dataclass(frozen=True)
class AutoPackEstimate:
    """What ``pack --max-side auto`` is predicted to store, from a sample of the source."""
    sampled: int
    shrunk: int  # of the sampled, the images stored smaller
    pixels_kept: float  # the packed pixels over the originals', over the sample
    original_bytes: int  # the whole source, estimated from the sample's mean
    packed_bytes: int  # likewise, with the shrunk images' bytes as re-encoding a few of them measured
    decode_ms: tuple[float, float] | None  # a full decode (Pillow) of the measured images, original and packed


def estimate(paths: list[str], fit: CropFit, total: int, quality: int = 90, sample: int = 200,
             measured: int = 12) -> AutoPackEstimate:
    """The auto-sized pack of ``total`` images, predicted from up to ``sample`` of ``paths`` spread over the list:
    each one's header gives its size, its file its bytes. ``measured`` of the images to shrink are re-encoded as the
    pack will (at ``quality``) and both versions decoded: their bytes per pixel, packed against original, scale the
    other shrunk images' bytes, and their decode times are the prediction's."""
    import time

    from PIL import Image

    from stallscope.data.headers import HeaderError, read_header
    from stallscope.data.packing.prepare import _shrink

    step = max(1, len(paths) // sample) if paths else 1
    chosen = paths[::step][:sample]
    pixels = kept = original = unchanged = shrunk_naive = 0.0
    read = shrunk = 0
    trials: list[tuple[float, int, float, float]] = []  # naive bytes, re-encoded bytes, decode s (orig., packed)

    def decode_s(data: bytes) -> float:
        began = time.perf_counter()
        with Image.open(io.BytesIO(data)) as im:
            im.load()
        return time.perf_counter() - began

    for path in chosen:
        try:
            with open(path, "rb") as f:
                data = f.read()
            header = read_header(data)
        except (OSError, HeaderError):
            continue
        width, height = header.width, header.height
        longer = max(width, height)
        side = fit.longer_side(width, height)
        fraction = (side / longer) ** 2 if side < longer else 1.0
        read += 1
        pixels += width * height
        kept += width * height * fraction
        original += len(data)
        if side >= longer:
            unchanged += len(data)
            continue
        shrunk += 1
        shrunk_naive += len(data) * fraction
        if len(trials) < measured:
            try:
                packed_data = _shrink(data, side, quality)[0]
                trials.append((len(data) * fraction, len(packed_data), decode_s(data), decode_s(packed_data)))
            except Exception:  # noqa: BLE001, S112 - an image the pack will report as bad: left out here
                continue
    correction = sum(t[1] for t in trials) / sum(t[0] for t in trials) if trials else 1.0
    scale = total / read if read else 0.0
    packed = (unchanged + correction * shrunk_naive) * scale
    decode = (sum(t[2] for t in trials) / len(trials) * 1e3, sum(t[3] for t in trials) / len(trials) * 1e3) \
        if trials else None
    return AutoPackEstimate(read, shrunk, kept / pixels if pixels else 1.0, int(original * scale), int(packed),
                            decode)
