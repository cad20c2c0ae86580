"""The demo's before/after measurement: the order of its runs and the speedup of the pairs."""

import math

import pytest

from stallscope.cli.demo_cmd import paired_speedup, verification_order


def test_one_pair_is_the_after_run_alone():
    # the diagnosis run is the first before; one pair adds only its after
    assert verification_order(1) == ["after"]


def test_pairs_alternate_so_that_a_steady_drift_cancels():
    # with the diagnosis run first: before, after | after, before | before, after | after, before
    assert verification_order(2) == ["after", "after", "before"]
    assert verification_order(4) == ["after", "after", "before", "before", "after", "after", "before"]


def test_a_drift_steady_over_the_runs_cancels_in_two_pairs():
    # a machine that gets 10% slower with every run; the change doubles the speed
    speed = [1.0, 0.9, 0.81, 0.729]  # runs 1..4: before, after, after, before
    before = [100 * speed[0], 100 * speed[3]]
    after = [200 * speed[1], 200 * speed[2]]
    assert paired_speedup(before[:1], after[:1])[0] == pytest.approx(1.8)  # one pair: the drift's 10% in it
    speedup, low, high = paired_speedup(before, after)
    assert speedup == pytest.approx(2.0)
    assert (low, high) == pytest.approx((1.8, 2.0 * 0.81 / 0.729))


def test_the_speedup_is_the_geometric_mean_of_the_pairs():
    speedup, low, high = paired_speedup([200.0, 250.0], [300.0, 500.0])
    assert speedup == pytest.approx(math.sqrt(1.5 * 2.0))
    assert (low, high) == (1.5, 2.0)


def test_pairs_must_match():
    with pytest.raises(ValueError):
        paired_speedup([1.0, 2.0], [1.0])
