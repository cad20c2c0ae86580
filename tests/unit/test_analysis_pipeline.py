"""Splitting a fetch's wall time over nodes: CPU by call, run-queue to CPU nodes, the rest to storage."""

from __future__ import annotations

from stallscope.analysis.pipeline import split_fetch
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


def test_untimed_batch_takes_its_cpu_split_from_the_loaders_timed_batches():
    from stallscope.analysis.pipeline import loader_cpu_shares

    timed = [fetch(wall=1000, cpu=800, runqueue=0, by_node={"decode": [600, 600, 8], "loader": [100, 100, 1]}),
             fetch(wall=1000, cpu=800, runqueue=0, by_node={"decode": [600, 600, 8], "loader": [100, 100, 1]})]
    untimed = FetchRecord(0, 0, 0, 2, 1000, 3000, 1000, 200, 8, {}, {}, None, 1, timed=False)
    shares = loader_cpu_shares([*timed, untimed])
    assert shares == {0: {"decode": 0.75, "loader": 0.125, "transform": 0.125}}
    split = split_fetch(untimed, shares[0])
    # CPU 1000 split 750/125/125; run-queue 200 shared in proportion; the remaining 800 off-CPU is blocking.
    assert split == {"decode": 900, "loader": 150, "transform": 150, "storage": 800}
    assert sum(split.values()) == 2000
    # Without shares (no timed batch), an untimed batch is all transform CPU, like an uninstrumented dataset.
    assert split_fetch(untimed) == {"transform": 1200, "storage": 800}


def test_worker_pipeline_scales_call_totals_to_all_batches():
    from stallscope.analysis.pipeline import worker_pipeline
    from stallscope.session import LoaderRecord, Session

    by_name = {"PIL.Image.open": [600, 600, 8]}
    records = [FetchRecord(0, 0, 0, 0, 0, 1000, 800, 0, 8, {"decode": [600, 600, 8]}, by_name, None, 1)]
    records += [FetchRecord(0, 0, 0, seq, seq * 1000, seq * 1000 + 1000, 800, 0, 8, {}, {}, None, 1, timed=False)
                for seq in (1, 2, 3)]
    session = Session("stallscope.session/1", "r", ["x"], "/", 0.0, 0, 10**9, 0, "exit", {}, None, {},
                      loaders=[LoaderRecord(0, 1, 0, "train.py:1", {"num_workers": 1}, {})], fetches=records)
    p = worker_pipeline(session, 0)
    assert p.batches == 4 and p.call_timed_batches == 1
    assert p.by_call == {"PIL.Image.open": 2400 / 1e9}
    assert p.direct_s == 2400 / 1e9
    assert p.node_cpu_s == {"decode": 2400 / 1e9, "transform": 800 / 1e9}
