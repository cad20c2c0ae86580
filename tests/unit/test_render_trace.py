"""The Perfetto trace: valid trace-event JSON, one track per worker, batches inside the run."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict

from stallscope.analysis import analyze
from stallscope.render import trace
from tests.unit.report_fixtures import HOSTILE_FUNCTION, PID, T0, two_worker_session

REQUIRED = {"X": {"name", "ph", "pid", "tid", "ts", "dur"}, "C": {"name", "ph", "pid", "ts", "args"},
            "M": {"name", "ph", "pid", "tid", "args"}, "i": {"name", "ph", "pid", "tid", "ts", "s"}}


def render(**kwargs):
    session = two_worker_session(**kwargs)
    return session, trace.render(session, analyze(session))


def check_trace_format(doc: dict) -> None:
    """The rules of the trace-event format that ui.perfetto.dev relies on."""
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    for event in doc["traceEvents"]:
        ph = event["ph"]
        assert ph in REQUIRED, event
        assert REQUIRED[ph] <= event.keys(), event
        assert isinstance(event["pid"], int) and isinstance(event.get("tid", 0), int)
        if "ts" in event:
            assert isinstance(event["ts"], (int, float)) and event["ts"] >= 0
        if ph == "X":
            assert event["dur"] >= 0
        if ph == "C":
            assert event["args"] and all(isinstance(v, (int, float)) for v in event["args"].values())
        if ph == "M":
            assert event["name"] in {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}
    check_nesting(doc)


def check_nesting(doc: dict) -> None:
    """Slices on one track either nest or follow each other: a partial overlap is a broken trace."""
    tracks = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + 1e-3:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, (start, end, stack)
            stack.append(end)


def test_trace_is_valid_and_json_serializable():
    _, doc = render()
    check_trace_format(doc)
    assert json.loads(json.dumps(doc)) == doc
    assert doc["displayTimeUnit"] == "ms"


def test_one_track_per_worker_with_batches_and_stages_inside_the_run():
    session, doc = render()
    events = doc["traceEvents"]
    loader_pid = trace.LOADER_PID_BASE
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == loader_pid}
    assert names == {1: "worker 0", 2: "worker 1"}
    batches = [e for e in events if e["ph"] == "X" and e.get("cat") == "batch"]
    assert len(batches) == 10 and {b["tid"] for b in batches} == {1, 2}
    span_us = (session.end_ns - session.start_ns) / 1000
    assert all(0 <= b["ts"] and b["ts"] + b["dur"] <= span_us for b in batches)
    first = min(batches, key=lambda b: b["ts"])
    assert first["ts"] == (session.fetches[0].start_ns - T0) / 1000
    stages = [e for e in events if e["ph"] == "X" and e.get("cat", "").startswith("stage")
              and e["tid"] == first["tid"] and first["ts"] <= e["ts"] < first["ts"] + first["dur"]]
    assert [s["name"] for s in stages] == ["storage", "decode", "transform"]
    assert sum(s["dur"] for s in stages) == first["dur"]


def test_main_process_steps_waits_and_counters():
    _, doc = render()
    events = doc["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step"]
    assert len(steps) == 10 and steps[1]["args"]["wait_ms"] == 40.0
    waits = [e for e in events if e.get("cat") == "wait"]
    assert len(waits) == 10 and all(w["dur"] == 40_000 for w in waits)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"loader 0 queue", "cpu_percent", "process tree RSS (MiB)"} <= counters
    rss = [e["args"]["value"] for e in events if e["ph"] == "C" and e["name"] == "process tree RSS (MiB)"]
    assert max(rss) == 150
    errors = [e for e in events if e["ph"] == "i"]
    assert errors and errors[0]["name"] == "RuntimeError"


def test_without_samples_there_is_no_system_process():
    _, doc = render(samples=False)
    check_trace_format(doc)
    assert not any(e["pid"] == trace.SYSTEM_PID for e in doc["traceEvents"])


def test_write_trace(tmp_path):
    _, doc = render()
    path = trace.write_trace(tmp_path / "t.json", doc)
    assert json.loads(path.read_text())["traceEvents"]


def test_sampled_stacks_are_a_flame_graph_per_fetching_process_over_its_fetch_span():
    session, doc = render(stacks=True)
    check_trace_format(doc)
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == trace.LOADER_PID_BASE}
    assert names[1000] == "worker 0 (pid 200): sampled stacks by share of samples, not in time"
    assert names[1001] == "worker 1 (pid 201): sampled stacks by share of samples, not in time"
    worker0 = [f for f in session.fetches if f.pid == 200]
    start, end = min(f.start_ns for f in worker0), max(f.end_ns for f in worker0)
    span = end - start

    def us(ns: int) -> float:
        return round(ns / 1000, 3)

    slices = [(e["name"], e["args"]["samples"], e["ts"], e["dur"]) for e in events
              if e["ph"] == "X" and e["tid"] == 1000 and e["pid"] == trace.LOADER_PID_BASE]
    decode, storage = span * 55 // 63, span * 8 // 63
    open_, hostile = decode * 30 // 55, decode * 25 // 55
    origin = (start - T0)
    assert slices == [
        ("decode (stage)", 55, us(origin), us(decode)),
        ("_MapDatasetFetcher.fetch (fetch.py:54)", 55, us(origin), us(decode)),
        ("Images.__getitem__ (train.py:31)", 30, us(origin), us(open_)),
        ("open (Image.py:3300)", 30, us(origin), us(open_)),
        ("Images.__getitem__ (train.py:33)", 25, us(origin + open_), us(hostile)),
        (f"{HOSTILE_FUNCTION} (train.py:12)", 25, us(origin + open_), us(hostile)),
        ("storage (stage)", 8, us(origin + decode), us(storage)),
        ("Images.__getitem__ (train.py:30)", 8, us(origin + decode), us(storage)),
        ("read_bytes (train.py:20)", 8, us(origin + decode), us(storage)),
    ]
    frame = next(e for e in events if e.get("cat") == "stack_sample" and e["name"].startswith("open "))
    assert frame["args"] == {"samples": 30, "share_of_process": round(30 / 63, 4),
                             "file": "/venv/lib/python3.11/site-packages/PIL/Image.py", "line": 3300,
                             "function": "open"}


def test_without_stack_samples_there_is_no_stack_track():
    _, doc = render()
    assert not any(e.get("cat") == "stack_sample" or e["tid"] >= trace.STACKS_TID_BASE for e in doc["traceEvents"])


def test_stacks_of_in_process_loading_are_a_track_of_the_training_process():
    """num_workers=0: the training process fetches, and its samples go beside its in-process loading."""
    session = two_worker_session(stacks=True)
    session = dataclasses.replace(
        session, fetches=[dataclasses.replace(f, worker=-1, pid=PID) for f in session.fetches],
        stack_samples=[{**row, "pid": PID} for row in session.stack_samples])
    doc = trace.render(session, analyze(session))
    check_trace_format(doc)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name" and e["tid"] >= trace.STACKS_TID_BASE}
    assert names == {(trace.MAIN_PID, trace.STACKS_TID_BASE):
                     f"loader 0 in-process (pid {PID}): sampled stacks by share of samples, not in time"}
    stages = [(e["name"], e["args"]["samples"]) for e in doc["traceEvents"]
              if e.get("cat") == "stack_sample" and e["name"].endswith("(stage)")]
    assert stages == [("decode (stage)", 100), ("storage (stage)", 8)]
