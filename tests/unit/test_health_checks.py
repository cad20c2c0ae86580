"""The Check/DoctorReport data model: round trips, validation, and number formatting."""

from __future__ import annotations

import json

import pytest

from stallscope.health.checks import (
    DOCTOR_SCHEMA,
    Check,
    DoctorReport,
    fmt_bytes,
    fmt_rate,
    not_applicable,
    unknown,
)


def test_check_round_trips_through_json() -> None:
    check = Check("shm", "/dev/shm", "fail", "64 MiB vs 588 MiB", ">= 2x", "why", "fix", {"size_bytes": 67108864})
    again = Check.from_dict(json.loads(json.dumps(check.to_dict())))
    assert again == check


def test_check_rejects_unknown_status() -> None:
    with pytest.raises(ValueError, match="status"):
        Check("x", "x", "ok", "1")


def test_unknown_carries_reason_and_no_value() -> None:
    check = unknown("memory", "memory", "/proc/meminfo: permission denied")
    assert check.status == "unknown"
    assert check.value == "unknown: /proc/meminfo: permission denied"
    assert check.data == {"reason": "/proc/meminfo: permission denied"}
    assert not_applicable("gpu", "GPUs", "no GPU").status == "n/a"


def test_report_schema_counts_and_worst() -> None:
    report = DoctorReport((Check("a", "a", "pass", "1"), Check("b", "b", "warn", "2"), Check("c", "c", "n/a", "-")),
                          data_dir="/d", elapsed_s=1.23456)
    raw = report.to_dict()
    assert raw["schema"] == DOCTOR_SCHEMA == "stallscope.health/1"
    assert [c["id"] for c in raw["checks"]] == ["a", "b", "c"]
    assert raw["elapsed_s"] == 1.235
    assert report.worst == "warn" and report.count("pass") == 1
    assert report.by_id("b").value == "2" and report.by_id("zz") is None
    assert DoctorReport.from_dict(raw).checks == report.checks
    with pytest.raises(ValueError, match="not a doctor report"):
        DoctorReport.from_dict({"schema": "stallscope.summary/1"})
    failed = DoctorReport((Check("a", "a", "warn", "1"), Check("b", "b", "fail", "2")))
    assert failed.worst == "fail"


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
                                     (64 << 20, "64 MiB"), (150 << 30, "150 GiB"), (None, "?")])
def test_fmt_bytes(n: int | None, text: str) -> None:
    assert fmt_bytes(n) == text


def test_fmt_rate() -> None:
    assert fmt_rate(2 << 20) == "2 MiB/s"
    assert fmt_rate(None) == "?"
