"""Epoch starts over the measured steps: exact costs on hand-set models, and the shape read from a session."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallscope.analysis.capacity import ThroughputModel
from stallscope.analysis.epochs import (
    FORK_BASE_S,
    FORK_S_PER_GIB,
    SPAWN_TEARDOWN_SHARE,
    TYPICAL_FORKED_STOP_S,
    TYPICAL_FORK_START_S,
    TYPICAL_SPAWN_START_S,
    TYPICAL_WARMUP_BATCHES,
    EpochShape,
    best_over_epochs,
    best_queue_over_epochs,
    epoch_cost,
    epoch_shape,
    rate_over_epochs,
    start_method,
)
from stallscope.analysis.findings import LoaderSummary, Step, StepStats, WorkerPipeline
from stallscope.session import (
    FetchRecord,
    IterRecord,
    LoaderRecord,
    NextRecord,
    ProcessRecord,
    Session,
    ShutdownRecord,
    WorkerStartRecord,
)

MS = 1_000_000


def model(workers: int = 0) -> ThroughputModel:
    """8 ms of loader CPU and 2 ms of compute per sample on 4 cores: 100/s without workers, 250/s with two."""
    return ThroughputModel({"decode": 0.004, "transform": 0.004, "loader": 0.0, "storage": 0.0}, 0.002, 0.002,
                           workers, 4.0)


def shape(**kw) -> EpochShape:
    base = dict(restarts=9, samples=800, batch_size=8, prefetch_factor=2, persistent=False, left_early=False,
                worker_start_s=0.03, serial_start=True, start_basis="typical fork")
    base.update(kw)
    return EpochShape(**base)


def test_each_epoch_start_pays_the_forks_and_the_first_batch():
    m = model()
    assert m.rate(2) == pytest.approx(250.0)
    cost = epoch_cost(m, shape(), 2, persistent=False)
    assert cost.start_s == pytest.approx(2 * 0.03)  # forked one after another
    assert cost.fill_s == pytest.approx(8 * 0.008 - 8 / 250)  # one worker's batch, less the steady interval
    assert cost.dropped_s == 0.0
    # 800 samples at 250/s, and 9 starts of 0.092 s
    assert rate_over_epochs(m, shape(), 2, persistent=False) == pytest.approx(800 / (3.2 + 9 * 0.092))


def test_persistent_workers_start_once():
    cost = epoch_cost(model(), shape(), 2, persistent=True)
    assert (cost.start_s, cost.total_s) == (0.0, pytest.approx(0.032))
    assert rate_over_epochs(model(), shape(), 2, persistent=True) == pytest.approx(800 / (3.2 + 9 * 0.032))


def test_spawned_workers_start_side_by_side_one_round_per_core_count():
    spawned = shape(worker_start_s=2.0, serial_start=False)
    assert epoch_cost(model(), spawned, 2, persistent=False).start_s == pytest.approx(2.0)
    assert epoch_cost(model(), spawned, 6, persistent=False).start_s == pytest.approx(4.0)  # 6 workers, 4 cores


def test_restarted_workers_are_stopped_at_every_epoch_end_kept_alive_ones_never():
    """A spawned worker tears down an interpreter when it is stopped: 0.9 s each round of as many as there are
    cores (4 here), on top of starting the next epoch's."""
    spawned = shape(worker_start_s=2.0, serial_start=False, worker_stop_s=0.9)
    cost = epoch_cost(model(), spawned, 2, persistent=False)
    assert (cost.start_s, cost.stop_s) == (pytest.approx(2.0), pytest.approx(0.9))
    assert cost.total_s == pytest.approx(2.0 + 0.9 + cost.fill_s)
    assert epoch_cost(model(), spawned, 6, persistent=False).stop_s == pytest.approx(2 * 0.9)  # two rounds
    assert epoch_cost(model(), spawned, 2, persistent=True).stop_s == 0.0


def test_leaving_epochs_early_drops_the_batches_in_flight():
    cost = epoch_cost(model(), shape(left_early=True), 2, persistent=True)
    # kept alive, the reset finishes all 2 workers x prefetch 2 = 4 batches of 8 samples at 8 ms of CPU, made by
    # the 2 workers (of 4 cores); restarted, one fewer
    assert cost.dropped_s == pytest.approx(4 * 8 * 0.008 / 2)
    assert epoch_cost(model(), shape(left_early=True), 2, False).dropped_s == pytest.approx(3 * 8 * 0.008 / 2)
    slow_storage = ThroughputModel({"decode": 0.001, "storage": 0.010}, 0.002, 0.002, 0, 4.0)
    # blocked time overlaps across the workers, not beyond them: 4 x 8 x 11 ms over 2 workers
    assert epoch_cost(slow_storage, shape(left_early=True), 2, True).dropped_s == pytest.approx(4 * 8 * 0.011 / 2)


def test_restarted_workers_warm_up_again_every_epoch_kept_alive_ones_never():
    """A new worker's first two batches cost half a batch's CPU more (0.5 x 8 samples x 8 ms = 32 ms): the first
    batch is that much later, or later by all of the new workers' warm-up on the cores they share."""
    warming = shape(warmup_batches=0.5)
    cost = epoch_cost(model(), warming, 2, persistent=False)
    # 2 workers of 4 cores warm up side by side: one worker's 32 ms, beyond the 32 ms fill
    assert (cost.fill_s, cost.warmup_s) == (pytest.approx(8 * 0.008 - 8 / 250), pytest.approx(0.032))
    assert cost.total_s == pytest.approx(2 * 0.03 + 0.032 + 0.032)
    # 6 workers on 4 cores: all six warm-ups share the cores, 6 x 32 ms / 4; the steady interval is 8 / 400 s
    assert model().rate(6) == pytest.approx(400.0)
    assert epoch_cost(model(), warming, 6, persistent=False).warmup_s == pytest.approx(
        8 * 0.008 + 6 * 0.032 / 4 - 8 / 400 - (8 * 0.008 - 8 / 400))
    assert epoch_cost(model(), warming, 2, persistent=True).warmup_s == 0.0
    assert rate_over_epochs(model(), warming, 2, False) == pytest.approx(800 / (3.2 + 9 * (0.06 + 0.032 + 0.032)))


def test_the_warm_up_share_of_a_recorded_runs_worker_cpu():
    """9 restarts of 2 workers, each warming up half a batch of 8: 72 samples' worth of CPU beside the 800 made."""
    assert shape(warmup_batches=0.5).warmup_share(2) == pytest.approx(72 / 872)
    assert shape(warmup_batches=0.5, persistent=True).warmup_share(2) == 0.0
    assert shape(warmup_batches=0.5).warmup_share(0) == 0.0


def test_without_workers_an_epoch_start_costs_nothing():
    assert epoch_cost(model(), shape(left_early=True), 0, persistent=False).total_s == 0.0
    assert rate_over_epochs(model(), shape(), 0, persistent=False) == pytest.approx(100.0)


def test_the_best_setting_keeps_workers_alive_where_restarting_them_costs_five_percent():
    workers, keep, gain = best_over_epochs(model(), shape(), [1, 2], workers_now=0)
    # 1 worker: 125/s steady; 2 workers: 198.6/s restarted, 229.4/s kept alive
    assert (workers, keep) == (2, True)
    assert gain == pytest.approx((800 / (3.2 + 9 * 0.032)) / 100.0)


def test_a_loader_built_anew_every_epoch_is_never_told_to_keep_its_workers():
    workers, keep, gain = best_over_epochs(model(), shape(rebuilt=True), [1, 2], workers_now=0)
    assert (workers, keep) == (2, False)
    assert gain == pytest.approx((800 / (3.2 + 9 * 0.092)) / 100.0)


def test_short_epochs_can_make_workers_a_loss_and_the_advice_says_so():
    from stallscope.analysis.recommend import _no_predicted_gain
    from stallscope.render import words

    tiny = shape(restarts=99, samples=800, worker_start_s=2.0, serial_start=False, rebuilt=True)
    workers, keep, gain = best_over_epochs(model(), tiny, [1, 2], workers_now=0)
    assert gain < 1.0
    rec = _no_predicted_gain(model(), 0, tiny)
    assert rec.facts["reason"] == "epoch-starts" and rec.facts["epoch_starts"] == 99
    said = words.recommendation(rec)
    assert ("the measured steps start 99 new epochs of about 8 samples each, and each would cost 4 workers about "
            "2.04 s (starting them 2.00 s, refilling the queue 0.04 s)") in said.reason


def test_the_recommendation_carries_both_settings_and_the_epoch_costs():
    from stallscope.analysis.recommend import recommend
    from stallscope.render import words

    stats = StepStats(0, "optimizer", [Step(k, k * 80 * MS, (k + 1) * 80 * MS, 60 * MS, 0, 1, 8) for k in range(100)],
                      0, 8.0, 6.0, 0.0, 2.0, 0.0, 0.0, 800, 0.08, 0.08, 0.06, 0.08)
    train = LoaderSummary(0, "train", "train.py:1", {"num_workers": 0, "batch_size": 8}, {}, 100, 10, 6.0, 0.0, None)
    recs = recommend("input-bound", stats, train, {"transform": 6.0, "compute": 2.0}, 4, model=model(),
                     epochs=shape())
    rec = next(r for r in recs if r.id == "num-workers")
    assert rec.overrides["persistent_workers"] is True
    assert rec.predicted_speedup == pytest.approx(best_over_epochs(model(), shape(), list(range(1, 7)), 0)[2], abs=0.01)
    assert rec.facts["epoch_starts"] == 9 and rec.facts["steady_speedup"] == pytest.approx(
        model().speedup(rec.overrides["num_workers"]), abs=0.01)
    said = words.recommendation(rec)
    assert said.title.endswith("kept alive between epochs")
    assert "--set persistent_workers=true" in said.change
    assert "the measured steps start 9 new epochs" in said.reason and "counted in the prediction" in said.reason
    assert not any(r.id == "persistent-workers" for r in recs)
    # restarted workers warm up at every epoch: said with its figure and where it comes from
    warming = shape(rebuilt=True, warmup_batches=0.5, warmup_basis="typical of a new worker")
    recs = recommend("input-bound", stats, train, {"transform": 6.0, "compute": 2.0}, 4, model=model(),
                     epochs=warming)
    rec = next(r for r in recs if r.id == "num-workers")
    assert rec.facts["warmup_batches"] == 0.5 and rec.facts["epoch_warmup_s"] > 0
    assert ("a new worker's first two batches cost 0.50 of a batch's CPU more than its later ones (typical of a new "
            "worker, estimated)") in words.recommendation(rec).reason


@pytest.mark.parametrize("platform, python, context, expected", [
    ("Linux-6.1-x86_64", "3.11.7", "default", "fork"),
    ("Linux-6.1-x86_64", "3.14.0", "default", "forkserver"),
    ("macOS-14.2-arm64", "3.11.7", "default", "spawn"),
    ("Windows-10", "3.12.1", None, "spawn"),
    ("Linux-6.1-x86_64", "3.11.7", "spawn", "spawn"),
])
def test_start_method_follows_the_loader_then_the_platform(platform, python, context, expected):
    session = _session(environment={"platform": platform, "python": python})
    assert start_method(session, {"multiprocessing_context": context}) == expected


# --- the shape, read from a recorded session ----------------------------------------------------------------------


def _session(epochs: int = 0, used_per_epoch: int = 5, workers: int = 0, environment: dict | None = None,
             worker_ready_ms: tuple[float, ...] = (), config: dict | None = None) -> Session:
    """A training process that ran ``epochs`` epochs of ``used_per_epoch`` batches of 8, 100 ms per batch."""
    session = Session("stallscope.session/1", "r", ["python", "train.py"], "/", 0.0, 0, 10**12, 0, "exit", {}, None,
                      environment or {"platform": "Linux-6.1-x86_64", "python": "3.11.7"})
    session.processes.append(ProcessRecord(100, 1, "main", ["train.py"], 0, 0, start_ns=0))
    config = {"num_workers": workers, "batch_size": 8, "dataset_len": 80, "prefetch_factor": 2,
              "persistent_workers": False, "drop_last": False, "iterable": False, "multiprocessing_context": "default",
              "batches_per_epoch": 10, "sampler": "RandomSampler", **(config or {})}
    session.loaders.append(LoaderRecord(0, 100, 1500 * MS, "train.py:10", config, {}))
    t = 2000 * MS
    for e in range(epochs):
        session.iters.append(IterRecord(0, e, e, t, t + 1 * MS, workers, 100))
        for k, ready in enumerate(worker_ready_ms):
            session.worker_starts.append(WorkerStartRecord(0, e, k, 200 + k, t, t + int(ready * MS // 2),
                                                           t + int(ready * MS), {}))
        t += 1 * MS
        for _ in range(used_per_epoch):
            session.nexts.append(NextRecord(0, e, e, t, t + 60 * MS, 0, 8, 100))
            t += 100 * MS
    return session


def _stats_and_train(session: Session, workers: int = 0, startup: list[float] | None = None):
    nexts = session.nexts
    steps = [Step(k, n.start_ns, n.start_ns + 100 * MS, 60 * MS, 0, 1, 8) for k, n in enumerate(nexts)]
    stats = StepStats(0, "optimizer", steps, 1, 0.1 * (len(steps) - 1), 0.06 * (len(steps) - 1), 0.0,
                      0.04 * (len(steps) - 1), 0.0, 0.0, 8 * (len(steps) - 1), 0.1, 0.1, 0.06, 0.1)
    pipeline = None
    if workers:
        pipeline = WorkerPipeline(0, workers, len(nexts), 1.0, {}, {}, 8 * len(nexts), 1.0, 1.0, 0.0, None, {}, None,
                                  None, startup or [], None, None, None, 0.0, 0)
    train = LoaderSummary(0, "train", "train.py:10", session.loaders[0].config, {}, len(nexts), 4, 0.0, 0.0, pipeline)
    return stats, train


def test_the_shape_counts_epoch_starts_inside_the_measured_steps_and_sees_the_early_exit():
    session = _session(epochs=4, used_per_epoch=5)  # 5 of the sampler's 10 batches, every epoch
    stats, train = _stats_and_train(session)
    got = epoch_shape(session, stats, train)
    assert got is not None
    assert (got.restarts, got.samples, got.batch_size, got.prefetch_factor) == (3, 152, 8, 2)  # the first is warm-up
    assert got.left_early and not got.persistent and got.serial_start
    # 0 workers under fork: the typical fork figure, said as such
    assert (got.worker_start_s, got.start_basis) == (TYPICAL_FORK_START_S, "typical fork")


def test_persistent_workers_epochs_are_told_apart_by_their_epoch_not_their_iterator():
    """A persistent loader keeps one iterator for every epoch: its early exits are seen all the same."""
    session = _session(epochs=4, used_per_epoch=5)
    session = replace(session, nexts=[replace(n, iter_id=0) for n in session.nexts],
                      iters=[replace(it, iter_id=0) for it in session.iters])
    stats, train = _stats_and_train(session)
    assert epoch_shape(session, stats, train).left_early is True


def test_epochs_that_run_to_the_end_of_the_sampler_are_not_left_early():
    session = _session(epochs=3, used_per_epoch=10)
    stats, train = _stats_and_train(session)
    assert epoch_shape(session, stats, train).left_early is False


def test_one_epoch_over_the_measured_steps_has_no_shape():
    session = _session(epochs=1, used_per_epoch=10)
    stats, train = _stats_and_train(session)
    assert epoch_shape(session, stats, train) is None


def test_spawn_without_workers_takes_the_training_processs_own_import_of_torch():
    mac = {"platform": "macOS-14.2-arm64", "python": "3.11.7"}
    session = _session(epochs=3, environment=mac, config={"torch_import_s": 1.2})
    stats, train = _stats_and_train(session)
    got = epoch_shape(session, stats, train)
    assert got.worker_start_s == pytest.approx(1.2) and got.serial_start is False
    assert got.start_basis == "as long as the training process took to import torch"
    # recorded after torch was imported (stallscope.record()): a typical figure, said as such
    session = _session(epochs=3, environment=mac)
    stats, train = _stats_and_train(session)
    got = epoch_shape(session, stats, train)
    assert (got.worker_start_s, got.start_basis) == (TYPICAL_SPAWN_START_S, "typical spawn start")


def test_a_recorded_start_method_comes_before_the_platforms_default():
    session = _session(epochs=3, config={"start_method": "forkserver", "torch_import_s": 0.8})
    stats, train = _stats_and_train(session)
    got = epoch_shape(session, stats, train)
    assert got.serial_start is False and got.worker_start_s == pytest.approx(0.8)


def test_a_bigger_training_process_forks_more_slowly():
    session = replace(_session(epochs=3), system_samples={"t_ns": [0, 10**8], "interval_s": 0.1, "processes": {"100": {
        "ticks": [0, 1], "cpu_s": [0.0, 0.1], "rss_bytes": [4 * 2**30, 4 * 2**30], "read_bytes": [None, None]}}})
    stats, train = _stats_and_train(session)
    got = epoch_shape(session, stats, train)
    assert got.worker_start_s == pytest.approx(FORK_BASE_S + 4 * FORK_S_PER_GIB)
    assert got.start_basis == "typical fork of a 4.0 GiB training process"


def test_an_epoch_is_the_loaders_length_not_the_datasets():
    """Under a DistributedSampler (or a train/val SubsetRandomSampler) an epoch is a share of the dataset: five
    batches of a 5-batch share run to its end."""
    session = _session(epochs=4, used_per_epoch=5, config={"batches_per_epoch": 5, "sampler": "DistributedSampler"})
    stats, train = _stats_and_train(session)
    assert epoch_shape(session, stats, train).left_early is False
    # a session recorded before len(loader) was: the dataset's length is an epoch only for the whole-dataset samplers
    old = _session(epochs=4, used_per_epoch=5, config={"batches_per_epoch": None, "sampler": "DistributedSampler"})
    stats, train = _stats_and_train(old)
    assert epoch_shape(old, stats, train).left_early is False
    old = _session(epochs=4, used_per_epoch=5, config={"batches_per_epoch": None})
    stats, train = _stats_and_train(old)
    assert epoch_shape(old, stats, train).left_early is True


def test_measured_forks_give_each_workers_share_of_the_last_ready():
    session = _session(epochs=3, workers=2, worker_ready_ms=(20.0, 40.0))
    stats, train = _stats_and_train(session, workers=2, startup=[0.02, 0.04])
    got = epoch_shape(session, stats, train)
    assert (got.worker_start_s, got.start_basis) == (pytest.approx(0.02), "measured")


def test_measured_spawns_count_one_round_per_core_count():
    """Four spawned workers on 2 CPUs start in two rounds: the last was ready after both, and epoch_cost counts the
    rounds again for the count it prices."""
    session = _session(epochs=3, workers=4, worker_ready_ms=(1500.0, 1600.0, 3000.0, 3200.0),
                       config={"start_method": "spawn"})
    stats, train = _stats_and_train(session, workers=4, startup=[1.5, 1.6, 3.0, 3.2])
    got = epoch_shape(session, stats, train, cpus=2.0)
    assert got.worker_start_s == pytest.approx(1.6) and got.serial_start is False


def _with_worker_lives(session: Session, lives: list[tuple[float, float, int]]) -> Session:
    """``session`` with one worker life per entry: (first batch's, second batch's CPU per sample in ms, batches),
    the later batches at 1 ms per sample, 8 samples each."""
    fetches = []
    for iter_id, (first, second, batches) in enumerate(lives):
        for seq in range(batches):
            per_sample = first if seq == 0 else second if seq == 1 else 1.0
            t = 3000 * MS + iter_id * 1000 * MS + seq * 20 * MS
            fetches.append(FetchRecord(0, iter_id, 0, seq, t, t + 10 * MS, int(8 * per_sample * MS), 0, 8, {}, {},
                                       "ok", 200 + iter_id))
    return replace(session, fetches=fetches)


def test_a_new_workers_warm_up_is_measured_from_its_first_two_batches():
    """Each life: its first two batches' CPU beyond 8 samples at its later batches' 1 ms each, in batches of 8 ms:
    (1.5 + 1.1 - 2) x 8 / 8 = 0.6, then 0.2 and 0.4; the median, 0.4. A life of four batches is too short to tell
    its steady cost and is left out."""
    session = _with_worker_lives(_session(epochs=3, workers=1),
                                 [(1.5, 1.1, 6), (1.2, 1.0, 5), (1.3, 1.1, 7), (3.0, 3.0, 4)])
    stats, train = _stats_and_train(session, workers=1)
    got = epoch_shape(session, stats, train)
    assert (got.warmup_batches, got.warmup_basis) == (pytest.approx(0.4), "measured")
    # a worker whose first batches were cheaper than its later ones does not warm up below nothing
    session = _with_worker_lives(_session(epochs=3, workers=1), [(0.5, 0.5, 6)])
    stats, train = _stats_and_train(session, workers=1)
    assert epoch_shape(session, stats, train).warmup_batches == 0.0


def test_without_a_worker_life_to_measure_the_warm_up_is_typical():
    stats, train = _stats_and_train(session := _session(epochs=3))
    got = epoch_shape(session, stats, train)
    assert (got.warmup_batches, got.warmup_basis) == (TYPICAL_WARMUP_BATCHES, "typical of a new worker")


def test_the_advice_says_what_warming_up_costs_and_where_the_figure_comes_from():
    from stallscope.analysis.recommend import _no_predicted_gain
    from stallscope.render import words

    tiny = shape(restarts=99, samples=800, worker_start_s=2.0, serial_start=False, rebuilt=True, warmup_batches=0.5,
                 warmup_basis="typical of a new worker")
    rec = _no_predicted_gain(model(), 0, tiny)
    assert rec.facts["epoch_warmup_s"] == pytest.approx(0.032)
    said = words.recommendation(rec)
    assert "(starting them 2.00 s, refilling the queue 0.04 s, the new workers' first batches costing more CPU " \
           "0.03 s)" in said.reason


def _stopped(session: Session, stops_ms: list[tuple[float, float]], workers: int = 1) -> Session:
    """``session`` with its epochs' workers stopped after each epoch's last batch: (wait, still finishing a batch)
    in ms per stop; the finishing batch is a fetch of that epoch's iterator that ends that long into the stop."""
    ends = {}
    for n in session.nexts:
        ends[n.iter_id] = max(ends.get(n.iter_id, 0), n.end_ns + 40 * MS)
    shutdowns, fetches = [], []
    for (iter_id, t0), (wait, finishing) in zip(sorted(ends.items()), stops_ms):
        shutdowns.append(ShutdownRecord(0, iter_id, t0, t0 + int(wait * MS), workers, 100))
        finished = t0 + int(finishing * MS)
        fetches.append(FetchRecord(0, iter_id, 0, 9, t0 - 50 * MS, finished, 0, 0, 8, {}, {}, "ok", 200))
    return replace(session, shutdowns=shutdowns, fetches=fetches)


def test_measured_stops_count_the_exit_not_the_batch_the_workers_were_finishing():
    session = _stopped(_session(epochs=3, workers=1, config={"start_method": "spawn"}),
                       [(600.0, 100.0), (800.0, 0.0), (1000.0, 300.0)])
    stats, train = _stats_and_train(session, workers=1)
    got = epoch_shape(session, stats, train, cpus=2.0)
    assert (got.worker_stop_s, got.stop_basis) == (pytest.approx(0.7), "measured")  # the median of 0.5, 0.8, 0.7
    # three workers on 2 cores exit in two rounds: each stop is two of them
    session = _stopped(_session(epochs=3, workers=3, config={"start_method": "spawn"}),
                       [(1000.0, 0.0)] * 3, workers=3)
    stats, train = _stats_and_train(session, workers=3)
    assert epoch_shape(session, stats, train, cpus=2.0).worker_stop_s == pytest.approx(0.5)


def test_restarted_workers_recorded_before_stops_were_have_them_in_their_steps_already():
    session = _session(epochs=3, workers=1, config={"start_method": "spawn", "torch_import_s": 3.0})
    stats, train = _stats_and_train(session, workers=1)
    got = epoch_shape(session, stats, train)
    assert (got.worker_stop_s, got.stop_basis) == (0.0, "in the measured steps' compute (recorded before stops were)")


def test_unmeasured_stops_are_estimated_from_the_start_method():
    stats, train = _stats_and_train(fork := _session(epochs=3))
    got = epoch_shape(fork, stats, train)
    assert (got.worker_stop_s, got.stop_basis) == (TYPICAL_FORKED_STOP_S, "typical exit of a worker started by fork")
    spawn = _session(epochs=3, config={"start_method": "spawn", "torch_import_s": 3.0})
    stats, train = _stats_and_train(spawn)
    got = epoch_shape(spawn, stats, train)
    assert got.worker_stop_s == pytest.approx(SPAWN_TEARDOWN_SHARE * 3.0)
    assert got.stop_basis == "a third of the training process's import of torch"


def _two_workers_recommended(batches: int, epochs: int, startup_s: float, epoch_shape_: EpochShape):
    """What ``recommend`` advises a run of 2 restarted workers on 2 cores: ``batches`` steps of 8 samples, 80 ms each
    (60 ms of it waiting), over ``epochs`` epochs with ``startup_s`` of measured restart waits. On 2 cores two
    workers are already the best count (200/s, as three would be): only their restarts can go."""
    from stallscope.analysis.recommend import recommend

    two = replace(model(workers=2), usable_cpus=2.0, measured_samples_per_s=200.0)
    assert two.rate(2) == pytest.approx(200.0) and two.rate(3) == pytest.approx(200.0)
    steps = [Step(k, k * 80 * MS, (k + 1) * 80 * MS, 60 * MS, 0, 1, 8) for k in range(batches)]
    stats = StepStats(0, "optimizer", steps, 0, 0.08 * batches, 0.06 * batches, 0.0, 0.02 * batches, 0.0, 0.0,
                      8 * batches, 0.08, 0.08, 0.06, 0.08)
    pipeline = WorkerPipeline(0, 2, batches, 1.0, {}, {}, 8 * batches, 1.0, 1.0, 0.0, None, {}, None, None,
                              [0.03, 0.03], None, None, None, 0.0, 0)
    train = LoaderSummary(0, "train", "train.py:1", {"num_workers": 2, "batch_size": 8}, {}, batches, epochs,
                          0.06 * batches, startup_s, pipeline)
    return recommend("input-bound", stats, train, {"transform": 0.06 * batches, "compute": 0.02 * batches}, 2,
                     startup_s=startup_s, model=two, epochs=epoch_shape_)


def test_keeping_the_recorded_workers_alive_is_priced_over_the_same_epoch_starts():
    recs = _two_workers_recommended(100, 10, 0.5, shape())
    kept = next(r for r in recs if r.id == "persistent-workers")
    # restarted: 2 forks (0.06 s) + filling (8 x 8 ms - 8 / 200 = 0.024 s) at each of 9 starts; kept: filling alone
    assert kept.predicted_speedup == pytest.approx(round((4.0 + 9 * 0.084) / (4.0 + 9 * 0.024), 2))
    assert not any(r.id == "num-workers" for r in recs)


def test_keeping_workers_alive_is_not_advised_below_five_percent():
    """Long epochs: 2 starts over 8000 samples cost the kept-alive workers almost nothing less. The measured
    restart wait (3 s of 80) alone would have advised it; priced over the epochs it gains 0.2%."""
    recs = _two_workers_recommended(1000, 3, 3.0, shape(restarts=2, samples=8000))
    assert not any(r.id == "persistent-workers" for r in recs)


def test_when_even_kept_alive_workers_cannot_pay_off_the_words_say_refilling_not_starting():
    from stallscope.analysis.recommend import _no_predicted_gain
    from stallscope.render import words

    # epochs of 8 samples left early: each start refills one batch and finishes 3 dropped ones
    tiny = shape(restarts=99, samples=800, left_early=True)
    assert best_over_epochs(model(), tiny, [2], 0)[2] < 1.05
    rec = _no_predicted_gain(model(), 0, tiny)
    assert rec.facts["reason"] == "epoch-starts" and rec.facts["epoch_start_s"] == 0.0
    said = words.recommendation(rec)
    # the best steady count, 4 workers (4.00x): refilling 8 x 8 ms - 8 / 400 = 0.044 s, and 4 x 2 dropped batches
    # of 8 samples at 8 ms made by the 4 workers = 0.128 s, at each of the 99 starts
    assert ("each would cost 4 workers about 0.17 s (refilling the queue 0.04 s, batches in flight dropped when the "
            "loop leaves the epoch early 0.13 s)") in said.reason
    assert "starting them" not in said.reason


def test_an_epoch_start_prices_the_workers_work_at_their_load_as_the_steady_rate_does():
    """With a recorded load (one thread, cost 1.0), 2 workers on 4 CPUs: both busy, the compute 2 ms a sample at
    the priced rate (0.44 of the time), 2.44 threads cost 1 + 0.04 * 1.44 / 3, and the compute beside the workers
    1 + 0.3 * 0.44 on top; the first batch is filled at that price, against the steady interval at the priced
    rate."""
    m = replace(model(), recorded_load_cost=1.0)
    cost = m.cpu_second_cost(2)
    priced = m.cpu_slowed(*m.load_costs(2))
    share = priced.computing_share(2, m.rate(2))
    assert share == pytest.approx(m.rate(2) * 0.002 * m.load_costs(2)[1])
    busy = priced.busy_threads(2, None, m.rate(2))
    assert cost == pytest.approx((1 + 0.04 * (busy - 1) / 3) * (1 + 0.3 * share))
    assert (cost, share, busy) == pytest.approx((1.1542, 0.4415, 2.4415), abs=1e-4)
    assert m.rate(2) == pytest.approx(250.0 / cost)
    assert epoch_cost(m, shape(), 2, persistent=False).fill_s == pytest.approx(8 * 0.008 * cost - 8 / m.rate(2))


def test_another_processs_loader_of_the_same_id_changes_none_of_the_epochs():
    """Process 300 (a spawned worker that ran the script's module code again, no __main__ guard) built a loader 0 of
    its own, iterated it five times inside the measured steps with a batch of its own each, and started a worker
    (400) each time that took 9 s to start: none of it is the training loader's. Its restarts, early exits and start-up figure stay
    what the training process's own records give."""
    session = _session(epochs=4, used_per_epoch=10, workers=2, worker_ready_ms=(300.0, 300.0))
    stats, train = _stats_and_train(session, workers=2)
    train = replace(train, pid=100)
    alone = epoch_shape(session, stats, train)
    t = session.nexts[12].start_ns
    mixed = replace(
        session,
        processes=[*session.processes, ProcessRecord(300, 100, "worker", [], 0, 0), ProcessRecord(400, 300, "worker",
                                                                                                   [], 0, 0)],
        loaders=[*session.loaders, replace(session.loaders[0], pid=300)],
        iters=[*session.iters, *(IterRecord(0, 50 + k, 50 + k, t + k * MS, t + k * MS + MS, 1, 300) for k in range(5))],
        nexts=[*session.nexts, *(NextRecord(0, 50 + k, 50 + k, t + k * MS, t + k * MS + MS, 0, 8, 300)
                                 for k in range(5))],
        worker_starts=[*session.worker_starts, *(WorkerStartRecord(0, 50 + k, 0, 400, t, t, t + 9000 * MS, {})
                                                 for k in range(5))])
    got = epoch_shape(mixed, stats, train)
    assert alone is not None and got is not None
    assert (got.restarts, got.left_early, got.worker_start_s) == (alone.restarts, alone.left_early,
                                                                  alone.worker_start_s)
    assert got.restarts == 3 and got.left_early is False
    # the same records by the training process's own loader count: five more epoch starts, most epochs left early
    own = replace(mixed, iters=[replace(it, pid=100) if it.pid == 300 else it for it in mixed.iters],
                  nexts=[replace(n, pid=100) if n.pid == 300 else n for n in mixed.nexts])
    assert (epoch_shape(own, stats, train).restarts, epoch_shape(own, stats, train).left_early) == (8, True)


def test_a_loop_that_leaves_its_epochs_early_is_advised_one_batch_per_worker_in_flight():
    """2 workers kept alive, 9 early exits: prefetch 2 drops 4 batches of 8 samples at 8 ms each, on 2 workers,
    0.128 s, plus refilling 0.032 s: 800 / (3.2 + 9 x 0.16) = 172.4/s. Prefetch 1 drops 2 (0.064 s): 800 / (3.2 + 9 x
    0.096) = 196.9/s, 14% more, past SHALLOW_QUEUE_GAIN: advised, and priced with its shape."""
    left = shape(left_early=True)
    assert best_over_epochs(model(), left, [1, 2], 0) == (2, True, pytest.approx(800 / (3.2 + 9 * 0.16) / 100))
    workers, keep, priced, gain = best_queue_over_epochs(model(), left, [1, 2], workers_now=0)
    assert (workers, keep, priced.prefetch_factor) == (2, True, 1)
    assert priced == replace(left, prefetch_factor=1)
    assert gain == pytest.approx(800 / (3.2 + 9 * 0.096) / 100)


def test_the_queue_stays_as_it_is_where_a_shallower_one_gains_little_or_nothing_is_dropped():
    # One early exit: 2 restarted workers at prefetch 2, 800 / (3.2 + 0.06 + 0.032 + 0.096) = 236.1/s, at prefetch 1
    # 800 / 3.324 = 240.7/s: 2% more, not the 5% a shallower queue must gain.
    once = shape(left_early=True, restarts=1)
    workers, keep, priced, gain = best_queue_over_epochs(model(), once, [1, 2], workers_now=0)
    assert (workers, keep, priced) == (2, False, once)
    assert gain == pytest.approx(800 / 3.388 / 100)
    # Epochs that run to their end drop nothing: the queue is never priced shallower.
    assert best_queue_over_epochs(model(), shape(), [1, 2], 0)[2] == shape()


def test_the_advice_says_the_shallower_queue_and_why():
    from stallscope.analysis.recommend import recommend
    from stallscope.render import words

    stats = StepStats(0, "optimizer", [Step(k, k * 80 * MS, (k + 1) * 80 * MS, 60 * MS, 0, 1, 8) for k in range(100)],
                      0, 8.0, 6.0, 0.0, 2.0, 0.0, 0.0, 800, 0.08, 0.08, 0.06, 0.08)
    train = LoaderSummary(0, "train", "train.py:1", {"num_workers": 0, "batch_size": 8}, {}, 100, 10, 6.0, 0.0, None)
    left = shape(left_early=True)
    recs = recommend("input-bound", stats, train, {"transform": 6.0, "compute": 2.0}, 4, model=model(), epochs=left)
    rec = next(r for r in recs if r.id == "num-workers")
    assert rec.overrides == {"num_workers": rec.overrides["num_workers"], "persistent_workers": True,
                             "prefetch_factor": 1}
    workers, _, priced, gain = best_queue_over_epochs(model(), left, list(range(1, 7)), 0)
    assert rec.overrides["num_workers"] == workers and rec.predicted_speedup == pytest.approx(gain, abs=0.01)
    assert rec.facts["epoch_dropped_s"] == pytest.approx(epoch_cost(model(), priced, workers, True).dropped_s)
    said = words.recommendation(rec)
    assert said.title.endswith("kept alive between epochs and 1 batch each in flight")
    assert "--set prefetch_factor=1" in said.change
    assert ("the loop leaves each epoch early, and the batches in flight then are dropped: with prefetch_factor=1 a "
            "worker has 1 in flight, not 2") in said.reason


def test_workers_that_used_a_connection_opened_before_fork_are_advised_spawned_and_priced_with_spawns_start():
    from stallscope.analysis.epochs import spawned
    from stallscope.analysis.recommend import recommend
    from stallscope.render import words

    stats = StepStats(0, "optimizer", [Step(k, k * 80 * MS, (k + 1) * 80 * MS, 60 * MS, 0, 1, 8) for k in range(100)],
                      0, 8.0, 6.0, 0.0, 2.0, 0.0, 0.0, 800, 0.08, 0.08, 0.06, 0.08)
    train = LoaderSummary(0, "train", "train.py:1", {"num_workers": 1, "batch_size": 8, "torch_import_s": 1.5}, {},
                          100, 10, 6.0, 0.0, None)
    forked = recommend("input-bound", stats, train, {"transform": 6.0, "compute": 2.0}, 4, model=model(1),
                       epochs=shape())
    safe = recommend("input-bound", stats, train, {"transform": 6.0, "compute": 2.0}, 4, model=model(1),
                     epochs=shape(), connection_before_fork=True)
    before = next(r for r in forked if r.id == "num-workers")
    after = next(r for r in safe if r.id == "num-workers")
    assert "multiprocessing_context" not in before.overrides
    assert after.overrides["multiprocessing_context"] == "spawn" and after.overrides["num_workers"] > 1
    # each of the 9 epoch starts now pays a spawn (the training process's torch import, side by side on the cores)
    priced = spawned(shape(), 1.5)
    assert (priced.worker_start_s, priced.serial_start) == (1.5, False)
    assert priced.worker_stop_s == pytest.approx(SPAWN_TEARDOWN_SHARE * 1.5)
    workers, keep = after.overrides["num_workers"], bool(after.overrides.get("persistent_workers"))
    assert after.predicted_speedup == pytest.approx(
        rate_over_epochs(model(1), replace(priced, prefetch_factor=after.facts["prefetch_factor"]), workers, keep)
        / rate_over_epochs(model(1), shape(), 1, False), abs=0.01)
    said = words.recommendation(after)
    assert said.title.endswith("spawned") and "--set multiprocessing_context=spawn" in said.change
    assert "pitfall connection-before-fork" in said.reason
    assert spawned(shape(), None).worker_start_s == TYPICAL_SPAWN_START_S
