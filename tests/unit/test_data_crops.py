"""Crop sampling: equal in distribution to torchvision's RandomResizedCrop, checked with a KS test."""

from __future__ import annotations

import math
import random

import pytest
import torch

from stallscope.data.crops import CropPlan, FullImage, RandomResizedCrop, ResizeCenterCrop

N = 4000


def ks_statistic(a: list[float], b: list[float]) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a, b = sorted(a), sorted(b)
    i = j = 0
    d = 0.0
    while i < len(a) and j < len(b):
        x = min(a[i], b[j])
        while i < len(a) and a[i] <= x:
            i += 1
        while j < len(b) and b[j] <= x:
            j += 1
        d = max(d, abs(i / len(a) - j / len(b)))
    return d


def ks_critical(n: int, m: int, alpha: float = 0.001) -> float:
    c = math.sqrt(-0.5 * math.log(alpha / 2))
    return c * math.sqrt((n + m) / (n * m))


def torchvision_params(width: int, height: int, scale, ratio, n: int) -> list[tuple[int, int, int, int]]:
    from torchvision.transforms import RandomResizedCrop as TVCrop

    torch.manual_seed(1234)
    img = torch.empty(3, height, width)
    return [TVCrop.get_params(img, list(scale), list(ratio)) for _ in range(n)]


def our_params(width: int, height: int, crop: RandomResizedCrop, n: int) -> list[tuple[int, int, int, int]]:
    rng = random.Random(99)
    return [crop.sample_box(width, height, rng) for _ in range(n)]


def _distributions_match(ours, theirs) -> list[str]:
    failures = []
    for k, name in enumerate(("top", "left", "height", "width")):
        d = ks_statistic([p[k] for p in ours], [p[k] for p in theirs])
        if d > ks_critical(len(ours), len(theirs)):
            failures.append(f"{name}: KS D={d:.3f}")
    return failures


@pytest.mark.parametrize("size", [(500, 400), (400, 500), (256, 256), (1000, 120)])
def test_crop_parameters_match_torchvision(size):
    width, height = size
    crop = RandomResizedCrop(224)
    failures = _distributions_match(our_params(width, height, crop, N),
                                    torchvision_params(width, height, crop.scale, crop.ratio, N))
    assert not failures, failures


def test_ks_test_detects_a_different_distribution():
    """The same test must fail when the scale range differs: otherwise it proves nothing."""
    ours = our_params(500, 400, RandomResizedCrop(224, scale=(0.25, 1.0)), N)
    theirs = torchvision_params(500, 400, (0.08, 1.0), (3 / 4, 4 / 3), N)
    assert _distributions_match(ours, theirs)


def test_custom_scale_and_ratio_match_torchvision():
    crop = RandomResizedCrop(160, scale=(0.35, 1.0), ratio=(0.5, 2.0))
    failures = _distributions_match(our_params(480, 360, crop, N),
                                    torchvision_params(480, 360, crop.scale, crop.ratio, N))
    assert not failures, failures


def test_fallback_central_crop_equals_torchvision_exactly():
    crop = RandomResizedCrop(224, scale=(0.99, 1.0), ratio=(1.0, 1.0))
    ours = crop.sample_box(1000, 100, random.Random(0))
    (theirs,) = torchvision_params(1000, 100, crop.scale, crop.ratio, 1)
    assert ours == theirs


def test_flip_probability_is_one_half():
    crop = RandomResizedCrop(224)
    rng = random.Random(5)
    flips = sum(crop.plan(500, 400, rng).flip for _ in range(N))
    # Binomial(4000, 0.5): sd ~ 31.6; 4 sd bound.
    assert abs(flips - N / 2) < 4 * math.sqrt(N / 4)


def test_plans_are_inside_the_image():
    crop = RandomResizedCrop((200, 300))
    rng = random.Random(1)
    for _ in range(2000):
        p = crop.plan(333, 257, rng)
        assert 0 <= p.left and p.left + p.width <= 333 and 0 <= p.top and p.top + p.height <= 257
        assert (p.out_height, p.out_width) == (200, 300)


def test_resize_center_crop_matches_torchvision_box():
    for width, height in [(500, 400), (400, 500), (300, 300), (1024, 683)]:
        plan = ResizeCenterCrop(256, 224).plan(width, height)
        # torchvision: Resize(256) then CenterCrop(224) keeps this fraction of the short side.
        short = min(width, height)
        assert plan.width == pytest.approx(224 * short / 256, abs=1.5)
        assert plan.height == pytest.approx(224 * short / 256, abs=1.5)
        assert plan.left + plan.width / 2 == pytest.approx(width / 2, abs=1.5)
        assert plan.top + plan.height / 2 == pytest.approx(height / 2, abs=1.5)


def test_dct_scale_keeps_output_resolution():
    assert CropPlan(0, 0, 500, 400, 224, 224).dct_scale() == 1
    assert CropPlan(0, 0, 1000, 900, 224, 224).dct_scale() == 4
    assert CropPlan(0, 0, 4000, 3000, 224, 224).dct_scale() == 8
    assert CropPlan(0, 0, 4000, 3000, 224, 224).dct_scale(max_scale=2) == 2


def test_full_image_and_bad_arguments():
    assert FullImage().plan(50, 40) == CropPlan(0, 0, 50, 40, 50, 40, False)
    with pytest.raises(ValueError):
        RandomResizedCrop(224, scale=(0.5, 0.1))
    with pytest.raises(ValueError):
        RandomResizedCrop(224, hflip=2.0)
    with pytest.raises(ValueError):
        ResizeCenterCrop(0, 224)
