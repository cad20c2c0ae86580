"""Event files: buffering, flushing, and a forked child that must not replay its parent's records."""

from __future__ import annotations

import json
import os
import time

import pytest

from stallscope.record import events


@pytest.fixture
def recorder(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "_run_dir", tmp_path)
    monkeypatch.setattr(events, "_buffer", [])
    monkeypatch.setattr(events, "_file", None)
    monkeypatch.setattr(events, "_pid", -1)
    monkeypatch.setattr(events, "_last_flush_ns", time.perf_counter_ns())
    yield tmp_path
    events.flush()
    if events._file is not None:
        events._file.close()


def _records(path):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return lines[0]["header"], lines[1:]


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
    os.register_at_fork(after_in_child=events._after_fork_in_child)
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


def test_disabled_recorder_is_a_no_op(monkeypatch):
    monkeypatch.setattr(events, "_run_dir", None)
    events.emit("x")
    events.flush()
    assert not events.enabled()
