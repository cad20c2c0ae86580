"""The CPU capacity probe: its figure from stand-in loop rates (exact), and the real forked loops on this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stallscope.health.cpu_probe import check_cpu_capacity, effective_cpus, loop_rates
from stallscope.health.host import Host

LIVE = Host()


def rates_of(alone: float, each_together: float):
    """A stand-in for ``loop_rates``: ``alone`` iterations a second for one CPU by itself, ``each_together`` for
    each of several at once; it records the calls."""
    calls: list[tuple[list[int], float]] = []

    def rates(cpus: list[int], seconds: float) -> list[float]:
        calls.append((list(cpus), seconds))
        return [alone] if len(cpus) == 1 else [each_together] * len(cpus)

    rates.calls = calls  # type: ignore[attr-defined]
    return rates


def test_the_figure_is_all_cpus_work_together_over_one_alone_summed_over_the_rounds():
    rates = rates_of(100.0, 80.0)
    assert effective_cpus([0, 1, 2, 3], 0.25, rounds=3, rates=rates) == pytest.approx(3.2)
    # alternately one alone, then all of them, each for the given seconds
    assert rates.calls == [([0], 0.25), ([0, 1, 2, 3], 0.25)] * 3
    assert effective_cpus([0], 0.1, rounds=1, rates=rates_of(0.0, 0.0)) == 0.0  # nothing measured: no figure


needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")


@needs_affinity
def test_cpus_doing_their_full_share_pass_and_a_host_that_takes_a_third_warns_with_the_plan_to_make():
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one usable CPU: nothing to compare")
    full = check_cpu_capacity(LIVE, 0.5, 2, rates_of(100.0, 95.0))
    assert full.status == "pass" and full.data["effective_cpus"] == pytest.approx(0.95 * cpus, abs=1e-3)
    assert full.value.startswith(f"{cpus} CPUs busy together did {0.95 * cpus:.2f} times the work of one alone (95%")
    shared = check_cpu_capacity(LIVE, 0.5, 2, rates_of(90.0, 60.0))
    assert shared.status == "warn" and shared.data["share"] == pytest.approx(0.667, abs=1e-3)
    assert f"--cores {cpus * 60 / 90:.1f}" in shared.fix and "a shared host's figure moves" in shared.fix
    assert "worker counts then gain less than predicted" in shared.why


def test_the_probe_is_skipped_without_bench_and_off_the_live_machine(tmp_path: Path):
    assert check_cpu_capacity(LIVE, 0.0).status == "n/a"
    assert "--no-bench" in check_cpu_capacity(LIVE, 0.0).value
    fake = check_cpu_capacity(Host(tmp_path), 0.5, rates=rates_of(1.0, 1.0))
    assert fake.status == "n/a" and "the machine stallscope runs on" in fake.value


@needs_affinity
def test_real_busy_loops_pinned_to_each_cpu_report_their_rates():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    rates = loop_rates(cpus, 0.05)
    assert len(rates) == len(cpus) and all(rate > 1000 for rate in rates)  # a Python loop: millions a second
    check = check_cpu_capacity(LIVE, 0.05, 1)
    assert check.data["probed_cpus"] == len(os.sched_getaffinity(0))
    assert check.data["effective_cpus"] > 0 and check.status in ("pass", "warn", "n/a")
