"""The throughput model: exact rates on hand-set costs."""

from __future__ import annotations

import pytest

from stallscope.analyze.capacity import ThroughputModel
from stallscope.analyze.recommend import best_worker_count


def model(**kw) -> ThroughputModel:
    base = dict(cost_s={"decode": 0.004, "transform": 0.004, "loader": 0.0, "storage": 0.0},
                compute_per_sample_s=0.002, main_cpu_per_sample_s=0.002, workers=1, usable_cpus=4.0)
    base.update(kw)
    return ThroughputModel(**base)


def test_workers_scale_until_the_cpu_budget():
    m = model()
    assert m.rate() == pytest.approx(125.0)  # one worker, 8 ms per sample
    assert m.rate(workers=2) == pytest.approx(250.0)
    # 4 cores / (8 ms worker CPU + 2 ms training CPU) = 400/s; compute allows 500/s.
    assert m.rate(workers=8) == pytest.approx(400.0)
    assert best_worker_count(m, 4) == (4, pytest.approx(3.2))


def test_zero_workers_adds_costs():
    m = model(workers=0)
    assert m.rate() == pytest.approx(1 / 0.010)
    assert m.speedup(workers=2) == pytest.approx(250 / 100)


def test_blocking_io_overlaps_beyond_cores():
    m = model(cost_s={"decode": 0.001, "storage": 0.040}, usable_cpus=2.0)
    assert m.rate() == pytest.approx(1 / 0.041)
    assert m.rate(workers=8) == pytest.approx(8 / 0.041)
    workers, gain = best_worker_count(m, 2)
    assert workers > 2 and gain > 4


def test_compute_bound_gains_nothing_from_input_fixes():
    m = model(compute_per_sample_s=0.050, workers=2)
    assert m.speedup(workers=4) == pytest.approx(1.0)
    assert m.speedup(scale={"decode": 0.5}) == pytest.approx(1.0)


def test_stage_capacity_reports_each_stage_alone():
    caps = model(workers=2).stage_capacity()
    assert caps["decode"] == pytest.approx(2 / 0.004)
    assert caps["loader"] is None and caps["storage"] is None
    assert caps["compute"] == pytest.approx(500.0)
