"""Compute findings from the facts a run recorded: another thread's hold on the step (``thread-in-step``)."""

from __future__ import annotations

import pytest

from stallscope.analysis.compute_findings import THREAD_SHARE, _threads
from stallscope.render import words
from stallscope.render.words.recommendations import recommendation

MS = 1_000_000


def _facts(wall: int, cpu: int, run_queue: int, thread_cpu: int, lines=None) -> list[dict]:
    return [{"kind": "threads", "pid": 1, "wall_ns": wall, "cpu_ns": cpu, "run_queue_ns": run_queue,
             "intervals": 100, "threads": [{"name": "metrics-exporter", "target": "export", "cpu_ns": thread_cpu,
                                            "lines": lines or [["/job/train.py", 12, "export", 40]]}]}]


def test_a_thread_running_while_the_step_is_blocked_is_named_with_a_floor():
    # 1000 ms computing: 400 ms on CPU, 100 ms in the run queue, 500 ms blocked; the thread ran 450 ms of it
    (rec,) = _threads(_facts(1000 * MS, 400 * MS, 100 * MS, 450 * MS), computing=0.8)
    assert rec.id == "thread-in-step"
    share = 0.45 * 0.8  # the lesser of blocked and the thread's CPU, times the share of the step spent computing
    assert rec.facts["share_of_step"] == pytest.approx(share)
    assert rec.predicted_speedup == pytest.approx(1 / (1 - share), abs=0.01)
    assert (rec.facts["thread"], rec.facts["file"], rec.facts["line"]) == ("metrics-exporter", "/job/train.py", 12)
    assert words.gain(rec).startswith("at least ")
    said = recommendation(rec)
    assert "metrics-exporter" in said.title and "train.py:12" in said.change and "blocked 50%" in said.reason


def test_a_thread_taking_cores_but_not_the_lock_is_not_a_finding():
    # compression with the lock released: the main thread waits in the run queue, hardly ever blocked
    assert _threads(_facts(1000 * MS, 650 * MS, 330 * MS, 800 * MS), computing=1.0) == []


def test_a_thread_that_seldom_runs_is_not_a_finding():
    # blocked half the time (a GPU sync, say) while the logger took 3%: the lesser is below the threshold
    assert _threads(_facts(1000 * MS, 500 * MS, 0, 30 * MS), computing=1.0) == []
    assert 0.03 < THREAD_SHARE


def test_no_threads_no_finding():
    assert _threads([], computing=1.0) == []
    facts = _facts(1000 * MS, 100 * MS, 0, 0)
    facts[0]["threads"] = []
    assert _threads(facts, computing=1.0) == []
