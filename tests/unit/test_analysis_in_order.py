"""Batches handed over in order: what uneven batch times cost workers, on hand-set shapes and models, and the shape
read from a session's fetches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.findings import LoaderSummary
from stallscope.analysis.in_order import MIN_BATCHES, QUANTILES, _handover_share, batch_time_shape, in_order_share
from stallscope.analysis.steps import step_stats
from stallscope.session import FetchRecord
from tests.unit.test_analysis_steps import MS, PID, make_session, nxt, opt

EVEN = (1.0,) * QUANTILES
#: a batch in eight takes eight times the others (a shard download every eighth batch)
HEAVY_TAIL = tuple([8 / 15] * 28 + [64 / 15] * 4)


def test_even_batches_lose_nothing_and_uneven_ones_lose_more_with_more_workers_and_less_with_deeper_queues():
    assert [_handover_share(EVEN, w, 2, 0.01) for w in (1, 2, 8, 32)] == pytest.approx([1.0] * 4, abs=0.005)
    shares = [_handover_share(HEAVY_TAIL, w, 2, 0.01) for w in (1, 2, 4, 8)]
    assert shares[0] == pytest.approx(1.0, abs=0.01)  # one worker: nothing to wait for but itself
    assert shares[1] > shares[2] > shares[3]
    assert shares[3] < 0.85
    assert _handover_share(HEAVY_TAIL, 8, 8, 0.01) > shares[3]  # deeper queues ride out the slow batch


def test_a_training_process_slower_than_the_workers_hides_their_unevenness():
    # 8 workers could make 8 batches a mean batch time; the training process takes 0.5 of it per batch: it sets the
    # pace, and a slow batch is waited for only when the queue behind it has run dry
    assert _handover_share(HEAVY_TAIL, 8, 2, 0.5) > 0.97
    assert in_order_share((), 8, 2, 100.0, 50.0) == 1.0  # nothing known: nothing lost
    assert in_order_share(HEAVY_TAIL, 0, 2, 100.0, 50.0) == 1.0  # no workers: nothing handed over


def model(shape: tuple[float, ...], cpu: float, blocked: float) -> ThroughputModel:
    return ThroughputModel({"decode": cpu, "storage": blocked}, 0.001, 0.001, 1, 2.0, batch_time_shape=shape)


def test_the_model_prices_the_hand_over_for_waiting_workers_and_not_for_cpu_bound_ones():
    # mostly waiting (a store's latency): 8 workers fit on 2 cores, and in order they deliver less than 8x
    waiting = model(HEAVY_TAIL, 0.001, 0.019)
    assert waiting.speedup(8) < 0.9 * replace(waiting, batch_time_shape=()).speedup(8)
    # all CPU, more workers than cores: the cores bound them, and a worker idle behind a slow batch leaves its core
    # to the others, so the hand-over costs nothing there
    busy = model(HEAVY_TAIL, 0.02, 0.0)
    assert busy.rate(4) == pytest.approx(replace(busy, batch_time_shape=()).rate(4), rel=0.01)


def _fetch(worker: int, iter_id: int, start_ms: float, took_ms: float) -> FetchRecord:
    return FetchRecord(0, iter_id, worker, 0, int(start_ms * MS), int((start_ms + took_ms) * MS), 0, -1, 4, {}, {},
                       None, 500 + worker)


def test_the_shape_is_the_measured_batch_times_over_their_mean_without_each_workers_first_of_an_epoch():
    nexts = [nxt(100 * k, 100 * k + 50) for k in range(40)]
    opts = [opt(100 * k + 90, 100 * k + 100) for k in range(40)]
    # two workers, every fourth batch four times as long; each worker's first batch of the epoch far longer still
    fetches = [_fetch(k % 2, 0, 100 * k, 200 if k < 2 else (80 if k % 4 == 3 else 20)) for k in range(40)]
    session = make_session(nexts, opts, fetches=fetches, workers=2)
    stats = step_stats(session)
    train = LoaderSummary(0, "train", "train.py:10", session.loaders[0].config, {}, 40, 1, 1.0, 0.0, None, pid=PID)
    shape = batch_time_shape(session, stats, train)
    assert len(shape) == QUANTILES and shape == tuple(sorted(shape))
    assert sum(shape) / len(shape) == pytest.approx(1.0, abs=0.05)
    assert shape[-1] / shape[0] == pytest.approx(4.0, rel=0.05)  # the firsts (10x) left out
    few = make_session(nexts, opts, fetches=fetches[:MIN_BATCHES], workers=2)
    assert batch_time_shape(few, step_stats(few), train) == ()
    unordered = replace(train, config={**train.config, "in_order": False})
    assert batch_time_shape(session, stats, unordered) == ()


def test_a_slow_phase_that_slows_every_batch_alike_is_not_a_spread_the_hand_over_loses_to():
    # an epoch's first half downloads every shard (200 ms batches), its second reads them from the cache (20 ms):
    # batches in flight together take the same time, so handing them over in order loses nothing
    nexts = [nxt(300 * k, 300 * k + 50) for k in range(60)]
    opts = [opt(300 * k + 90, 300 * k + 100) for k in range(60)]
    fetches = [_fetch(k % 2, 0, 300 * k, 200 if k < 30 else 20) for k in range(60)]
    session = make_session(nexts, opts, fetches=fetches, workers=2)
    train = LoaderSummary(0, "train", "train.py:10", session.loaders[0].config, {}, 60, 1, 1.0, 0.0, None, pid=PID)
    shape = batch_time_shape(session, step_stats(session), train)
    assert _handover_share(shape, 8, 2, 0.01) > 0.9  # only the batches around the change differ from their window
    whole_run = tuple(sorted(t / 110 for t in [200] * 16 + [20] * 16))  # the same batches over the run's mean
    assert _handover_share(whole_run, 8, 2, 0.01) < 0.8
