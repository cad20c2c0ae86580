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
