"""Splitting a fetch's wall time over nodes: CPU by call, run-queue to CPU nodes, the rest to storage."""

from __future__ import annotations

from stallscope.analyze.pipeline import split_fetch
from stallscope.session import FetchRecord


def fetch(wall, cpu, runqueue, by_node):
    return FetchRecord(0, 0, 0, 0, 1000, 1000 + wall, cpu, runqueue, 8, by_node, {}, None, 1)


def test_cpu_by_call_rest_to_transform_blocked_to_storage():
    split = split_fetch(fetch(wall=1000, cpu=600, runqueue=0, by_node={"decode": [500, 300, 4], "loader": [50, 50, 1]}))
    assert split == {"decode": 300, "loader": 50, "transform": 250, "storage": 400}
    assert sum(split.values()) == 1000


def test_runqueue_wait_goes_to_cpu_nodes_not_storage():
    # 4 workers on 2 cores: half the wall time is waiting for a CPU, none is I/O.
    split = split_fetch(fetch(wall=1000, cpu=500, runqueue=500, by_node={"decode": [1000, 500, 8]}))
    assert split == {"decode": 1000, "transform": 0, "storage": 0}


def test_unknown_runqueue_counts_off_cpu_as_blocking():
    split = split_fetch(fetch(wall=1000, cpu=400, runqueue=-1, by_node={}))
    assert split == {"transform": 400, "storage": 600}


def test_call_cpu_above_thread_cpu_is_scaled_down():
    split = split_fetch(fetch(wall=100, cpu=80, runqueue=0, by_node={"decode": [90, 90, 1], "transform": [10, 10, 1]}))
    assert sum(split.values()) == 100
    assert split["storage"] == 20
    assert split["decode"] == 72
