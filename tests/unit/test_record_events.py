"""Event files: buffering, flushing, and a forked child that must not replay its parent's records."""

from __future__ import annotations

import json
import os

import pytest

from stallscope.collect import read_event_files
from stallscope.recorder import events


@pytest.fixture
def recorder(tmp_path):
    events.configure(tmp_path)
    yield tmp_path
    events.reset()


def _records(path):
    """(header, records) of one event file, read by the collector's own reader."""
    [(header, records)] = [(h, r) for h, r in read_event_files(path.parent) if h["pid"] == int(path.stem)]
    return header, records


def test_emit_buffers_until_flush(recorder):
    events.emit("a", 1)
    events.emit("b", [1, 2])
    assert not (recorder / "events").exists() or not list((recorder / "events").iterdir())
    events.flush()
    header, records = _records(recorder / "events" / f"{os.getpid()}.jsonl")
    assert header["pid"] == os.getpid()
    assert records == [["a", 1], ["b", [1, 2]]]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_writes_only_its_own_records(recorder):
    events.emit("parent-only", 1)
    pid = os.fork()
    if pid == 0:
        try:
            events.emit("child", 2)
            events.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    events.flush()
    _, child_records = _records(recorder / "events" / f"{pid}.jsonl")
    _, parent_records = _records(recorder / "events" / f"{os.getpid()}.jsonl")
    assert child_records == [["child", 2]]
    assert parent_records == [["parent-only", 1]]


def test_disabled_recorder_is_a_no_op():
    events.reset()
    events.emit("x")
    events.flush()
    assert not events.enabled()


def test_records_are_written_in_lines_and_a_torn_last_line_loses_only_itself(recorder):
    n = 3 * events.RECORDS_PER_LINE + 5
    for i in range(n):
        events.emit("r", i, {"k": [i]})
    events.flush()
    path = recorder / "events" / f"{os.getpid()}.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 1 + 4  # the header, then lines of up to RECORDS_PER_LINE records
    _, records = _records(path)
    assert records == [["r", i, {"k": [i]}] for i in range(n)]
    # a process killed in the middle of writing its last line: the lines before it are intact
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    _, records = _records(path)
    assert records == [["r", i, {"k": [i]}] for i in range(3 * events.RECORDS_PER_LINE)]


def test_files_with_one_record_per_line_are_still_read(recorder):
    events_dir = recorder / "events"
    events_dir.mkdir()
    header = {"pid": 4242, "ppid": 1, "role": "main", "wall_ns": 0, "mono_ns": 0}
    (events_dir / "4242.jsonl").write_text(json.dumps({"header": header}) + "\n" + '["a",1]\n["b",[1,2]]\n')
    assert _records(events_dir / "4242.jsonl") == (header, [["a", 1], ["b", [1, 2]]])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (ENOSPC on every write)")
def test_events_that_cannot_be_written_are_said_once_and_never_raise(recorder, capsys, monkeypatch):
    events.emit("a", 1)
    events.flush()  # the file is open
    monkeypatch.setattr(events, "_warned_write", False)
    full = open("/dev/full", "w", encoding="utf-8")  # noqa: SIM115 - closed by events.reset
    monkeypatch.setattr(events, "_file", full)
    for k in range(3):
        events.emit("b", k)
        events.flush()  # the script must never see the recorder's write errors
    err = capsys.readouterr().err
    # named with the file it was writing: a write on a full disk names none in Python's own words
    assert err.count(f"could not be written ({recorder / 'events' / f'{os.getpid()}.jsonl'}: no space left on "
                     "device)") == 1, err
    assert f"events of process {os.getpid()}" in err


def test_a_line_cut_short_is_skipped_and_counted(tmp_path):
    from stallscope.collect import build_session

    events_dir = tmp_path / "events"
    events_dir.mkdir()
    header = {"pid": 4242, "ppid": 1, "role": "main", "argv": [], "wall_ns": 0, "mono_ns": 0}
    (events_dir / "4242.jsonl").write_text(json.dumps({"header": header}) + "\n"
                                           + json.dumps([["process_start", 1, []]]) + "\n" + '[["next", 0, 0')
    meta = {"run_id": "r", "command": [], "cwd": ".", "started_wall": 0.0, "start_ns": 0, "end_ns": 10,
            "exit_code": 137, "ended_by": "signal"}
    notes = build_session(tmp_path, meta).notes
    assert any("1 line(s) of process 4242's events were cut short" in n for n in notes)
    assert any("ended without writing out its last events" in n for n in notes)


def test_an_ending_flush_never_waits_forever_for_a_flush_in_progress(recorder):
    """A fatal signal's handler runs in the main thread, possibly while it is inside flush() (the lock is not
    re-entrant): the handler's flush gives up after its wait instead of deadlocking the process."""
    events.emit("a", 1)
    assert events._flush_lock.acquire()  # as if this thread were inside flush()
    try:
        events.flush(wait_s=0.01)  # returns: skipped
    finally:
        events._flush_lock.release()
    events.flush()
    _, records = _records(recorder / "events" / f"{os.getpid()}.jsonl")
    assert records == [["a", 1]]  # nothing lost, nothing written twice


def test_a_run_whose_launcher_holds_its_lock_is_not_rebuilt(tmp_path):
    import fcntl
    import subprocess
    import sys

    from stallscope.collect import recover_session

    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "command": [], "cwd": ".", "started_wall": 0.0}))
    with open(tmp_path / "run.json", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        child = subprocess.run(
            [sys.executable, "-c", "import sys, pathlib\nfrom stallscope.collect import "
             "recover_session, RecoveryError\ntry:\n    recover_session(pathlib.Path(sys.argv[1]))\n"
             "except RecoveryError as e:\n    print('refused:', e)\n", str(tmp_path)],
            capture_output=True, text=True, timeout=60)
    assert "refused:" in child.stdout and "still in progress" in child.stdout, child.stdout + child.stderr
    assert recover_session(tmp_path).ended_by == "recovered"  # once released, it is rebuilt
