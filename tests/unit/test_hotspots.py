"""Hotspot attribution from hand-built stack samples: sites, libraries, exact shares, and the sampler's stack walk."""

from __future__ import annotations

import os
import signal
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from stallscope.analysis.hotspots import (
    hotspots,
    job_pids,
    library_name,
    site_of,
    top_of_stage,
)
from stallscope.recorder import calls, stacks
from stallscope.session import ProcessRecord, Session

STDLIB = sysconfig.get_paths()["stdlib"]
SITE = os.path.join(os.sep, "venv", "lib", "python3.11", "site-packages")
USER = os.path.join(os.sep, "home", "me", "train.py")


def frame(path: str, line: int, function: str) -> str:
    return f"{path}:{line}:{function}"


def row(stage: str, frames: list[str], count: int, loader_id: int = 0, pid: int = 10) -> dict:
    return {"pid": pid, "loader_id": loader_id, "stage": stage, "frames": frames, "count": count}


TOKENIZE = [frame(f"{SITE}/tokenizers/__init__.py", 80, "Tokenizer.encode"), frame(USER, 31, "Text.__getitem__"),
            frame(f"{SITE}/torch/utils/data/_utils/fetch.py", 54, "_MapDatasetFetcher.fetch")]
JSON = [frame(f"{STDLIB}/json/decoder.py", 353, "JSONDecoder.raw_decode"),
        frame(f"{STDLIB}/json/decoder.py", 337, "JSONDecoder.decode"),
        frame(f"{STDLIB}/json/__init__.py", 346, "loads"), frame(USER, 40, "Text.__getitem__")]
OWN_LOOP = [frame(USER, 22, "augment"), frame(USER, 31, "Text.__getitem__")]
SLEEP = [frame(USER, 50, "read_slowly"), frame(USER, 31, "Text.__getitem__")]
COLLATE = [frame(f"{SITE}/torch/utils/data/_utils/collate.py", 274, "collate_tensor_fn"),
           frame(f"{SITE}/torch/utils/data/_utils/collate.py", 155, "collate")]


def test_site_is_the_innermost_user_frame_with_the_library_frame_it_called():
    assert site_of(TOKENIZE) == (USER, 31, "Text.__getitem__", "tokenizers Tokenizer.encode")
    assert site_of(JSON) == (USER, 40, "Text.__getitem__", "json loads")
    assert site_of(OWN_LOOP) == (USER, 22, "augment", None)
    assert site_of(COLLATE) == (f"{SITE}/torch/utils/data/_utils/collate.py", 274, "collate_tensor_fn", None)
    assert site_of([]) is None


def test_a_comprehension_frame_is_a_line_of_its_function():
    assert site_of([frame(USER, 35, "tokenize.<locals>.<listcomp>"), frame(USER, 31, "Text.__getitem__")]) \
        == (USER, 35, "tokenize", None)


def test_library_names():
    assert library_name(f"{SITE}/numpy/_core/fromnumeric.py") == "numpy"
    assert library_name(f"{STDLIB}/re/__init__.py") == "re"
    assert library_name(f"{STDLIB}/json/decoder.py") == "json"
    assert library_name(f"{STDLIB}/random.py") == "random"


def test_shares_are_exact_and_ordered_by_share_of_step():
    samples = [row("transform", TOKENIZE, 60), row("transform", JSON, 30), row("transform", OWN_LOOP, 10),
               row("storage", SLEEP, 40), row("loader", COLLATE, 5)]
    found = hotspots(samples, {"transform": 0.5, "storage": 0.25, "loader": 0.05, "compute": 0.2})
    got = [(h.stage, h.line, h.library, h.samples, h.share_of_stage, h.share_of_step) for h in found]
    assert got == [
        ("transform", 31, "tokenizers Tokenizer.encode", 60, 0.6, 0.3),
        ("storage", 50, None, 40, 1.0, 0.25),
        ("transform", 40, "json loads", 30, 0.3, 0.15),
        ("transform", 22, None, 10, 0.1, 0.05),
        ("loader", 274, None, 5, 1.0, 0.05),
    ]
    assert found[0].to_dict() == {"stage": "transform", "file": USER, "line": 31, "function": "Text.__getitem__",
                                  "share_of_stage": 0.6, "share_of_step": 0.3,
                                  "library": "tokenizers Tokenizer.encode"}
    assert [h.line for h in top_of_stage(found, "transform", 2)] == [31, 40]


def test_rows_of_one_site_add_up_and_empty_stacks_count_in_their_stage():
    samples = [row("transform", OWN_LOOP, 3, pid=10), row("transform", OWN_LOOP, 5, pid=11),
               row("transform", [], 2, pid=11)]
    (only,) = hotspots(samples, {"transform": 1.0})
    assert (only.samples, only.share_of_stage, only.share_of_step) == (8, 0.8, 0.8)


def test_only_the_training_loader_of_the_job_counts():
    samples = [row("transform", OWN_LOOP, 3, loader_id=0, pid=10), row("transform", JSON, 9, loader_id=1, pid=10),
               row("transform", TOKENIZE, 9, loader_id=0, pid=99)]
    (only,) = hotspots(samples, {"transform": 1.0}, loader_ids=[0], pids=[10, 11])
    assert (only.line, only.share_of_stage) == (22, 1.0)


def _process(pid: int, ppid: int, role: str) -> ProcessRecord:
    return ProcessRecord(pid, ppid, role, [], 0, 0)


def test_job_processes_are_the_training_process_and_everything_under_it():
    session = Session("stallscope.session/1", "r", [], "/", 0.0, 0, 1, 0, "exit", {}, None, {},
                      processes=[_process(10, 1, "main"), _process(11, 10, "worker"), _process(12, 10, "child"),
                                 _process(13, 12, "worker"), _process(20, 1, "child")])
    assert job_pids(session) == {10, 11, 12, 13}


def test_the_sampler_walk_reads_the_stage_of_the_call_in_progress():
    """A real thread blocked inside a timed call: the walk names the call's node and keeps the user's frames."""
    inside, release = threading.Event(), threading.Event()

    def user_code() -> None:
        inside.set()
        release.wait(10)

    timed = calls.timed_call(user_code, "decode", "planted")
    thread = threading.Thread(target=timed)
    thread.start()
    try:
        assert inside.wait(10)
        stage, stack = stacks.stack_of(sys._current_frames()[thread.ident])
    finally:
        release.set()
        thread.join()
    assert stage == "decode"
    functions = [code.co_name for code, _ in stack]
    assert "user_code" in functions, functions
    assert "wrapper" not in functions  # stallscope's own frames are left out


@pytest.mark.parametrize("value", ["0", "off"])
def test_a_sampler_that_cannot_start_says_why_once(monkeypatch, value):
    from stallscope.recorder import events

    emitted: list[tuple] = []
    monkeypatch.setattr(events, "emit", lambda *record: emitted.append(record))
    monkeypatch.setenv("STALLSCOPE_STACK_SAMPLE_HZ", value)
    monkeypatch.setattr(stacks, "_mode", stacks._UNDECIDED)
    stacks.fetch_started(0)
    stacks.fetch_ended()
    stacks.fetch_started(0)
    stacks.fetch_ended()
    assert [r[0] for r in emitted] == ["stack_sampler_off"]
    assert "STALLSCOPE_STACK_SAMPLE_HZ" in emitted[0][2]


@pytest.fixture
def fresh_sampler(monkeypatch):
    """This process's sampler as before its first fetch, at 400 Hz, events caught; put back as it was after.
    SIGALRM and the ITIMER_REAL timer are pytest-timeout's: set aside meanwhile."""
    from stallscope.recorder import events

    handler = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    timer = signal.setitimer(signal.ITIMER_REAL, 0)

    emitted: list[tuple] = []
    monkeypatch.setattr(events, "emit", lambda *record: emitted.append(record))
    monkeypatch.setenv("STALLSCOPE_STACK_SAMPLE_HZ", "400")
    for name, value in (("_mode", stacks._UNDECIDED), ("_counts", {}), ("_exit_hooked", True),
                        ("_handler_before", None), ("_armed", False), ("_fetching", None),
                        ("_thread_running", False), ("_fallback_reason", None)):
        monkeypatch.setattr(stacks, name, value)
    yield emitted
    stacks.fetch_ended()
    stacks._uninstall_handler()
    stacks._generation += 1  # a thread sampler stops at its next tick
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, *timer)


def _spin(seconds: float) -> int:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end: n += 1  # spin line
    return n


def _line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(marker))


def test_the_signal_sampler_counts_where_the_main_thread_is(fresh_sampler):
    """The handler's frame is the line running: a pure-Python loop (transform) and a sleep (storage, off the
    CPU); the handler is installed with SA_RESTART semantics and nothing of ours is left armed between fetches."""
    stacks.fetch_started(7)
    assert stacks._mode == stacks._SIGNAL
    assert signal.getsignal(signal.SIGALRM) is stacks._on_alarm
    _spin(0.4)
    time.sleep(0.3)  # sleep line
    stacks.fetch_ended()
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    by_site: dict[tuple[str, int], int] = {}
    for (loader_id, stage, stack), n in stacks._counts.items():
        assert loader_id == 7
        by_site[(stage, stack[0][1])] = by_site.get((stage, stack[0][1]), 0) + n
    total = sum(by_site.values())
    assert 150 < total < 400, by_site  # 0.7 s at 400 Hz
    assert by_site.get(("transform", _line_of("# spin line")), 0) > 0.45 * total, by_site
    assert by_site.get(("storage", _line_of("# sleep line")), 0) > 0.3 * total, by_site
    assert fresh_sampler == []  # no event from the handler


def test_a_script_with_its_own_sigalrm_keeps_it_and_gets_the_thread_sampler(fresh_sampler):
    def own(signum, frame):
        pass

    previous = signal.signal(signal.SIGALRM, own)
    try:
        stacks.fetch_started(0)
        assert stacks._mode == stacks._THREAD and stacks._thread_running
        assert signal.getsignal(signal.SIGALRM) is own
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        _spin(0.2)
        stacks.fetch_ended()
        assert sum(stacks._counts.values()) > 0
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_a_script_timer_set_between_fetches_is_put_back_and_the_sampler_gives_way(fresh_sampler):
    stacks.fetch_started(0)
    stacks.fetch_ended()
    assert stacks._mode == stacks._SIGNAL
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    stacks.fetch_started(0)
    assert stacks._mode == stacks._THREAD
    assert 29.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30.0
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_during_a_fetch_inherits_neither_timer_nor_handler(fresh_sampler):
    stacks.fetch_started(0)
    assert signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0)
    pid = os.fork()
    if pid == 0:
        ok = (signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
              and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL and stacks._mode == stacks._UNDECIDED
              and not stacks._counts)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    stacks.fetch_ended()
    assert os.waitstatus_to_exitcode(status) == 0


def _written(emitted: list[tuple]) -> list[tuple[str | None, str | None, int]]:
    """(sampler, fallback reason, samples) of each ``stack_samples`` event written."""
    return [(r[3], r[4], sum(row[3] for row in r[2])) for r in emitted if r[0] == "stack_samples"]


def test_the_counts_name_the_signal_sampler(fresh_sampler):
    stacks.fetch_started(0)
    _spin(0.1)
    stacks.fetch_ended()
    stacks.emit_counts()
    ((sampler, reason, n),) = _written(fresh_sampler)
    assert (sampler, reason) == ("signal", None) and n > 0


def test_when_the_signal_sampler_gives_way_its_counts_go_out_first_and_the_thread_samplers_say_why(fresh_sampler):
    stacks.fetch_started(0)
    _spin(0.1)
    stacks.fetch_ended()
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    stacks.fetch_started(0)  # the script's timer: the signal sampler gives way
    before = _written(fresh_sampler)
    assert {(s, r) for s, r, _ in before} == {("signal", None)} and sum(n for _, _, n in before) > 0
    _spin(0.2)
    stacks.fetch_ended()
    stacks.emit_counts()
    after = _written(fresh_sampler)[len(before):]
    timer = "the script runs an ITIMER_REAL timer (signal.alarm or setitimer)"
    assert {(s, r) for s, r, _ in after} == {("thread", timer)}
    assert sum(n for _, _, n in after) > 0
