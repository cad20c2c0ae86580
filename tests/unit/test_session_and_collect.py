"""Session save/load round trip, schema checks, and building a session from real event files."""

from __future__ import annotations

import json
import os

import pytest

from stallscope.collect import build_session
from stallscope.constants import SESSION_SCHEMA
from stallscope.session import FetchRecord, NextRecord, Session, SessionFormatError


def _meta(**extra):
    meta = {"run_id": "r1", "command": ["python", "t.py"], "cwd": "/", "started_wall": 1.0, "start_ns": 0,
            "end_ns": 5_000_000_000, "exit_code": 0, "ended_by": "exit"}
    meta.update(extra)
    return meta


def _write(events_dir, pid, role, records, truncated_tail=False):
    events_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"header": {"pid": pid, "ppid": 1, "role": role, "argv": [], "wall_ns": 0, "mono_ns": 0}})]
    lines += [json.dumps(r) for r in records]
    text = "\n".join(lines) + "\n"
    if truncated_tail:
        text += '["next", 0, 0'  # a process killed mid-write
    (events_dir / f"{pid}.jsonl").write_text(text)


def test_build_from_events_and_round_trip(tmp_path):
    events = tmp_path / "events"
    _write(events, 10, "main", [
        ["loader", 0, 5, "t.py:3", {"num_workers": 1}, {}],
        ["next", 0, 0, 0, 100, 200, 0, 4],
        ["opt", 1, "SGD", 250, 260],
        ["exception", 300, "ValueError", "bad", "t.py:9", "Traceback..."],
        ["some_future_kind", 1, 2],
    ], truncated_tail=True)
    _write(events, 11, "child", [
        ["role", "worker"],
        ["fetch", 0, 0, 0, 0, 50, 90, 30, -1, 4, {"decode": [20, 20, 4]}, {"PIL.Image.open": [20, 20, 4]}, None],
        ["fetch_error", 0, 0, 0, 11, 95, "OSError", "truncated", 'File "/d.py", line 7, in get\n'],
    ])
    session = build_session(tmp_path, _meta())
    assert session.main_pid == 10
    assert session.nexts == [NextRecord(0, 0, 0, 100, 200, 0, 4, 10)]
    assert session.fetches[0] == FetchRecord(0, 0, 0, 0, 50, 90, 30, -1, 4, {"decode": [20, 20, 4]},
                                             {"PIL.Image.open": [20, 20, 4]}, None, 11)
    assert {p.pid: p.role for p in session.processes} == {10: "main", 11: "worker"}
    assert [(e.where, e.type, e.location) for e in session.errors] == [
        ("main", "ValueError", "t.py:9"), ("worker", "OSError", "/d.py:7")]
    path = session.save(tmp_path / "s" / "session.json")
    assert Session.load(path) == session


def test_load_rejects_other_schemas_and_garbage(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"schema": "stallscope.session/99"}))
    with pytest.raises(ValueError, match="unsupported session schema"):
        Session.load(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a stallscope session"):
        Session.load(bad)


def _valid() -> dict:
    return Session(schema=SESSION_SCHEMA, run_id="r", command=["python", "t.py"], cwd="/", started_wall=0.0,
                   start_ns=0, end_ns=1, exit_code=0, ended_by="exit", overrides={}, max_steps=None,
                   environment={}, nexts=[NextRecord(0, 0, 0, 1, 2, -1, 4, 10)]).to_dict()


MALFORMED = {
    "a list": (b"[1, 2]", "a JSON list, not an object"),
    "missing field": (json.dumps({k: v for k, v in _valid().items() if k != "start_ns"}).encode(),
                      "has no field 'start_ns'"),
    "mistyped field": (json.dumps({**_valid(), "end_ns": "soon"}).encode(), "session.end_ns is str"),
    "records not a list": (json.dumps({**_valid(), "nexts": {"a": 1}}).encode(), "session.nexts is a dict"),
    "mistyped record": (json.dumps({**_valid(), "nexts": [{**_valid()["nexts"][0], "start_ns": None}]}).encode(),
                        "session.nexts[0].start_ns is NoneType"),
    "record not an object": (json.dumps({**_valid(), "nexts": [7]}).encode(), "session.nexts[0] is a int"),
    "deep nesting": (b"[" * 200_000 + b"]" * 200_000, "nested too deep"),
    "binary garbage": (bytes(range(256)) * 4, "not UTF-8"),
    "empty": (b"", "invalid JSON"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_session_files_are_one_clear_error_naming_the_file(tmp_path, case):
    content, reason = MALFORMED[case]
    path = tmp_path / "session.json"
    path.write_bytes(content)
    with pytest.raises(SessionFormatError) as caught:
        Session.load(path)
    assert str(path) in str(caught.value) and reason in str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)
    # not a JSON document at all (a damaged file) versus a document of another shape
    assert caught.value.unparsable is (case in ("deep nesting", "binary garbage", "empty"))


def test_the_valid_document_loads():
    assert Session.from_dict(_valid()).nexts[0].end_ns == 2


def test_save_is_atomic(tmp_path):
    session = Session(schema=SESSION_SCHEMA, run_id="r", command=[], cwd="/", started_wall=0.0, start_ns=0,
                      end_ns=1, exit_code=0, ended_by="exit", overrides={}, max_steps=None, environment={})
    target = tmp_path / "session.json"
    session.save(target)
    assert not (tmp_path / "session.json.tmp").exists()
    assert sorted(os.listdir(tmp_path)) == ["session.json"]


def test_saved_in_parts_it_is_the_json_of_its_dict_byte_for_byte(tmp_path):
    session = Session(schema=SESSION_SCHEMA, run_id="r\u00e9", command=["python", "t.py"], cwd="/", started_wall=0.5,
                      start_ns=0, end_ns=1, exit_code=0, ended_by="exit", overrides={"num_workers": 2}, max_steps=None,
                      environment={"torch": "2.14"},
                      nexts=[NextRecord(0, 0, 0, i * 10, i * 10 + 5, i % 2, 8, 42) for i in range(7)])
    whole = json.dumps(session.to_dict(), separators=(",", ":")).encode()
    for per_part in (1, 3, 7, 100):  # parts cut inside, at and past the end of a record list
        assert b"".join(session.json_parts(records_per_part=per_part)) == whole
    session.save(tmp_path / "session.json")
    assert (tmp_path / "session.json").read_bytes() == whole
    assert Session.load(tmp_path / "session.json").nexts == session.nexts


def _stack_event(t_ns, frames, count, *sampler):
    """A ``stack_samples`` event of loader 0's ``transform`` stage; ``sampler``: (name, fallback reason), or
    nothing for an event written before the sampler was recorded."""
    return ["stack_samples", t_ns, [[0, "transform", frames, count]], *sampler]


def test_stack_samples_keep_their_sampler_and_the_thread_sampler_is_noted_once(tmp_path):
    events = tmp_path / "events"
    line = ["/u/train.py:9:augment"]
    _write(events, 10, "main", [["loader", 0, 5, "t.py:3", {"num_workers": 2}, {}]])
    _write(events, 11, "child", [["role", "worker"], _stack_event(1, line, 3, "signal", None),
                                 _stack_event(2, line, 2, "thread", "the script handles SIGALRM"),
                                 _stack_event(3, line, 4, "thread", "the script handles SIGALRM")])
    _write(events, 12, "child", [["role", "worker"],
                                 _stack_event(1, line, 5, "thread", "batches are fetched outside the main thread")])
    session = build_session(tmp_path, _meta())
    assert sorted((r["pid"], r["count"], r["sampler"]) for r in session.stack_samples) == [
        (11, 3, "signal"), (11, 6, "thread"), (12, 5, "thread")]
    noted = [n for n in session.notes if "thread sampler" in n]
    assert noted == [(
        "stack samples of processes 11, 12 were taken by the thread sampler (batches are fetched outside the main "
        "thread; the script handles SIGALRM): it is biased toward points where the fetching thread releases the "
        "GIL (a library call, a read), so a pure-Python line's share of its stage can be understated and the call "
        "after it overstated")]
    assert Session.load(session.save(tmp_path / "s" / "session.json")) == session


def test_stack_samples_recorded_before_the_sampler_was_noted_still_load(tmp_path):
    events = tmp_path / "events"
    _write(events, 10, "main", [["loader", 0, 5, "t.py:3", {"num_workers": 0}, {}],
                                _stack_event(1, ["/u/train.py:9:augment"], 7)])
    session = build_session(tmp_path, _meta())
    assert session.stack_samples == [{"pid": 10, "loader_id": 0, "stage": "transform",
                                      "frames": ["/u/train.py:9:augment"], "count": 7}]
    assert not any("sampler" in n for n in session.notes)
