"""The Perfetto trace: valid trace-event JSON, one track per worker, batches inside the run."""

from __future__ import annotations

import json
from collections import defaultdict

from stallscope.analysis import analyze
from stallscope.render import trace
from tests.unit.report_fixtures import T0, two_worker_session

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
