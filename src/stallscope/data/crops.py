"""Crop plans computed from an image's header size, before any pixel is decoded.

torchvision decodes the whole image and then picks a crop. Picking the crop first, from the
size in the JPEG header, tells the decoder how small it may decode (DCT scaling) and lets the
resize touch only the pixels that survive. The sampling below follows torchvision's
``RandomResizedCrop.get_params`` step for step, so the crops are equal in distribution; only
the random number source differs (a per-process ``random.Random``, see :func:`process_rng`).
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class CropPlan:
    """What to cut from the full-size image and what to produce from it.

    ``left, top, width, height`` are in full-resolution pixel coordinates; ``out_width`` and
    ``out_height`` are the output size; ``flip`` asks for a horizontal flip of the output.
    """

    left: int
    top: int
    width: int
    height: int
    out_width: int
    out_height: int
    flip: bool = False

    def dct_scale(self, max_scale: int = 8) -> int:
        """Largest power-of-two DCT reduction (1, 2, 4, 8) that keeps the crop at least output size.

        Decoding at 1/s costs roughly 1/s^2 of the IDCT and colour work, and the crop then needs
        a resize no larger than 2x down, so a bilinear resize stays free of aliasing.
        """
        scale = 1
        while scale * 2 <= max_scale and (
            self.width // (scale * 2) >= self.out_width and self.height // (scale * 2) >= self.out_height
        ):
            scale *= 2
        return scale


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    """(height, width) from an int or a pair, as torchvision reads ``size``."""
    if isinstance(size, int):
        return size, size
    if len(size) != 2:
        raise ValueError(f"size must be an int or (height, width), got {size!r}")
    return int(size[0]), int(size[1])


_RNG: tuple[int, int, random.Random] | None = None


def process_rng() -> random.Random:
    """A ``random.Random`` private to this process, seeded from ``torch.initial_seed()``.

    DataLoader gives each worker its own torch seed (base seed + worker id) under fork and
    spawn alike, so deriving from it makes worker streams distinct and reproducible under
    ``torch.manual_seed``. The pid check re-seeds after a fork that did not go through the
    DataLoader, so two children never share a stream.
    """
    global _RNG
    pid = os.getpid()
    try:
        import torch

        seed = int(torch.initial_seed())
    except ImportError:  # pragma: no cover - torch is always present where datasets are used
        seed = random.SystemRandom().getrandbits(63)
    if _RNG is None or _RNG[0] != pid or _RNG[1] != seed:
        _RNG = (pid, seed, random.Random(seed ^ (pid << 20)))
    return _RNG[2]


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` plus ``RandomHorizontalFlip(hflip)``."""

    size: int | tuple[int, int] = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    hflip: float = 0.5

    def __post_init__(self) -> None:
        _pair(self.size)
        if not (0 < self.scale[0] <= self.scale[1]):
            raise ValueError(f"scale must be (low, high) with 0 < low <= high, got {self.scale!r}")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise ValueError(f"ratio must be (low, high) with 0 < low <= high, got {self.ratio!r}")
        if not 0.0 <= self.hflip <= 1.0:
            raise ValueError(f"hflip is a probability in [0, 1], got {self.hflip!r}")

    def sample_box(self, width: int, height: int, rng: random.Random) -> tuple[int, int, int, int]:
        """(top, left, h, w) exactly as ``torchvision.transforms.RandomResizedCrop.get_params``."""
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_lo, log_hi))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = rng.randint(0, height - h)
                left = rng.randint(0, width - w)
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w = width
            h = int(round(w / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h = height
            w = int(round(h * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def plan(self, width: int, height: int, rng: random.Random | None = None) -> CropPlan:
        rng = rng or process_rng()
        top, left, h, w = self.sample_box(width, height, rng)
        out_h, out_w = _pair(self.size)
        flip = self.hflip > 0 and rng.random() < self.hflip
        return CropPlan(left, top, w, h, out_w, out_h, flip)


@dataclass(frozen=True)
class ResizeCenterCrop:
    """torchvision's evaluation recipe ``Resize(resize)`` then ``CenterCrop(size)``, as one crop.

    ``Resize(256)`` scales the shorter side to 256 and ``CenterCrop(224)`` keeps the middle; the
    same pixels are the centred box of side ``224 / 256`` of the shorter side in the original, so
    the decoder can skip the rest.
    """

    resize: int = 256
    size: int | tuple[int, int] = 224

    def __post_init__(self) -> None:
        out_h, out_w = _pair(self.size)
        if self.resize <= 0 or out_h <= 0 or out_w <= 0:
            raise ValueError(f"resize and size must be positive, got {self.resize!r}, {self.size!r}")

    def plan(self, width: int, height: int, rng: random.Random | None = None) -> CropPlan:
        out_h, out_w = _pair(self.size)
        if width <= height:
            resized_w, resized_h = self.resize, int(self.resize * height / width)
        else:
            resized_w, resized_h = int(self.resize * width / height), self.resize
        # torchvision's CenterCrop offsets in resized pixels, mapped back to the original.
        crop_top = int(round((resized_h - out_h) / 2.0))
        crop_left = int(round((resized_w - out_w) / 2.0))
        sx, sy = width / resized_w, height / resized_h
        left = max(0, int(round(crop_left * sx)))
        top = max(0, int(round(crop_top * sy)))
        w = min(width - left, max(1, int(round(out_w * sx))))
        h = min(height - top, max(1, int(round(out_h * sy))))
        return CropPlan(left, top, w, h, out_w, out_h, False)


@dataclass(frozen=True)
class FullImage:
    """No crop: decode the whole image at full size (what ``ToTensor`` alone would see)."""

    def plan(self, width: int, height: int, rng: random.Random | None = None) -> CropPlan:
        return CropPlan(0, 0, width, height, width, height, False)


#: Anything with ``plan(width, height, rng) -> CropPlan``.
CropSpec = RandomResizedCrop | ResizeCenterCrop | FullImage
