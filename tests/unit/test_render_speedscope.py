"""The speedscope export and the sampled-stack reader behind it: the file format's rules, exact profiles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stallscope.analysis import analyze
from stallscope.analysis.sampled_stacks import (
    Frame,
    call_tree,
    job_stacks,
    parse_frames,
)
from stallscope.render import speedscope
from tests.unit.report_fixtures import (
    HOSTILE_FUNCTION,
    SITE,
    USER_FILE,
    two_worker_session,
)

UNITS = {"none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes"}


def check_speedscope(doc: dict) -> None:
    """The rules of speedscope's file format (file-format-schema.json) that its importer relies on."""
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = doc["shared"]["frames"]
    assert frames
    for frame in frames:
        assert isinstance(frame["name"], str) and frame["name"]
        assert isinstance(frame.get("file", ""), str) and isinstance(frame.get("line", 0), int)
    assert doc["profiles"] and 0 <= doc["activeProfileIndex"] < len(doc["profiles"])
    for profile in doc["profiles"]:
        assert profile["type"] == "sampled" and profile["unit"] in UNITS and isinstance(profile["name"], str)
        assert len(profile["samples"]) == len(profile["weights"])
        assert all(0 <= i < len(frames) for stack in profile["samples"] for i in stack)
        assert all(isinstance(w, int) and w > 0 for w in profile["weights"])
        assert profile["startValue"] == 0 and profile["endValue"] == sum(profile["weights"])
    assert json.loads(json.dumps(doc)) == doc


def test_one_profile_per_stage_the_limiting_one_first_with_shared_frames():
    session = two_worker_session(stacks=True)
    doc = speedscope.render(session, analyze(session))
    check_speedscope(doc)
    assert [(f["name"], f["file"], f["line"]) for f in doc["shared"]["frames"]] == [
        ("_MapDatasetFetcher.fetch", f"{SITE}/torch/utils/data/_utils/fetch.py", 54),
        ("Images.__getitem__", USER_FILE, 31),
        ("open", f"{SITE}/PIL/Image.py", 3300),
        ("Images.__getitem__", USER_FILE, 33),
        (HOSTILE_FUNCTION, USER_FILE, 12),
        ("Images.__getitem__.<locals>.<lambda>", USER_FILE, 40),
        ("Images.__getitem__", USER_FILE, 30),
        ("read_bytes", USER_FILE, 20),
    ]
    decode, storage = doc["profiles"]
    assert decode["name"] == "decode (limiting stage): 100 samples, 16.5% of step time"
    assert (decode["samples"], decode["weights"]) == ([[0, 1, 2], [0, 3, 4], [0, 3, 5]], [50, 25, 25])
    assert storage["name"] == "storage: 8 samples, 12.5% of step time"
    assert (storage["samples"], storage["weights"]) == ([[6, 7]], [8])
    assert doc["activeProfileIndex"] == 0 and doc["exporter"].startswith("stallscope ")


def test_no_stack_samples_no_document():
    session = two_worker_session()
    assert speedscope.render(session, analyze(session)) is None


def test_write_speedscope(tmp_path):
    session = two_worker_session(stacks=True)
    doc = speedscope.render(session, analyze(session))
    path = speedscope.write_speedscope(tmp_path / "s.speedscope.json", doc)
    assert json.loads(path.read_text(encoding="utf-8")) == doc


def test_frames_are_read_outermost_first():
    assert parse_frames(["/lib/json/decoder.py:353:JSONDecoder.raw_decode", "/u/train.py:40:Text.__getitem__",
                         "/u/bare.py:7"]) == (Frame("/u/bare.py", 7, ""), Frame("/u/train.py", 40, "Text.__getitem__"),
                                              Frame("/lib/json/decoder.py", 353, "JSONDecoder.raw_decode"))
    assert Frame("/u/train.py", 40, "Text.__getitem__").label == "Text.__getitem__ (train.py:40)"


def test_job_stacks_are_the_training_loaders_samples_from_the_job():
    session = two_worker_session(stacks=True)
    outside = {"pid": 999, "loader_id": 0, "stage": "decode", "frames": ["/u/x.py:1:f"], "count": 5}
    other_loader = {"pid": 200, "loader_id": 3, "stage": "decode", "frames": ["/u/x.py:1:f"], "count": 5}
    session.stack_samples.extend([outside, other_loader])
    stacks = job_stacks(session, [0])
    assert [(s.pid, s.stage, s.count, s.sampler) for s in stacks] == [
        (200, "decode", 30, "signal"), (201, "decode", 20, "signal"), (200, "decode", 25, "signal"),
        (201, "decode", 25, "signal"), (200, "storage", 8, "signal")]
    assert len(job_stacks(session)) == 6  # every loader of the job, still none from outside it


def test_call_tree_merges_from_the_outermost_frame_and_orders_largest_first():
    session = two_worker_session(stacks=True, sampler=None)
    root = call_tree(job_stacks(session), by_stage=True)
    assert root.count == 108 and [(n.key, n.count) for n in root.ordered()] == [("decode", 100), ("storage", 8)]
    (fetch,) = root.children["decode"].ordered()
    assert [(n.key.line, n.count) for n in fetch.ordered()] == [(31, 50), (33, 50)]
    assert root.depth() == 4
    assert {s.sampler for s in job_stacks(session)} == {None}  # sessions recorded before the sampler was noted


def test_report_speedscope_without_samples_is_one_line_and_exit_2(tmp_path):
    session = next((Path(__file__).parent.parent / "data" / "summaries").glob("*/session.json"))
    out = tmp_path / "s.speedscope.json"
    done = subprocess.run([sys.executable, "-m", "stallscope", "report", str(session), "--speedscope", str(out),
                           "--trace", str(tmp_path / "t.json")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [(
        "stallscope report: --speedscope: this run has no stack samples of the training loader's fetches (where "
        f"sampling could not run, `stallscope report {session}` says why in its notes)")]
    assert not out.exists() and not (tmp_path / "t.json").exists()
