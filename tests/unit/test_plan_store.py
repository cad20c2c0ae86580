"""The plan's object store: the requests in flight its rate needs, from a saved doctor probe and the run's requests."""

from __future__ import annotations

import dataclasses

import pytest

from stallscope.analysis.plan_store import store_need
from stallscope.analysis.store_requests import RequestStats
from stallscope.health.object_store import Level, StoreProbe, store_checks
from stallscope.render.plan import store_words

DOCTOR = {"checks": [
    {"id": "store-latency", "data": {"url": "s3://data/images/", "endpoint": "http://127.0.0.1:9000",
                                     "objects_listed": 400, "first_byte_ms_median": 21.0, "request_ms_median": 22.0,
                                     "object_bytes_median": 24_000,
                                     "levels": [{"connections": 1, "objects_per_s": 44.0, "mb_per_s": 1.1, "failed": 0},
                                                {"connections": 2, "objects_per_s": 88.0, "mb_per_s": 2.1, "failed": 0},
                                                {"connections": 4, "objects_per_s": 170.0, "mb_per_s": 4.1,
                                                 "failed": 0}]}},
    {"id": "cpu.usable", "data": {}}]}


def _requests(per_sample: float, in_flight: float) -> RequestStats:
    """1,000 samples' requests over 10 s of loading: ``in_flight`` requests of 22 ms on the network at once."""
    requests = 1000 * per_sample
    return RequestStats(requests=requests, samples=1000, batches=125, first_byte_s=in_flight * 10 * 0.95,
                        body_s=in_flight * 10 * 0.05, connect_s=0.0, body_bytes=24_000 * requests, failed=0,
                        connections=4, client_cpu_s=1.0, storage_s=in_flight * 10, loading_s=10.0, client="boto3")


def test_a_saved_doctor_probe_is_read_back_with_its_levels():
    probe = StoreProbe.from_doctor(DOCTOR)
    assert probe.url == "s3://data/images/" and probe.request_median_s == pytest.approx(0.022)
    assert [lv.objects_per_s for lv in probe.levels] == [44.0, 88.0, 170.0]
    assert probe.connections_for(80.0) == (2, True)
    assert probe.connections_for(500.0) == (11, False)  # past the sweep: Little's law, 500/s x 22 ms
    with pytest.raises(ValueError, match="no object-store probe"):
        StoreProbe.from_doctor({"checks": [{"id": "cpu.usable", "data": {}}]})
    for not_a_report in ([1, 2], "text", {"checks": "none"}):
        with pytest.raises(ValueError, match="not a doctor report"):
            StoreProbe.from_doctor(not_a_report)  # type: ignore[arg-type]


def test_workers_that_keep_enough_in_flight_are_said_to():
    need = store_need(StoreProbe.from_doctor(DOCTOR), _requests(1.0, 0.9), samples_per_s=150.0, workers=4,
                      recorded_workers=1)
    assert need is not None
    assert (need.objects_per_s, need.connections, need.reached) == (150.0, 4, True)
    assert need.in_flight_planned == pytest.approx(3.6) and not need.enough  # 3.6 in flight against 4
    words = store_words(need)
    assert "150 objects/s (1.00 a sample)" in words and "with 4 request(s) in flight" in words
    assert "short of 4; keep 1 request(s) in flight a worker" in words
    more = store_need(StoreProbe.from_doctor(DOCTOR), _requests(1.0, 0.9), 150.0, workers=8, recorded_workers=1)
    assert more is not None and more.enough and store_words(more).endswith(": enough")


def test_a_rate_past_one_process_needs_more_processes_and_a_run_without_requests_none():
    need = store_need(StoreProbe.from_doctor(DOCTOR), _requests(2.0, 3.0), samples_per_s=400.0, workers=4,
                      recorded_workers=2)
    assert need is not None and not need.reached
    assert need.objects_per_s == 800.0 and need.processes == 5 and need.connections == 18  # ceil(800 x 0.022)
    assert "spread over at least 5 processes" in store_words(need)
    assert need.per_worker_needed == 5 and "keep 5 request(s) in flight a worker" in store_words(need)
    assert store_need(StoreProbe.from_doctor(DOCTOR), None, 400.0, 4, 2) is None


def _with_processes(levels: list[dict], cpus: float = 8.0) -> StoreProbe:
    """The doctor probe above, its best level (4 connections, 170/s) also run from several processes."""
    probe = StoreProbe.from_doctor(DOCTOR)
    return dataclasses.replace(probe, cpus=cpus, process_levels=[
        Level(4 * lv["processes"], int(lv["objects_per_s"] * 2), 2.0, int(lv["objects_per_s"] * 2 * 24_000), 0,
              processes=lv["processes"], cpu_s=2.0 * lv["cpus_used"]) for lv in levels])


def test_processes_that_read_more_together_make_the_client_the_limit():
    probe = _with_processes([{"processes": 2, "objects_per_s": 330.0, "cpus_used": 1.0},
                             {"processes": 4, "objects_per_s": 600.0, "cpus_used": 2.0}])
    assert probe.limit == "client" and probe.highest is not None and probe.highest.objects_per_s == 600.0
    checks = {c.id: c for c in store_checks(probe, None)}
    assert "one process's client is the limit" in checks["store-limit"].why
    assert "3.5x as much together" in checks["store-limit"].why  # 600 against 170


def test_processes_that_read_no_more_with_cores_to_spare_make_the_store_the_limit_and_it_caps_the_plan():
    probe = _with_processes([{"processes": 2, "objects_per_s": 175.0, "cpus_used": 0.6},
                             {"processes": 4, "objects_per_s": 180.0, "cpus_used": 0.8}])
    assert probe.limit == "store"
    need = store_need(probe, _requests(1.0, 0.9), samples_per_s=400.0, workers=8, recorded_workers=1)
    assert need is not None and need.store_caps and need.capped_samples_per_s == pytest.approx(180.0)
    assert "expect at most 180 samples/s from it" in store_words(need)
    under = store_need(probe, _requests(1.0, 0.9), samples_per_s=150.0, workers=8, recorded_workers=1)
    assert under is not None and not under.store_caps and "expect at most" not in store_words(under)


def test_processes_that_took_the_cores_make_the_cpus_the_limit_not_the_store():
    probe = _with_processes([{"processes": 2, "objects_per_s": 175.0, "cpus_used": 1.9},
                             {"processes": 4, "objects_per_s": 172.0, "cpus_used": 1.95}], cpus=2.0)
    assert probe.limit == "cpus"
    need = store_need(probe, _requests(1.0, 0.9), samples_per_s=400.0, workers=8, recorded_workers=1)
    assert need is not None and not need.store_caps


def test_the_limit_is_read_back_from_a_saved_probe():
    probe = _with_processes([{"processes": 2, "objects_per_s": 175.0, "cpus_used": 0.6}])
    document = {"checks": [{"id": c.id, "data": c.data} for c in store_checks(probe, None)]}
    again = StoreProbe.from_doctor(document)
    assert again.limit == "store" and again.cpus == 8.0
    assert [(lv.processes, lv.connections, lv.objects_per_s) for lv in again.process_levels] == [(2, 8, 175.0)]
    assert StoreProbe.from_doctor(DOCTOR).limit is None  # a probe saved before processes were swept
