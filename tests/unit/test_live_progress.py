"""The live view's running tally, from hand-written event files and an injected clock."""

from __future__ import annotations

import json
import re

from stallscope.render.live import render_status
from stallscope.sample.progress import Progress, ProgressTally

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _write(path, *lines, role="main", header=True):
    with open(path, "a", encoding="utf-8") as f:
        if header:
            f.write(json.dumps({"header": {"pid": int(path.name.split(".")[0]), "role": role}}) + "\n")
        f.writelines(json.dumps(line) + "\n" for line in lines)


def _next(start_ms, end_ms, iterator=1):
    return ["next", 1, iterator, 0, start_ms * MS, end_ms * MS, -1, 8, 0, 0]


def _opt(at_ms):
    return ["opt", 7, "SGD", at_ms * MS - MS // 2, at_ms * MS]


def test_steps_wait_and_rate_from_appended_lines(tmp_path):
    clock = Clock()
    tally = ProgressTally(tmp_path, clock=clock)
    assert tally.poll() == Progress(0, None, None, None, 0.0)

    main = tmp_path / "100.jsonl"
    # the first batch (workers starting) is not data wait; then 3 steps of 100 ms, each waiting 40 ms
    _write(main, [_next(0, 500), _opt(560)], [_next(600, 640), _opt(700), _next(700, 740), _opt(800)])
    clock.now = 1000 * MS
    first = tally.poll()
    assert first.steps == 3 and first.data_wait_fraction == 80 / 300
    assert first.steps_per_s is None  # one poll with steps: no rate yet

    _write(main, [_next(800, 840), _opt(900), _opt(901), _next(900, 940), _opt(1000)], header=False)
    clock.now = 2000 * MS
    second = tally.poll()
    assert second.steps == 5  # two optimizers stepped on one batch are one step
    assert second.steps_per_s == 2.0  # 2 more steps in the 1 s since the last poll
    assert second.data_wait_fraction == 160 / 500
    assert second.leading == "loader"  # waiting, but no worker's fetch seen yet
    assert second.elapsed_s == 2.0


def test_a_cut_line_waits_for_its_end(tmp_path):
    clock = Clock()
    main = tmp_path / "100.jsonl"
    _write(main, [_next(0, 10), _opt(20)])
    whole = json.dumps([_next(20, 30), _opt(40)])
    with open(main, "a", encoding="utf-8") as f:
        f.write(whole[:15])  # a process in the middle of a write
    tally = ProgressTally(tmp_path, clock=clock)
    assert tally.poll().steps == 1
    with open(main, "a", encoding="utf-8") as f:
        f.write(whole[15:] + "\n")
    assert tally.poll().steps == 2


def test_leading_input_stage_from_workers_timed_fetches(tmp_path):
    clock = Clock()
    main, worker = tmp_path / "100.jsonl", tmp_path / "101.jsonl"
    _write(main, [_next(0, 10), _opt(20), _next(20, 80), _opt(100), _next(100, 160), _opt(180)])
    # fetch: 50 ms wall, 45 ms CPU of which 30 ms in a decode call (40 ms wall); off-CPU outside calls: 5 ms
    fetch = ["fetch", 1, 1, 0, 0, 0, 50 * MS, 45 * MS, 0, 8, {"decode": [40 * MS, 30 * MS, 8]}, {}, None, True]
    untimed = ["fetch", 1, 1, 0, 1, 0, 90 * MS, 90 * MS, 0, 8, {}, {}, None, False]
    _write(worker, [fetch, untimed], role="worker")
    clock.now = 200 * MS
    progress = ProgressTally(tmp_path, clock=clock).poll()
    assert progress.data_wait_fraction == 120 / 170
    assert progress.leading == "decode"
    assert progress.steps == 3


def test_compute_leads_when_batches_are_ready(tmp_path):
    clock = Clock()
    _write(tmp_path / "100.jsonl", [_next(0, 10), _opt(100), _next(100, 101), _opt(200), _next(200, 201), _opt(300)])
    clock.now = 400 * MS
    assert ProgressTally(tmp_path, clock=clock).poll().leading == "compute"


def test_status_line_fits_the_terminal():
    progress = Progress(123456, 11.64, 0.43, "transform", 30.0)
    text = re.sub(r"\x1b\[[0-9;]*m", "", render_status(progress, 200).decode())
    assert text == "stallscope ▸ step 123,456 · 11.6 steps/s · data wait 43% · leading so far: transform"
    narrow = re.sub(r"\x1b\[[0-9;]*m", "", render_status(progress, 40).decode())
    assert len(narrow) <= 39 and narrow.endswith("…") and "\n" not in narrow
    starting = re.sub(r"\x1b\[[0-9;]*m", "", render_status(Progress(0, None, None, None, 4.2), 120).decode())
    assert starting == "stallscope ▸ starting, 4 s, no training step yet"


def test_ranks_are_counted_when_the_launched_process_takes_no_batch(tmp_path):
    clock = Clock()
    _write(tmp_path / "100.jsonl", [["process_start", 0, ["torchrun"]]])  # torchrun itself: no batches
    _write(tmp_path / "101.jsonl", [_next(0, 10), _opt(20), _next(20, 30), _opt(40)], role="rank")
    _write(tmp_path / "102.jsonl", [_next(0, 10), _opt(20), _next(20, 30), _opt(40)], role="rank")
    spawned = tmp_path / "103.jsonl"  # an mp.spawn child names its role in a record, not in its header
    _write(spawned, [["role", "rank"], _next(0, 10), _opt(20)], role="child")
    clock.now = 100 * MS
    assert ProgressTally(tmp_path, clock=clock).poll().steps == 2  # one rank's steps, not the sum
    only_spawned = tmp_path / "spawned"
    only_spawned.mkdir()
    _write(only_spawned / "103.jsonl", [["role", "rank"], _next(0, 10), _opt(20)], role="child")
    assert ProgressTally(only_spawned, clock=clock).poll().steps == 1


def test_rate_restarts_when_the_first_optimizer_step_turns_batches_into_steps(tmp_path):
    clock = Clock()
    main = tmp_path / "100.jsonl"
    _write(main, [_next(10 * k, 10 * k + 5) for k in range(6)])  # accumulating: 6 batches, no step yet
    tally = ProgressTally(tmp_path, clock=clock)
    clock.now = 100 * MS
    assert tally.poll().steps == 6
    _write(main, [_next(60, 65), _next(70, 75), _opt(80)], header=False)  # 8 batches made one step
    clock.now = 200 * MS
    progress = tally.poll()
    assert progress.steps == 1 and progress.steps_per_s is None  # never negative
    _write(main, [_next(80 + 10 * k, 85 + 10 * k) for k in range(8)] + [_opt(170)], header=False)
    clock.now = 1200 * MS
    assert tally.poll().steps_per_s == 1.0


def test_a_run_that_slows_says_so_in_the_status_line_after_three_minutes(tmp_path):
    """Steps at 10/s for 2 minutes, then at 5/s: from 3 minutes on, the line says 0.5x its first minute; a steady
    run says nothing. One segment per poll, as the recorder writes segments (recorder/events.py)."""
    clock = Clock()
    tally = ProgressTally(tmp_path, clock=clock)
    t_ms, seen = 0, []
    for second in range(1, 241):
        rate = 10 if second <= 120 else 5
        lines = []
        for _ in range(rate):
            t_ms += 1000 // rate
            lines.append([_next(t_ms - 10, t_ms - 5), _opt(t_ms)])
        _write(tmp_path / f"100.{second}.jsonl", *lines, header=True)
        clock.now = t_ms * MS
        seen.append(tally.poll())
    assert seen[-1].steps == 120 * 10 + 120 * 5  # every segment of the process counted
    assert all(p.trend is None for p in seen[:179])  # not before 3 minutes
    assert seen[-1].trend is not None and 0.45 < seen[-1].trend < 0.55
    line = re.sub(r"\x1b\[[0-9;]*m", "", render_status(seen[-1], 200).decode())
    assert "slower: 0.50x its first minute" in line or "slower: 0.5" in line


def test_a_steady_run_shows_no_trend(tmp_path):
    clock = Clock()
    tally = ProgressTally(tmp_path, clock=clock)
    t_ms = 0
    for second in range(1, 301):
        _write(tmp_path / f"100.{second}.jsonl", *[[_next(t_ms + k * 100 + 90, t_ms + k * 100 + 95),
                                                     _opt(t_ms + k * 100 + 100)] for k in range(10)])
        t_ms += 1000
        clock.now = t_ms * MS
        progress = tally.poll()
    assert progress.steps == 3000 and progress.trend is None
