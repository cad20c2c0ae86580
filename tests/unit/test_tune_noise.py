"""Throughput and noise from per-step times (stallscope.tuning.noise): exact numbers, no runs."""

from __future__ import annotations

import math

import pytest

from stallscope.tuning.noise import Rate, better, rate_of, warmup_steps, within_noise


def test_rate_is_work_over_time() -> None:
    rate = rate_of([0.1] * 16, [8.0] * 16)
    assert rate is not None
    assert rate.value == pytest.approx(80.0)
    assert rate.se == pytest.approx(0.0)
    assert rate.steps == 16


def test_steps_per_second_without_work() -> None:
    assert rate_of([0.5, 0.5, 0.5, 0.5]).value == pytest.approx(2.0)


def test_batch_means_error_sees_alternating_blocks() -> None:
    # 16 steps, 4 blocks of 4: two blocks at 0.1 s per step, two at 0.2 s per step.
    durations = [0.1] * 4 + [0.2] * 4 + [0.1] * 4 + [0.2] * 4
    rate = rate_of(durations)
    assert rate.value == pytest.approx(16 / 2.4)
    block_times = [0.1, 0.2, 0.1, 0.2]  # seconds per step, one observation per block
    mean = sum(block_times) / 4
    sd = math.sqrt(sum((t - mean) ** 2 for t in block_times) / 3)
    assert rate.se == pytest.approx(rate.value * (sd / 2) / mean)


def test_a_block_of_prefetched_batches_does_not_blow_up_the_error() -> None:
    # 16 steps: one block of 4 batches the workers had queued (0.1 ms each), three at 10 ms. Block rates would be
    # 10000/s and 100/s, a spread of rates far beyond the rate itself; block times keep the error below the rate.
    durations = [0.0001] * 4 + [0.01] * 12
    rate = rate_of(durations)
    assert rate.value == pytest.approx(16 / 0.1204)
    assert 0 < rate.se < rate.value / 2
    # Block times 0.0001, 0.01, 0.01, 0.01 s per step: sd 0.00495 s, over sqrt(4) blocks, over a mean of 0.007525 s.
    assert rate.se == pytest.approx(rate.value * 0.3289, rel=0.01)


def test_too_few_steps_are_very_noisy() -> None:
    rate = rate_of([0.1, 0.1, 0.1])
    assert rate.se == rate.value
    assert rate_of([]) is None
    assert rate_of([0.0, 0.0]) is None


def test_better_needs_two_standard_errors() -> None:
    base = Rate(100.0, 3.0, 30)
    assert better(Rate(110.5, 4.0, 30), base)  # 10.5 > 2 * 5
    assert not better(Rate(109.0, 4.0, 30), base)  # 9 < 10
    assert within_noise(Rate(109.0, 4.0, 30), base)
    assert not better(base, base)


def test_warmup_discards_prefetched_batches_but_at_most_a_third() -> None:
    assert warmup_steps(60, workers=0, prefetch_factor=None) == 1
    assert warmup_steps(60, workers=4, prefetch_factor=2) == 9
    assert warmup_steps(60, workers=4, prefetch_factor=None) == 9  # torch's default prefetch is 2
    assert warmup_steps(60, workers=4, prefetch_factor=2, batches_per_step=2) == 5
    assert warmup_steps(12, workers=8, prefetch_factor=4) == 4
    assert warmup_steps(60, workers=0, prefetch_factor=None, recorded_warmup=3) == 3
