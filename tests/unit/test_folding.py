"""Folding a long run's events as it goes (folding.py): raw segments, windows, what is kept, and a run read back
whole whenever its launcher stopped. The events are written by the recorder's own emitter, with chosen times."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from stallscope import folding
from stallscope.collect import read_event_files
from stallscope.folding import Folder, Limits, read_run
from stallscope.recorder import events

MS = 1_000_000
#: Small enough that a few thousand records fold as a run of days would.
LIMITS = Limits(window_ns=100 * MS, lead=300, trail=300, anomaly=200, period_s=0.1, lag_ns=50 * MS)


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STALLSCOPE_SEGMENT_BYTES", "4096")
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "start_ns": 0}))
    events.configure(tmp_path)
    yield tmp_path
    events.reset()


def _steps(first: int, count: int, step_ns: int = MS, slow: frozenset[int] = frozenset()) -> int:
    """Training steps from ``first``: a batch (next), then an optimizer step; a step in ``slow`` takes 50x longer.
    Returns when the last one ended."""
    t = first * step_ns
    for i in range(first, first + count):
        t += step_ns * (50 if i in slow else 1)
        events.emit("next", 0, 0, 0, t - step_ns, t - step_ns + step_ns // 4, -1, 4, 0, 0)
        events.emit("opt", 1, "SGD", t - step_ns // 4, t)
    events.flush()
    return t


def _totals(run: folding.FoldedRun) -> tuple[int, int]:
    pid = os.getpid()
    return (sum(r["steps"] for r in run.rows if r["pid"] == pid),
            sum(r["samples"] for r in run.rows if r["pid"] == pid))


def test_a_process_writes_segments_that_are_read_back_as_one(run_dir):
    for i in range(400):
        events.emit("next", 0, 0, 0, i, i + 1, -1, 4, 0, 0)
    events.flush()
    names = sorted(p.name for p in (run_dir / "events").iterdir())
    assert len(names) > 2 and f"{os.getpid()}.jsonl" in names and f"{os.getpid()}.1.jsonl" in names
    [(header, records)] = read_event_files(run_dir / "events")
    assert header["pid"] == os.getpid() and [r[4] for r in records] == list(range(400))


def test_a_long_run_keeps_the_leading_and_trailing_windows_and_counts_every_step(run_dir):
    folder = Folder(run_dir, persist=True, limits=LIMITS)
    end = 0
    for part in range(10):  # polled as the run goes, as the launcher does
        end = _steps(part * 500, 500)
        folder.poll(now_ns=end)
    folder.poll(now_ns=end, final=True)
    run = folder.result()
    assert _totals(run) == (5000, 20000)  # every step counted, folded or kept
    kept = sum(len(r) for r in run.records.values())
    assert kept <= LIMITS.lead + LIMITS.trail + 2 * 200  # the budgets, and at most one window over each
    assert run.folded and run.folded[0][0] > 0 and run.folded[-1][1] < end  # the middle, not the ends
    whys = [e["why"] for e in run.kept]
    assert whys[0] == "leading" and whys[-1] == "trailing"
    assert not list((run_dir / "events").glob("*.jsonl")), "every raw segment was folded and deleted"
    assert run.recording()["folded_counts"][str(os.getpid())]["steps"] == 5000 - sum(
        1 for r in run.records[os.getpid()] if r[0] == "opt")


def test_a_run_reads_back_the_same_whenever_its_launcher_stopped_folding(run_dir):
    """The launcher folds part of the run and is killed; the rest stays raw. Reading the folder back (without
    writing to it) gives the same steps as folding everything."""
    folder = Folder(run_dir, persist=True, limits=LIMITS)
    _steps(0, 1500)
    folder.poll(now_ns=1500 * MS)
    state = (run_dir / "folded" / "state.json").read_bytes()
    end = _steps(1500, 1500)  # written after the launcher died: raw only
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    monkey_limits = Limits.from_env()
    assert monkey_limits.window_ns == folding.WINDOW_NS  # read_run takes the state's window, not the default
    run = read_run(run_dir)
    assert _totals(run) == (3000, 12000)
    assert run.last_write[os.getpid()] >= end - MS
    assert (run_dir / "folded" / "state.json").read_bytes() == state, "reading changed nothing"
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before


def test_the_state_is_saved_at_most_every_state_period_and_nothing_it_does_not_name_is_deleted(run_dir):
    """Polled often, the state is written at most every ``state_ns`` of the poll's clock: raw segments and dropped
    detail stay until a saved state covers them, so a launcher killed between two saves loses nothing."""
    limits = dataclasses.replace(LIMITS, state_ns=10_000 * MS)
    folder = Folder(run_dir, persist=True, limits=limits)
    state = run_dir / "folded" / "state.json"
    end = _steps(0, 600)
    folder.poll(now_ns=end)  # the first poll saves
    saved = state.read_bytes()
    raw_before = sorted(p.name for p in (run_dir / "events").glob("*.jsonl"))
    for part in range(1, 8):  # every poll closes chunks, none saves: not 10 s of the clock yet
        end = _steps(part * 600, 600)
        folder.poll(now_ns=end)
    assert folder.closed_until > folder.saved_until
    assert state.read_bytes() == saved, "saved again before its period"
    raw = sorted(p.name for p in (run_dir / "events").glob("*.jsonl"))
    assert set(raw_before) <= set(raw), "a raw segment deleted that the saved state does not cover"
    kept_dirs = {e["dir"] for e in json.loads(saved)["kept"]}
    assert all((run_dir / "folded" / d).is_dir() for d in kept_dirs), "detail the saved state names was deleted"
    assert _totals(read_run(run_dir)) == (4800, 19200)  # what a report of the killed launcher's run would read
    folder.poll(now_ns=end + 10_000 * MS)  # the period has passed: saved, and what it covers deleted
    assert state.read_bytes() != saved and folder.saved_until == folder.closed_until
    assert len(list((run_dir / "events").glob("*.jsonl"))) < len(raw)
    folder.poll(now_ns=end + 10_000 * MS, final=True)
    assert _totals(folder.result()) == (4800, 19200)
    assert not list((run_dir / "events").glob("*.jsonl"))


def test_a_window_with_a_slow_step_is_kept_as_an_anomaly(run_dir):
    folder = Folder(run_dir, persist=True, limits=LIMITS)
    end = _steps(0, 3000, slow=frozenset({2000}))
    folder.poll(now_ns=end, final=True)
    run = folder.result()
    anomalies = [e for e in run.kept if e["why"] == "anomaly"]
    slow_end = 2050 * MS  # step 2000 took 50 ms
    assert len(anomalies) == 1 and anomalies[0]["start_ns"] <= slow_end < anomalies[0]["end_ns"], run.kept
    assert slow_end in {r[4] for r in run.records[os.getpid()] if r[0] == "opt"}  # kept in full, though mid-run
    assert any(b <= slow_end for a, b in run.folded) and any(a > slow_end for a, b in run.folded)
    assert _totals(run) == (3000, 12000)


def test_windows_double_rather_than_grow_past_the_limit(run_dir, monkeypatch):
    monkeypatch.setattr(folding, "MAX_WINDOWS", 8)
    folder = Folder(run_dir, persist=True, limits=LIMITS)
    end = _steps(0, 4000)
    folder.poll(now_ns=end, final=True)
    run = folder.result()
    assert run.window_ns > LIMITS.window_ns and len({r["start_ns"] for r in run.rows}) <= 8
    assert _totals(run) == (4000, 16000)
    starts = sorted(r["start_ns"] for r in run.rows)
    assert all(b - a == run.window_ns for a, b in zip(starts, starts[1:]))


def test_a_slow_run_keeps_its_detail_in_few_folders(run_dir):
    """Four records a chunk: kept chunks join the entry before them rather than each making a folder."""
    folder = Folder(run_dir, persist=True, limits=LIMITS)
    end = _steps(0, 2000, step_ns=50 * MS)  # 100 s, a thousand chunks
    folder.poll(now_ns=end, final=True)
    run = folder.result()
    assert _totals(run) == (2000, 8000)
    kept = sum(len(r) for r in run.records.values())
    assert LIMITS.lead <= kept <= LIMITS.lead + LIMITS.trail + 100
    folders = [p for p in (run_dir / "folded").iterdir() if p.is_dir() and p.name != "always"]
    assert 2 <= len(folders) <= 12, len(folders)
    reread = read_run(run_dir)  # the grouped folders read back the same
    assert sorted(map(tuple, reread.records[os.getpid()])) == sorted(map(tuple, run.records[os.getpid()]))


def test_the_garbage_collectors_cumulative_totals_are_counted_by_difference(run_dir):
    import gc

    from stallscope.recorder import gc_timing

    gc_timing.install()
    try:
        for _ in range(3):
            gc.collect()
        gc_timing.emit()
        events.flush()
    finally:
        gc_timing.uninstall()
    [(_, records)] = read_event_files(run_dir / "events")
    totals = [r for r in records if r[0] == "gc"]  # one a second at most from the callback, then emit()'s
    (_, t_ns, count, total, full, full_ns, _) = totals[-1]
    longest = max(r[6] for r in totals)  # each event's longest is since the one before (the callback's may be last)
    assert count >= 3 and full >= 3 and 0 < longest <= total and full_ns <= total
    assert all(a[2] <= b[2] and a[3] <= b[3] for a, b in zip(totals, totals[1:]))  # cumulative
    folder = Folder(run_dir, persist=False, limits=LIMITS)
    events.emit("gc", t_ns + 200 * MS, count + 5, total + 7 * MS, full, full_ns, 3 * MS)  # a later window's totals
    events.flush()
    folder.poll(final=True)
    rows = sorted((r for r in folder.result().rows if r.get("gc_collections")), key=lambda r: r["start_ns"])
    assert sum(r["gc_collections"] for r in rows[:-1]) == count and rows[-1]["gc_collections"] == 5
    assert rows[-1]["gc_ns"] == 7 * MS and rows[-1]["gc_longest_ns"] == 3 * MS


def test_records_that_arrive_after_their_chunk_closed_are_kept(run_dir):
    """A process that could not write for seconds (a loaded machine): its records reach the folder after their
    chunks closed. They are counted there and kept in detail, not lost to the analysis."""
    folder = Folder(run_dir, persist=True, limits=LIMITS)
    _steps(0, 200)  # 200 ms of steps, read and closed
    folder.poll(now_ns=1000 * MS)
    assert folder.closed_until is not None and folder.closed_until >= 200 * MS
    events.emit("next", 0, 0, 0, 150 * MS, 150 * MS + 10, -1, 4, 0, 0)  # a batch from 150 ms, written late
    events.emit("opt", 1, "SGD", 150 * MS + 20, 150 * MS + 30)
    events.flush()
    folder.poll(now_ns=2000 * MS, final=True)
    run = folder.result()
    starts = [r[4] for r in run.records[os.getpid()] if r[0] == "next"]
    assert 150 * MS in starts and len(starts) == 201
    reread = read_run(run_dir)
    assert sorted(r[4] for r in reread.records[os.getpid()] if r[0] == "next") == sorted(starts)
