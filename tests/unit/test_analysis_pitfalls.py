"""Each pitfall fires on its evidence and stays quiet without it (hand-built sessions)."""

from __future__ import annotations

from dataclasses import replace

from stallscope.analysis import analyze
from stallscope.analysis.system_metrics import summarize_samples
from stallscope.session import ErrorRecord, FetchRecord, IterRecord, WorkerStartRecord
from tests.unit.test_analysis_steps import MS, PID, make_session, nxt, opt

MIB = 1 << 20


def base(workers=2, **config):
    nexts = [NextWithWorker(k) for k in range(6)]
    opts = [opt(100 * k + 90, 100 * k + 100) for k in range(6)]
    session = make_session(nexts, opts, workers=workers)
    loader = session.loaders[0]
    loader = replace(loader, config={**loader.config, "prefetch_factor": 2, "pin_memory": False,
                                     "multiprocessing_context": "fork", **config})
    return replace(session, loaders=[loader])


def NextWithWorker(k):  # noqa: N802 - reads like a record constructor
    return replace(nxt(100 * k, 100 * k + 50), worker=k % 2)


def ids(session):
    return {p.id for p in analyze(session).pitfalls}


def test_quiet_session_has_no_pitfalls():
    assert ids(base()) == set()


def test_unpinnable_batch_only_matters_with_pin_memory():
    info = [{"loader_id": 0, "iter_id": 0, "type": "Batch", "tensors": 2, "nbytes": 1024, "dtypes": {},
             "unpinnable": ["Batch"], "pinnable": False}]
    assert "unpinnable-batch" not in ids(replace(base(), batch_info=info))
    assert "unpinnable-batch" in ids(replace(base(pin_memory=True), batch_info=info))


def test_shm_headroom_compares_batches_in_flight_with_free_shm():
    info = [{"loader_id": 0, "iter_id": 0, "type": "list", "tensors": 2, "nbytes": 40 * MIB, "dtypes": {},
             "unpinnable": [], "pinnable": True}]
    roomy = [{"id": "shm", "data": {"free_bytes": 8192 * MIB}}]
    tight = [{"id": "shm", "data": {"free_bytes": 64 * MIB}}]
    assert "shm-headroom" not in ids(replace(base(), batch_info=info, checks=roomy))
    assert "shm-headroom" in ids(replace(base(), batch_info=info, checks=tight))


def test_cuda_in_forked_worker_is_named():
    err = ErrorRecord("worker", 7, 0, "RuntimeError", "Cannot re-initialize CUDA in forked subprocess. To use "
                      "CUDA with multiprocessing, you must use the 'spawn' start method", None, "", 0, 1)
    assert "cuda-in-forked-worker" in ids(replace(base(), errors=[err]))


def test_lmdb_opened_before_fork_and_never_reopened():
    session = replace(base(), iters=[IterRecord(0, 0, 0, 10 * MS, 12 * MS, 2, PID)],
                      worker_starts=[WorkerStartRecord(0, 0, 0, 501, 10 * MS, 20 * MS, 21 * MS, {})])
    early = [{"pid": PID, "t_ns": 1 * MS, "path": "/data/train.lmdb"}]
    assert "lmdb-before-fork" in ids(replace(session, lmdb_opens=early))
    reopened = early + [{"pid": 501, "t_ns": 30 * MS, "path": "/data/train.lmdb"}]
    assert "lmdb-before-fork" not in ids(replace(session, lmdb_opens=reopened))


def test_thread_oversubscription_in_workers():
    starts = [WorkerStartRecord(0, 0, w, 500 + w, 0, 1, 2, {"torch": 1, "cv2": 4}) for w in range(2)]
    session = replace(base(), worker_starts=starts)
    session = replace(session, environment={"cpus_affinity": 4})
    assert "thread-oversubscription" in ids(session)
    single = [replace(s, threads={"torch": 1, "cv2": 1}) for s in starts]
    assert "thread-oversubscription" not in ids(replace(session, worker_starts=single))


def _fetches(worker_wall_ms, runqueue_ms=0):
    out = []
    for k in range(6):
        w = k % len(worker_wall_ms)
        start = 100 * k * MS
        out.append(FetchRecord(0, 0, w, k, start, start + worker_wall_ms[w] * MS, 5 * MS, runqueue_ms * MS, 4,
                               {}, {}, None, 500 + w))
    return out


def test_workers_above_cores_needs_cpu_waiting():
    many = base(workers=8)
    assert "workers-above-cores" in ids(replace(many, fetches=_fetches([20, 20], runqueue_ms=10)))
    assert "workers-above-cores" not in ids(replace(many, fetches=_fetches([20, 20], runqueue_ms=0)))


def test_worker_private_memory_growth_from_samples():
    starts = [WorkerStartRecord(0, 0, 0, 501, 0, 1, 2, {})]
    samples = {"t_ns": [k * 100 * MS for k in range(30)], "interval_s": 0.1,
               "processes": {"501": {"ticks": list(range(30)), "cpu_s": [0.1 * k for k in range(30)],
                                     "rss_bytes": [400 * MIB] * 30, "read_bytes": [None] * 30,
                                     "uss_ticks": [0, 10, 20, 29],
                                     "uss_bytes": [50 * MIB, 120 * MIB, 190 * MIB, 260 * MIB]}}}
    session = replace(base(), worker_starts=starts, system_samples=samples)
    assert "worker-memory-growth" in ids(session)
    flat = {**samples, "processes": {"501": {**samples["processes"]["501"], "uss_bytes": [50 * MIB] * 4}}}
    assert "worker-memory-growth" not in ids(replace(session, system_samples=flat))
    # the same climb before the worker's loop started (a spawned worker importing torch, unpickling the dataset)
    # is its start-up: from then on it holds still
    # resident memory flat, then climbing 400 MiB, then flat from the worker loop's start at 2.5 s on
    climb = [200 * MIB] * 15 + [(200 + 40 * k) * MIB for k in range(1, 11)] + [600 * MIB] * 5
    settled = {**samples, "processes": {"501": {**samples["processes"]["501"], "rss_bytes": climb,
                                                "uss_bytes": [50 * MIB] * 4}}}
    assert "worker-memory-growth" in ids(replace(session, system_samples=settled))  # counted from the first tick
    started_late = [replace(starts[0], ready_ns=2500 * MS)]
    late = replace(session, worker_starts=started_late, system_samples=settled)
    assert "worker-memory-growth" not in ids(late)
    (worker,) = summarize_samples(late).workers
    assert worker.rss_peak == 600 * MIB and worker.rss_start == 600 * MIB  # the peak stays the whole life's


def test_one_slow_worker_holds_up_in_order_batches():
    session = base()
    # Worker 1 takes 4x longer per batch; most requests find no batch ready.
    fetches = []
    for k in range(6):
        w = k % 2
        start = 100 * k * MS
        fetches.append(FetchRecord(0, 0, w, k // 2, start, start + (20 if w == 0 else 80) * MS, 5 * MS, 0, 4,
                                   {}, {}, None, 500 + w))
    from stallscope.session import SendRecord

    sends = [SendRecord(0, 0, 0, k, k % 2, (100 * k - 1) * MS) for k in range(6)]
    nexts = [replace(nxt(100 * k + 10, 100 * k + 90), worker=k % 2) for k in range(6)]
    slow = replace(session, fetches=fetches, sends=sends, nexts=nexts)
    assert "slow-worker" in ids(slow)
    even = [replace(f, end_ns=f.start_ns + 20 * MS) for f in fetches]
    assert "slow-worker" not in ids(replace(slow, fetches=even))


def _stall(start_ms, end_ms, how="KeyboardInterrupt", message=""):
    from stallscope.session import StallRecord

    return StallRecord(0, 0, 0, start_ms * MS, end_ms * MS, how, message, [0, 1], 0, [], PID)


def test_a_long_blocked_next_is_a_stall_and_a_short_one_cut_by_ctrl_c_is_not():
    steps_ms = 100  # the base session's steps: one every 100 ms, 50 ms of it waiting
    long = analyze(replace(base(), stalls=[_stall(600, 600 + 11 * steps_ms)]))
    [stall] = [p for p in long.pitfalls if p.id == "loader-stalled"]
    assert stall.facts["seconds"] == 1.1 and stall.facts["pending_workers"] == [0, 1]
    quiet = analyze(replace(base(), stalls=[_stall(600, 640)]))
    assert "loader-stalled" not in {p.id for p in quiet.pitfalls}
    # Either way the blocked time is data wait of the run, charged to the loader stage.
    plain = analyze(base())
    assert long.steps.stalled_s == 1.1 and quiet.steps.stalled_s == 0.04
    assert abs(long.steps.wait_s - plain.steps.wait_s - 1.1) < 1e-9
    assert abs(long.node_seconds["loader"] - plain.node_seconds["loader"] - 1.1) < 1e-9
    assert long.data_wait_fraction > plain.data_wait_fraction


def test_a_timeout_is_a_stall_however_short_and_a_worker_error_re_raised_is_not():
    timed_out = _stall(600, 650, "RuntimeError", "DataLoader timed out after 0.05 seconds")
    assert "loader-stalled" in ids(replace(base(), stalls=[timed_out]))
    err = ErrorRecord("worker", 7, 0, "ValueError", "bad sample", None, "", 0, 1)
    re_raised = _stall(600, 3000, "ValueError", "bad sample")
    assert "loader-stalled" not in ids(replace(base(), stalls=[re_raised], errors=[err]))


def test_a_stall_is_the_loader_of_its_own_process_and_dead_workers_are_said_as_such():
    """Loader ids are per process: a spawned worker that ran the script's module code again (no __main__ guard)
    has a loader 0 of its own, and its stall is not the training process's. Where workers died, the pitfall
    says so, and under spawn why it often happens."""
    from stallscope.render import words

    died = replace(_stall(600, 3000, "RuntimeError", "DataLoader worker (pid(s) 9) exited unexpectedly"), dead=[1])
    [stall] = [p for p in analyze(replace(base(), stalls=[died])).pitfalls if p.id == "loader-stalled"]
    assert "loader-stalled" not in ids(replace(base(), stalls=[replace(died, pid=PID + 1)]))
    said = words.pitfall(stall)
    assert said.title == "The DataLoader's workers died" and "worker 1 was no longer alive" in said.evidence
    assert "out of memory" in said.fix
    spawned = words.pitfall(replace(stall, facts={**stall.facts, "start_method": "spawn"}))
    assert 'if __name__ == "__main__":' in spawned.fix
    hung = words.pitfall(replace(stall, facts={**stall.facts, "dead_workers": []}))
    assert hung.title == "The DataLoader stopped delivering batches" and "py-spy dump" in hung.fix
    for ending in ("KeyboardInterrupt", "SIGTERM"):  # an interrupt or a kill ends the workers too, after the hang
        cut = words.pitfall(replace(stall, facts={**stall.facts, "how": ending}))
        assert cut.title == "The DataLoader stopped delivering batches", ending


def test_another_processs_loader_of_the_same_id_lends_the_training_loader_none_of_its_records():
    """Spawned workers 500 and 501 ran the script's module code again (no __main__ guard) and each built a loader 0
    of its own; 501 started a worker of its own, 600, which raised ValueError. 500 and 501 still served the training
    loader as its workers: their fetches are its own. The training process's stall that ended in its own ValueError
    is not 600's error re-raised, and the training loader counts no worker error."""
    from stallscope.session import ProcessRecord

    session = replace(base(), fetches=_fetches([20, 20]))  # workers 0 and 1 are processes 500 and 501
    rerun_loaders = [replace(session.loaders[0], pid=pid) for pid in (500, 501)]
    processes = [*session.processes, ProcessRecord(500, PID, "worker", [], 0, 0),
                 ProcessRecord(501, PID, "worker", [], 0, 0), ProcessRecord(600, 501, "worker", [], 0, 0)]
    err = ErrorRecord("worker", 600, 0, "ValueError", "bad sample", None, "", 0, 0)
    its_own = replace(session.fetches[0], pid=600, worker=0, seq=99)  # 600 fetching for 501's loader 0
    in_itself = replace(session.fetches[0], pid=501, worker=-1, seq=98)  # 501 iterating its loader 0 itself
    stall = _stall(600, 3000, "ValueError", "bad sample")
    mixed = replace(session, loaders=[*session.loaders, *rerun_loaders], processes=processes, errors=[err],
                    stalls=[stall], fetches=[*session.fetches, its_own, in_itself])
    assert "loader-stalled" in ids(mixed)
    train = analyze(mixed).train_loader
    assert train.pipeline.errors == 0
    assert train.pipeline.batches == analyze(session).train_loader.pipeline.batches == 6  # 500's and 501's, not more
    # the same error in the training process's own worker is its error, re-raised
    own = replace(mixed, errors=[replace(err, pid=501, worker=1)])
    assert "loader-stalled" not in ids(own) and analyze(own).train_loader.pipeline.errors == 1


def test_the_worker_pitfall_and_the_worker_advice_name_one_count():
    """Issue 43, case 6: with 200 workers the pitfall said "use at most 2" and the next step "Use 3 instead of 200".
    The count is the recommendation's (the throughput model's); the pitfall cites it."""
    from stallscope.render import words

    analysis = analyze(replace(base(workers=200), fetches=_fetches([20, 20], runqueue_ms=10)))
    [pitfall] = [p for p in analysis.pitfalls if p.id == "workers-above-cores"]
    [advice] = [r for r in analysis.recommendations if "num_workers" in r.overrides]
    count = advice.overrides["num_workers"]
    assert count != analysis.usable_cpus  # the case where the two rules part
    fix = words.pitfall(pitfall).fix
    assert fix.startswith(f"use {count} worker{'s' if count != 1 else ''},"), fix
    assert f"Use {count} worker{'s' if count != 1 else ''} instead of 200" == words.recommendation(advice).title


def test_a_streaming_cache_smaller_than_its_shards_is_named_and_one_that_holds_them_is_not():
    def cache(limit):
        return {"cache_limit": limit, "shards": 200, "dataset_bytes": 200 * 64 * MIB, "predownload": 128}

    small = analyze(base(streaming_cache=cache(4096 * MIB)))
    found = next(p for p in small.pitfalls if p.id == "streaming-cache-limit")
    assert (found.facts["cache_limit"], found.facts["dataset_bytes"]) == (4096 * MIB, 200 * 64 * MIB)
    assert "streaming-cache-limit" not in ids(base(streaming_cache=cache(200 * 64 * MIB)))
    assert "streaming-cache-limit" not in ids(base(streaming_cache=cache(None)))  # no limit: the disk's


def test_a_connection_the_training_process_opened_and_its_workers_used_is_named_with_how_many_share_it():
    from stallscope.render import words

    session = replace(base(), worker_starts=[WorkerStartRecord(0, 0, w, 501 + w, 10 * MS, 20 * MS, 21 * MS, {})
                                             for w in range(2)])
    assert "connection-before-fork" not in ids(session)
    one = [{"pid": 501, "t_ns": 30 * MS, "opened_by": PID, "address": "s3.local:9000"}]
    found = next(p for p in analyze(replace(session, shared_connections=one)).pitfalls
                 if p.id == "connection-before-fork")
    assert found.node == "storage"
    assert found.facts == {"address": "s3.local:9000", "opened_by": "training process", "processes": 1,
                           "workers": 1, "at_once": 1, "loader_workers": 2}
    said = words.pitfall(found)
    assert "1 DataLoader worker sent requests to s3.local:9000" in said.evidence
    assert "with more workers" in said.evidence and "multiprocessing_context='spawn'" in said.fix
    both = one + [{"pid": 502, "t_ns": 31 * MS, "opened_by": PID, "address": "s3.local:9000"}]
    found = next(p for p in analyze(replace(session, shared_connections=both)).pitfalls
                 if p.id == "connection-before-fork")
    assert (found.facts["processes"], found.facts["workers"], found.facts["at_once"]) == (2, 2, 2)
    assert "their requests share one socket" in words.pitfall(found).evidence
    # one worker an epoch, restarted: never two at once
    restarted = replace(session, worker_starts=[WorkerStartRecord(0, it, 0, 501 + it, 10 * MS, 20 * MS, 21 * MS, {})
                                                for it in range(2)])
    found = next(p for p in analyze(replace(restarted, shared_connections=both)).pitfalls
                 if p.id == "connection-before-fork")
    assert (found.facts["processes"], found.facts["at_once"]) == (2, 1)
    assert "2 DataLoader workers (one at a time) sent" in words.pitfall(found).evidence
    assert "with more workers" in words.pitfall(found).evidence
