"""The throughput model behind predicted speedups."""

from __future__ import annotations

import pytest

from stallscope.analyze.recommend import predicted_step_s


def test_zero_workers_is_serial():
    assert predicted_step_s(0.05, 0.2, 0.2, 1, workers=0, usable_cpus=8) == pytest.approx(0.25)


def test_workers_overlap_until_cores_run_out():
    # 200 ms of CPU per batch, 50 ms of compute: 4 workers on 8 cores keep up with 50 ms steps.
    assert predicted_step_s(0.05, 0.2, 0.2, 1, workers=4, usable_cpus=8) == pytest.approx(0.05)
    # On 2 cores the CPU work (compute + decode) sets the pace, however many workers.
    assert predicted_step_s(0.05, 0.2, 0.2, 1, workers=8, usable_cpus=2) == pytest.approx(0.125)


def test_io_bound_workers_scale_beyond_cores():
    # 100 ms per batch of which 10 ms CPU: blocking I/O overlaps across many workers.
    assert predicted_step_s(0.01, 0.1, 0.01, 1, workers=10, usable_cpus=2) == pytest.approx(0.01)
    assert predicted_step_s(0.01, 0.1, 0.01, 1, workers=2, usable_cpus=2) == pytest.approx(0.05)
