"""The CPU capacity probe: its figure from stand-in loop rates (exact), which CPUs it pins to on a fake machine, and
the real forked loops on this one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stallscope.health.cpu_probe import check_cpu_capacity, cpus_to_probe, effective_cpus, loop_rates
from stallscope.health.host import Host
from tests.unit.test_health_system import machine, put, smt_topology

LIVE = Host()
needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")


def rates_of(alone: float, each_together: float):
    """A stand-in for ``loop_rates``: ``alone`` iterations a second for one CPU by itself, ``each_together`` for
    each of several at once; it records the calls."""
    calls: list[tuple[list[int], float]] = []

    def rates(cpus: list[int], seconds: float) -> list[float]:
        calls.append((list(cpus), seconds))
        return [alone] if len(cpus) == 1 else [each_together] * len(cpus)

    rates.calls = calls  # type: ignore[attr-defined]
    return rates


def test_the_figure_is_all_cores_work_together_over_one_alone_summed_over_the_rounds():
    rates = rates_of(100.0, 80.0)
    assert effective_cpus([0, 1, 2, 3], 0.25, rounds=3, rates=rates) == pytest.approx(3.2)
    # alternately one alone, then all of them, each for the given seconds
    assert rates.calls == [([0], 0.25), ([0, 1, 2, 3], 0.25)] * 3
    assert effective_cpus([0], 0.1, rounds=1, rates=rates_of(0.0, 0.0)) == 0.0  # nothing measured: no figure


def test_one_hardware_thread_of_each_core_is_probed_and_no_more_than_the_quota_allows(tmp_path: Path):
    host = machine(tmp_path, cpus="0-15", online="0-15")
    smt_topology(tmp_path, cores=8, threads=2)  # CPU c and c + 8 share core c
    assert cpus_to_probe(host) == (list(range(8)), "one hardware thread of each of 8 cores")
    put(tmp_path, "/sys/fs/cgroup/cgroup.controllers", "cpu\n")
    put(tmp_path, "/sys/fs/cgroup/cpu.max", "350000 100000\n")  # 3.5 CPUs: 4 loops would be throttled
    assert cpus_to_probe(host) == ([0, 1, 2], "the cgroup quota's 3.5 CPUs")
    plain = machine(tmp_path / "plain", cpus="2-5", online="0-7")  # no topology: every CPU a core
    assert cpus_to_probe(plain) == ([2, 3, 4, 5], "")
    assert cpus_to_probe(Host(tmp_path / "empty", environ={})) == ([], "")


@needs_affinity
def test_cores_doing_their_full_share_pass_and_a_host_that_takes_a_third_warns_with_the_plan_to_make():
    cpus, _ = cpus_to_probe(LIVE)
    if len(cpus) < 2:
        pytest.skip("one usable core: nothing to compare")
    n, usable = len(cpus), len(os.sched_getaffinity(0))
    full = check_cpu_capacity(LIVE, 0.5, 2, rates_of(100.0, 95.0))
    assert full.status == "pass" and full.data["effective_cpus"] == pytest.approx(0.95 * n, abs=1e-3)
    assert full.value.startswith(f"{n} cores busy together did {0.95 * n:.2f} times the work of one alone (95%")
    shared = check_cpu_capacity(LIVE, 0.5, 2, rates_of(90.0, 60.0))
    assert shared.status == "warn" and shared.data["share"] == pytest.approx(0.667, abs=1e-3)
    assert f"--cores {usable * 60 / 90:.1f} rather than {usable}" in shared.fix
    assert "a shared host's figure moves" in shared.fix and "gain less than predicted" in shared.why


@needs_affinity
def test_a_probe_that_fails_is_unknown_not_a_figure():
    if len(cpus_to_probe(LIVE)[0]) < 2:
        pytest.skip("one usable core: the probe does not run")

    def failing(cpus: list[int], seconds: float) -> list[float]:
        raise OSError("the busy loop pinned to a CPU of [0, 1] failed (status 256)")

    check = check_cpu_capacity(LIVE, 0.5, 1, failing)
    assert check.status == "unknown" and "the probe could not run: the busy loop pinned" in check.value


def test_the_probe_is_skipped_without_bench_and_off_the_live_machine(tmp_path: Path):
    assert check_cpu_capacity(LIVE, 0.0).status == "n/a"
    assert "--no-bench" in check_cpu_capacity(LIVE, 0.0).value
    fake = check_cpu_capacity(Host(tmp_path), 0.5, rates=rates_of(1.0, 1.0))
    assert fake.status == "n/a" and "the machine stallscope runs on" in fake.value


@needs_affinity
def test_real_busy_loops_pinned_to_each_cpu_report_their_rates_and_a_bad_cpu_raises():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    rates = loop_rates(cpus, 0.05)
    assert len(rates) == len(cpus) and all(rate > 1000 for rate in rates)  # a Python loop: millions a second
    with pytest.raises(OSError, match="failed"):  # a CPU outside the machine: the child cannot pin itself
        loop_rates([cpus[0], 4095], 0.05)
    probed, _ = cpus_to_probe(LIVE)
    check = check_cpu_capacity(LIVE, 0.05, 1)
    if len(probed) < 2:
        assert check.status == "n/a"
    else:
        data = check.data
        assert data["probed_cpus"] == len(probed) and data["effective_cpus"] > 0
        assert data["share"] == pytest.approx(data["effective_cpus"] / len(probed), abs=1e-3)
        assert check.status == ("pass" if data["share"] >= 0.85 else "warn")
