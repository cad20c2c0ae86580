"""What a tracker receives, from summaries alone (no tracker installed needed): exact metric names and values,
tags, local store URIs made absolute, and tracker runs carried from the recorder's events into the Session."""

from __future__ import annotations

import json
from pathlib import Path

from stallscope.collect import build_session
from stallscope.session import Session
from stallscope.trackers import TRACKERS, needs, script_run
from stallscope.trackers.metrics import flat_metrics, tags
from stallscope.trackers.to_mlflow import absolute_uri

SUMMARIES = Path(__file__).parent.parent / "data" / "summaries"


def test_a_stored_summary_flattens_to_every_headline_number() -> None:
    summary = json.loads((SUMMARIES / "image-pipeline" / "summary.json").read_text())
    assert flat_metrics(summary) == {
        "stallscope/data_wait_fraction": 0.8794,
        "stallscope/steps_per_s": 24.8084,
        "stallscope/samples_per_s": 396.935,
        "stallscope/bottleneck_share": 0.4654,
        "stallscope/share/compute": 0.1206,
        "stallscope/share/decode": 0.4654,
        "stallscope/share/loader": 0.0143,
        "stallscope/share/storage": 0.0001,
        "stallscope/share/sync": 0.0,
        "stallscope/share/transfer": 0.0,
        "stallscope/share/transform": 0.3996,
        "stallscope/speedup/num-workers": 1.84,
        "stallscope/speedup/reduced-size-decode": 1.31,
        "stallscope/speedup/cheaper-transforms": 1.25,
        "stallscope/speedup/uint8-device-normalize": 1.12,
    }
    assert tags(summary) == {"stallscope/verdict": "input-bound", "stallscope/bottleneck": "decode",
                             "stallscope/run_id": summary["run_id"], "stallscope/version": "0.1.0"}


def test_what_was_not_measured_is_left_out_not_logged_as_zero() -> None:
    summary = {"run_id": "r1", "verdict": "unknown", "data_wait_fraction": 0.0,
               "throughput": {"steps_per_s": 2, "samples_per_s": None},
               "bottleneck": {"node": None, "share": 0.0, "evidence": []},
               "nodes": {"compute": {"seconds": 1.0, "share": 1}, "decode": {"seconds": 0.0, "share": float("nan")}},
               "recommendations": [{"id": "num-workers", "predicted_speedup": None},
                                   {"id": "pack-dataset", "predicted_speedup": 2.5}, {"predicted_speedup": 3.0},
                                   {"id": "flag", "predicted_speedup": True}]}
    assert flat_metrics(summary) == {"stallscope/data_wait_fraction": 0.0, "stallscope/steps_per_s": 2.0,
                                     "stallscope/bottleneck_share": 0.0, "stallscope/share/compute": 1.0,
                                     "stallscope/speedup/pack-dataset": 2.5}
    assert tags(summary) == {"stallscope/verdict": "unknown", "stallscope/run_id": "r1",
                             "stallscope/version": "0.1.0"}
    assert flat_metrics({}) == {}


def test_every_stored_summary_flattens_to_finite_floats() -> None:
    for path in SUMMARIES.glob("*/summary.json"):
        summary = json.loads(path.read_text())
        flat = flat_metrics(summary)
        assert all(type(v) is float for v in flat.values()), path
        assert {f"stallscope/share/{node}" for node in summary["nodes"]} <= set(flat), path


def test_local_store_uris_are_made_absolute_against_the_scripts_folder() -> None:
    assert absolute_uri("sqlite:///mlflow.db", "/work/job") == "sqlite:////work/job/mlflow.db"
    assert absolute_uri("sqlite:////abs/m.db", "/work/job") == "sqlite:////abs/m.db"
    assert absolute_uri("sqlite:///:memory:", "/work/job") == "sqlite:///:memory:"
    assert absolute_uri("file:./mlruns", "/work/job") == "file:///work/job/mlruns"
    assert absolute_uri("file:///abs/mlruns", "/work/job") == "file:///abs/mlruns"
    assert absolute_uri("mlruns", "/work/job") == "/work/job/mlruns"
    assert absolute_uri("/abs/mlruns", "/work/job") == "/abs/mlruns"
    assert absolute_uri("http://127.0.0.1:5000", "/work/job") == "http://127.0.0.1:5000"
    assert absolute_uri("databricks", "/work/job") == "databricks"


def test_a_missing_library_names_its_extra() -> None:
    assert set(TRACKERS) == {"mlflow", "wandb", "tensorboard"}
    assert needs("mlflow") == "--to mlflow needs mlflow; install it with: pip install 'stallscope[mlflow]'"
    assert needs("wandb", "--log-to") == "--log-to wandb needs wandb; install it with: pip install 'stallscope[wandb]'"


def _write_events(run_dir: Path, records: list[list]) -> None:
    events = run_dir / "events"
    events.mkdir(parents=True)
    header = {"header": {"pid": 41, "ppid": 1, "role": "main", "argv": ["train.py"], "wall_ns": 0, "mono_ns": 0}}
    lines = [json.dumps(header)] + [json.dumps(r) for r in records]
    (events / "41.jsonl").write_text("\n".join(lines) + "\n")


def test_tracker_run_events_become_session_tracker_runs_in_time_order(tmp_path: Path) -> None:
    mlflow_run = {"run_id": "abc", "experiment_id": "0", "uri": "sqlite:///mlflow.db", "cwd": "/job"}
    _write_events(tmp_path, [["process_start", 1, ["train.py"]],
                             ["tracker_run", "wandb", 30, {"run_id": "w1", "project": "p", "mode": "offline"}],
                             ["tracker_run", "mlflow", 20, mlflow_run],
                             ["tracker_run", "mlflow", 40, {**mlflow_run, "run_id": "nested"}],
                             ["process_exit", 50, None]])
    meta = {"run_id": "r1", "command": ["python", "train.py"], "cwd": "/job", "started_wall": 0.0, "start_ns": 0,
            "end_ns": 60, "exit_code": 0, "ended_by": "exit"}
    session = build_session(tmp_path, meta)
    assert [(r["tracker"], r["run_id"], r["t_ns"], r["pid"]) for r in session.tracker_runs] == [
        ("mlflow", "abc", 20, 41), ("wandb", "w1", 30, 41), ("mlflow", "nested", 40, 41)]
    assert script_run(session, "mlflow")["run_id"] == "abc"  # the outermost run, not the nested one
    assert script_run(session, "tensorboard") is None
    assert Session.from_dict(session.to_dict()).tracker_runs == session.tracker_runs


def test_sessions_saved_before_tracker_runs_load_without_them() -> None:
    for path in SUMMARIES.glob("*/session.json"):
        assert "tracker_runs" not in json.loads(path.read_text())
        assert Session.load(path).tracker_runs == []


def test_a_file_in_the_way_of_a_trackers_folder_is_said_in_words(tmp_path):
    from stallscope.trackers import failure_line

    (tmp_path / "afile").write_text("")
    for exc_type, target in ((FileExistsError, tmp_path / "afile"), (NotADirectoryError, tmp_path / "afile" / "x")):
        try:
            target.mkdir(parents=True) if exc_type is FileExistsError else (target / "y").mkdir(parents=True)
        except exc_type as exc:
            assert failure_line(exc).endswith("is a file, where a folder is needed"), failure_line(exc)
        else:
            raise AssertionError(f"no {exc_type.__name__}")
    assert failure_line(ValueError("bad\nsecond")) == "ValueError: bad"
    uri = "http://tracking.example:5000/" + "x" * 40
    message = f"Could not reach {uri} because " + "the server said no, " * 30
    long = failure_line(ValueError(message))
    kept = long.removeprefix("ValueError: ").removesuffix(" …")
    assert long.endswith(" …") and message.startswith(kept) and message[len(kept)] in " ,"  # cut between words
    assert uri in kept and len(long) < 330


def test_an_export_keeps_the_tracebacks_of_the_threads_it_starts_and_no_others():
    """A tracker's own thread failing (a full disk) is the export's error; a thread that was running before (an
    earlier tracker's, the script's) still goes to the hook that was in place."""
    import threading

    from stallscope.trackers import _library_threads_contained

    release = threading.Event()

    def earlier_thread() -> None:
        release.wait(10)
        raise ValueError("an earlier thread's")

    def export_thread() -> None:
        raise OSError(28, "No space left on device")

    before = threading.Thread(target=earlier_thread)
    before.start()
    passed_on: list[BaseException] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: passed_on.append(args.exc_value)  # stands in for Python's printing hook
    try:
        with _library_threads_contained() as failed:
            release.set()
            before.join()
            started = threading.Thread(target=export_thread)
            started.start()
            started.join()
        assert threading.excepthook is not hook  # restored to the stand-in, not left as the collector
    finally:
        threading.excepthook = hook
    assert [str(e) for e in passed_on] == ["an earlier thread's"]
    assert [getattr(e, "errno", None) for e in failed] == [28]


def test_an_mlflow_server_that_refuses_connections_fails_at_once_in_words():
    """MLflow's own client retries a refused connection for minutes; the export checks the server answers first."""
    import socket

    import pytest

    from stallscope.trackers.to_mlflow import UnreachableServer, check_reachable

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        port = listening.getsockname()[1]
        check_reachable(f"http://127.0.0.1:{port}")  # a server that accepts: no error
    with pytest.raises(UnreachableServer, match=rf"http://127.0.0.1:{port} does not accept connections \(connection "
                                                r"refused\); is it running"):
        check_reachable(f"http://127.0.0.1:{port}")  # the same port, closed now
    check_reachable("sqlite:///nowhere/mlflow.db")  # not a server: MLflow's to judge
    check_reachable("file:///tmp/mlruns")
