"""The one reader of system samples, and every consumer agreeing with it when the sampler skipped a tick."""

from __future__ import annotations

import dataclasses

import pytest

from stallscope.analysis import analyze
from stallscope.history.runs import row_from_session
from stallscope.render import html, trace
from stallscope.render.summary import summary_dict
from stallscope.system_samples import SystemSamples
from tests.unit.report_fixtures import PID, T0, two_worker_session

MS = 1_000_000
MIB = 2 ** 20
GIB = 2 ** 30


def _block() -> dict:
    """Five ticks. The worker (pid 200) was not readable at tick 2: the sampler skips such a tick, so its
    values are listed at ticks 0, 1, 3, 4. Two GPUs, one of them without a reading at tick 1."""
    return {
        "schema": "stallscope.samples/1", "interval_s": 0.1, "t_ns": [T0 + i * 100 * MS for i in range(5)],
        "system": {"cpu_percent": [10.0, 20.0, 30.0, 40.0, 50.0], "per_core_percent": [[5.0, 15.0]] * 5},
        "processes": {
            str(PID): {"first": 0, "ticks": [0, 1, 2, 3, 4], "cpu_s": [0.1, 0.2, 0.3, 0.4, 0.5],
                       "rss_bytes": [100 * MIB] * 5, "ppid": 1},
            "200": {"first": 0, "ticks": [0, 1, 3, 4], "cpu_s": [0.0, 0.1, 0.2, 0.3],
                    "rss_bytes": [10 * MIB, 20 * MIB, 400 * MIB, 30 * MIB], "ppid": PID},
        },
        "gpu": {"names": ["A", "B"], "util_percent": [[10, 90], [20, None], [30, 70], [40, 60], [50, 50]],
                "mem_used_bytes": [[1 * GIB, 2 * GIB], [3 * GIB, 2 * GIB], [1 * GIB, 5 * GIB], [1, 1], [1, 1]]},
    }


def test_values_sit_at_their_own_ticks() -> None:
    samples = SystemSamples.read(_block())
    tree = samples.tree_rss()
    # tick 2 holds the main process only; the worker's 400 MiB belongs to tick 3, not to tick 2
    assert tree == [110 * MIB, 120 * MIB, 100 * MIB, 500 * MIB, 130 * MIB]
    assert samples.tree_rss_peak == 500 * MIB
    assert samples.processes[200].rss_peak == 400 * MIB
    assert samples.gpu_series("util_percent") == [[10, 20, 30, 40, 50], [90, None, 70, 60, 50]]
    assert samples.gpu_util_mean() == pytest.approx((10 + 20 + 30 + 40 + 50 + 90 + 70 + 60 + 50) / 9)
    assert samples.peak_device_memory() == 5 * GIB
    assert samples.cpu_between(200, T0, T0 + 400 * MS) == pytest.approx(0.3)


def test_entries_without_ticks_and_garbage_read_as_absent_not_zero() -> None:
    old = SystemSamples.read({"t_ns": [0, 1, 2], "processes": {"7": {"first": 1, "rss_bytes": [5, 6]}}})
    assert old.processes[7].ticks == [1, 2] and old.tree_rss() == [None, 5, 6]
    for garbage in (None, "x", {"t_ns": "garbage", "processes": []}, {"t_ns": [0], "gpu": None}):
        samples = SystemSamples.read(garbage)
        assert samples.tree_rss_peak is None and samples.gpu_util_mean() is None
        assert samples.peak_device_memory() is None


def test_summary_history_report_and_trace_agree_on_a_skipped_tick() -> None:
    session = dataclasses.replace(two_worker_session(), system_samples=_block())
    analysis = analyze(session)
    summary = summary_dict(session, analysis, None)
    row = row_from_session(session, analysis, None)
    samples = session.system

    # per-process and process-tree peak RSS
    worker = next(w for w in summary["system"]["workers"] if w["pid"] == 200)
    assert worker["rss_peak"] == samples.processes[200].rss_peak == 400 * MIB
    assert summary["system"]["tree_rss_peak"] == row.peak_rss_bytes == 500 * MIB

    figure = html.system_figure(session)
    series = {trace_["name"]: trace_["y"] for trace_ in figure["data"]}
    assert [v * GIB for v in series["process tree RSS (GiB)"]] == samples.tree_rss()
    assert series["GPU0 utilization %"] == [10, 20, 30, 40, 50]
    assert series["GPU1 utilization %"] == [90, None, 70, 60, 50]
    assert [v * GIB if v is not None else None for v in series["GPU1 memory used (GiB)"]] == \
        samples.gpu_series("mem_used_bytes")[1]

    events = trace.render(session, analysis)["traceEvents"]
    rss = [e["args"]["value"] * MIB for e in events if e["ph"] == "C" and e["name"] == "process tree RSS (MiB)"]
    assert rss == samples.tree_rss()
    gpu1 = [e["args"].get("gpu1") for e in events if e["ph"] == "C" and e["name"] == "gpu util_percent"]
    assert gpu1 == [90, None, 70, 60, 50]

    # the summary's GPU figures are the same series', and the history's
    assert summary["system"]["gpu_util_mean"] == [pytest.approx(30.0), pytest.approx(67.5)]
    assert summary["system"]["gpu_mem_peak"] == [3 * GIB, 5 * GIB] and row.peak_device_mem_bytes == 5 * GIB
    assert row.gpu_util_mean == pytest.approx(samples.gpu_util_mean())


def _late_worker_block() -> dict:
    """Twenty ticks of 0.25 s on 2 cores, both busy all along. The training process uses one core from the start;
    a worker starts at 1.0 s (tick 4) but the sampler, which looks for new processes once a second, reads it
    first at tick 8; from there it uses the other core, except 0.2 of a core that another program takes from
    tick 12 on. The worker ends after tick 16; the last three ticks hold the training process alone."""
    dt = 0.25
    ticks = list(range(20))
    main_cpu = [round(i * dt, 6) for i in ticks]
    worker_ticks = list(range(8, 17))
    worker_cpu = [round((t - 4) * dt - max(0, t - 12) * 0.2 * dt, 6) for t in worker_ticks]
    per_core = [[100.0, 100.0]] * 17 + [[100.0, 0.0]] * 3
    return {
        "schema": "stallscope.samples/1", "interval_s": dt, "t_ns": [T0 + i * 250 * MS for i in ticks],
        "system": {"cpu_percent": [100.0] * 20, "per_core_percent": per_core},
        "processes": {
            str(PID): {"first": 0, "ticks": ticks, "cpu_s": main_cpu, "rss_bytes": [MIB] * 20, "ppid": 1},
            "300": {"first": 8, "ticks": worker_ticks, "cpu_s": worker_cpu, "rss_bytes": [MIB] * 9, "ppid": PID},
        },
    }


def test_other_programs_cpu_leaves_out_ticks_where_a_new_process_ran_unseen() -> None:
    from stallscope.analysis.system_metrics import _other_cores

    block = _late_worker_block()
    samples = SystemSamples.read(block)
    # The sampler looks for new processes when more than 1 s has passed since it last looked, at a tick: a process
    # may run unseen for up to 1 s and one interval. Ticks 3-8 (the worker's first reading, at 2.0 s, less 1.25 s,
    # and the tick that interval ends in) and 17 (it ended between two readings) are left out. Counted: ticks 1-2
    # (other 1.0: the worker had not started, yet core 2 was busy), 9-12 (0.0), 13-16 (0.2) and 18-19 (0.0).
    assert _other_cores(samples) == pytest.approx((2 * 1.0 + 4 * 0.2) / 12)
    # Within a window (the steady steps) only its ticks count: ticks 10-16 -> (3 * 0.0 + 4 * 0.2) / 7.
    assert _other_cores(samples, T0 + 9 * 250 * MS, T0 + 16 * 250 * MS) == pytest.approx(4 * 0.2 / 7)
    # Ticks a few hundred microseconds off their schedule, as a sampler's are, leave out the same ticks.
    wobbly = dict(block, t_ns=[t + (300_000 if i % 2 else -300_000) for i, t in enumerate(block["t_ns"])])
    assert _other_cores(SystemSamples.read(wobbly)) == pytest.approx((2 * 1.0 + 4 * 0.2) / 12, rel=0.01)


def test_a_process_the_recorder_saw_and_the_sampler_never_read_is_not_other_programs_cpu() -> None:
    """A DataLoader worker of an epoch shorter than the sampler's look (TREE_REFRESH_S) ran between two looks: the
    recorder saw it (its header, its fetches), the sampler never read it. The ticks of its life are left out: the
    core it kept busy is the job's, where counting it made a quiet machine look half busy (its advice then priced
    a second worker on 1.6 CPUs instead of 2)."""
    from stallscope.analysis.system_metrics import _other_cores, _unseen_processes
    from stallscope.constants import SESSION_SCHEMA
    from stallscope.session import FetchRecord, ProcessRecord, Session

    block = _late_worker_block()
    del block["processes"]["300"]  # never read: its core 2 busy looks like someone else's at ticks 8-16
    samples = SystemSamples.read(block)
    assert _other_cores(samples) > 0.5
    worker = ProcessRecord(pid=301, ppid=PID, role="worker", argv=[], wall_ns=0, mono_ns=T0 + 4 * 250 * MS)
    fetch = FetchRecord(loader_id=0, iter_id=0, worker=0, seq=0, start_ns=T0 + 5 * 250 * MS,
                        end_ns=T0 + 16 * 250 * MS + 1000, cpu_ns=0, runqueue_ns=0, items=1, by_node={}, by_name={},
                        outcome=None, pid=301)
    session = Session(schema=SESSION_SCHEMA, run_id="t", command=["x"], cwd="/", started_wall=0.0, start_ns=T0,
                      end_ns=T0 + 20 * 250 * MS, exit_code=0, ended_by="exit", overrides={}, max_steps=None,
                      environment={}, processes=[worker], fetches=[fetch], system_samples=block)
    unseen = _unseen_processes(session)
    assert unseen == [(T0 + 4 * 250 * MS, T0 + 16 * 250 * MS + 1000)]
    # ticks 5-17 left out; counted: 1-4 (other 1.0: core 2 busy before the worker's recorder started) and 18-19 (0)
    assert _other_cores(samples, unseen=unseen) == pytest.approx(4 * 1.0 / 6)
