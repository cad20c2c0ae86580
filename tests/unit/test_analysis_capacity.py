"""The throughput model: exact rates on hand-set costs."""

from __future__ import annotations

import pytest

from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.recommend import best_worker_count


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


def test_helper_processes_share_the_cpu_budget():
    # a local data server the script started burns 10 ms of CPU per sample it serves
    m = model(cost_s={"decode": 0.001, "storage": 0.040}, usable_cpus=2.0, helper_cpu_per_sample_s=0.010)
    assert m.rate(workers=8) == pytest.approx(2.0 / (0.001 + 0.002 + 0.010))  # CPU-bound, not 8 / 41 ms
    assert model(cost_s={"decode": 0.001, "storage": 0.040}, usable_cpus=2.0).rate(workers=8) == \
        pytest.approx(8 / 0.041)


def test_helper_cpu_counts_descendants_of_the_training_process_only():
    from dataclasses import replace

    from stallscope.analysis.system_metrics import helper_cpu_between
    from stallscope.session import WorkerStartRecord
    from tests.unit.test_analysis_pitfalls import base

    session = base()
    main = session.main_pid

    def proc(ppid, cores):
        return {"ppid": ppid, "ticks": list(range(11)), "cpu_s": [cores * 0.1 * k for k in range(11)]}

    samples = {"t_ns": [k * 100_000_000 for k in range(11)], "interval_s": 0.1, "processes": {
        str(main): proc(1, 1.0), "501": proc(main, 0.9),  # the training process and a worker
        "600": proc(main, 0.5), "601": proc(600, 0.25),   # a server it started, and that server's child
        "700": proc(1, 0.8)}}                             # unrelated: not the job's
    session = replace(session, system_samples=samples, worker_starts=[WorkerStartRecord(0, 0, 0, 501, 0, 1, 2, {})])
    assert helper_cpu_between(session, main, 0, 1_000_000_000) == pytest.approx(0.75)
