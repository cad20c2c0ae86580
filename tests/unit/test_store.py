"""The run history: metrics per row, filters, schema version, concurrent writers."""

from __future__ import annotations

import dataclasses
import multiprocessing
import shutil
import sqlite3
import subprocess

import pytest

from stallscope import environment
from stallscope.analysis import analyze
from stallscope.api import record_history
from stallscope.history import runs, store
from stallscope.history.store import HistoryError, get_run, list_runs
from tests.unit.report_fixtures import two_worker_session


def record_run(directory, session, analysis, path):
    store.record_run(directory, runs.row_from_session(session, analysis, path))


def test_record_run_stores_the_metrics(tmp_path):
    session = two_worker_session()
    analysis = analyze(session)
    record_run(tmp_path, session, analysis, tmp_path / "runs" / session.run_id / "session.json")
    row = get_run(tmp_path, session.run_id)
    assert row.command == session.command and row.cwd == session.cwd
    assert row.overrides == {"num_workers": 2}
    assert row.environment == {"cpus_affinity": 4} and len(row.env_fingerprint) == 12
    assert row.git_commit is None  # the session's cwd is not a directory here
    assert row.steady_steps == 8  # of 10: the warm-up runs to the two workers' first batches
    assert row.step_median_s == pytest.approx(0.100)
    assert row.steps_per_s == pytest.approx(10.0)
    assert row.samples_per_s == pytest.approx(40.0)
    assert row.data_wait_fraction == pytest.approx(0.4)
    assert sum(row.node_seconds.values()) == pytest.approx(0.8)
    assert row.step_durations_s == [pytest.approx(0.1)] * 8
    assert row.step_wait_fractions == [pytest.approx(0.4)] * 8
    assert row.peak_rss_bytes == 150 * 2**20  # main 100 MiB + worker 50 MiB from tick 3 on
    assert row.gpu_util_mean is None and row.peak_device_mem_bytes is None
    assert row.exit_code == 1 and row.verdict == "input-bound"


def test_missing_samples_are_null_never_zero(tmp_path):
    session = two_worker_session(samples=False)
    record_run(tmp_path, session, analyze(session), None)
    row = get_run(tmp_path, "last")
    assert row.peak_rss_bytes is None and row.gpu_util_mean is None and row.peak_device_mem_bytes is None


def test_long_runs_keep_a_bounded_step_sample():
    values = list(range(10_000))
    thinned = runs._thin(values, 2000)
    assert len(thinned) == 2000 and thinned[0] == 0 and thinned[-1] == 9995


def _record(tmp_path, run_id, command_tail, wait_ms=40, started=1_700_000_000.0):
    session = two_worker_session(run_id=run_id, wait_ms=wait_ms)
    session = dataclasses.replace(session, command=["python", command_tail], started_wall=started)
    record_run(tmp_path, session, analyze(session), None)


def test_filters_and_references(tmp_path):
    _record(tmp_path, "20240101-000000-aaaaaa", "train.py", started=1.0)
    _record(tmp_path, "20240102-000000-bbbbbb", "eval.py", wait_ms=2, started=2.0)
    _record(tmp_path, "20240103-000000-bbcccc", "train.py", started=3.0)
    assert [r.run_id[-6:] for r in list_runs(tmp_path)] == ["aaaaaa", "bbbbbb", "bbcccc"]
    assert [r.run_id[-6:] for r in list_runs(tmp_path, command="train")] == ["aaaaaa", "bbcccc"]
    assert [r.run_id[-6:] for r in list_runs(tmp_path, verdict="compute-bound")] == ["bbbbbb"]
    assert [r.run_id[-6:] for r in list_runs(tmp_path, since=2.0)] == ["bbbbbb", "bbcccc"]
    assert [r.run_id[-6:] for r in list_runs(tmp_path, limit=1)] == ["bbcccc"]
    assert get_run(tmp_path, "last").run_id.endswith("bbcccc")
    assert get_run(tmp_path, "last~2").run_id.endswith("aaaaaa")
    assert get_run(tmp_path, "20240101").run_id.endswith("aaaaaa")
    with pytest.raises(HistoryError, match="ambiguous"):
        get_run(tmp_path, "2024010")
    with pytest.raises(HistoryError, match="no run 'nope'"):
        get_run(tmp_path, "nope")
    with pytest.raises(HistoryError, match="holds 3 run"):
        get_run(tmp_path, "last~3")
    for bad in ("last~-1", "last~-2", "last~ 1", "last~+1", "last~", "last~\u00b2"):  # -1 once read as LIMIT 0, -2 as no LIMIT
        with pytest.raises(HistoryError, match="bad run reference"):
            get_run(tmp_path, bad)


def test_a_working_directory_that_is_not_utf8_is_recorded(tmp_path):
    """A folder named in another encoding reaches Python as surrogates, which SQLite cannot store as text."""
    session = two_worker_session(run_id="20240101-000000-aaaaaa")
    cwd = "/data/caf\udce9"  # 'café' in Latin-1, as os.getcwd() returns it
    record_run(tmp_path, dataclasses.replace(session, cwd=cwd), analyze(session), None)
    [row] = list_runs(tmp_path)
    assert row.cwd == "/data/caf\ufffd"


def test_recording_a_run_twice_replaces_its_row(tmp_path):
    _record(tmp_path, "20240101-000000-aaaaaa", "train.py")
    _record(tmp_path, "20240101-000000-aaaaaa", "train.py")
    assert len(list_runs(tmp_path)) == 1


def test_empty_store_and_newer_schema_are_clear_errors(tmp_path):
    with pytest.raises(HistoryError, match="no run history"):
        list_runs(tmp_path)
    _record(tmp_path, "20240101-000000-aaaaaa", "train.py")
    conn = sqlite3.connect(store.history_path(tmp_path))
    assert conn.execute("SELECT version FROM schema_version").fetchall() == [(store.SCHEMA_VERSION,)]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.execute("INSERT INTO schema_version VALUES (99)")
    conn.commit()
    conn.close()
    with pytest.raises(HistoryError, match="newer stallscope"):
        list_runs(tmp_path)


def _writer(args):
    directory, worker = args
    base = two_worker_session()
    values = runs.row_values(base, analyze(base), None, None)
    for i in range(15):
        store.insert_row(directory, {**values, "run_id": f"w{worker}-{i:02d}", "started_wall": worker * 100 + i})
    return worker


def test_concurrent_writers_lose_nothing(tmp_path):
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        assert sorted(pool.map(_writer, [(str(tmp_path), w) for w in range(4)])) == [0, 1, 2, 3]
    rows = list_runs(tmp_path)
    assert len(rows) == 60 and len({r.run_id for r in rows}) == 60
    conn = sqlite3.connect(store.history_path(tmp_path))
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_history_failure_is_reported_not_raised(tmp_path):
    blocker = tmp_path / "store"
    blocker.write_text("a file where the store directory should be")
    session = two_worker_session()
    error = record_history(str(blocker), session, analyze(session), None)
    assert error and str(blocker) in error
    assert record_history(str(tmp_path / "ok"), session, analyze(session), None) is None


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commit_of_the_working_directory(tmp_path):
    def git_commit(cwd):  # a long timeout: not what this checks, and a loaded machine starts git slowly
        return environment.git_commit(cwd, timeout_s=60.0)

    assert git_commit(str(tmp_path)) is None
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    (repo / "f.txt").write_text("1")
    for cmd in (["init", "-q"], ["add", "f.txt"], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=env, capture_output=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_commit(str(repo)) == head
    (repo / "f.txt").write_text("2")
    assert git_commit(str(repo)) == head + "+dirty"


def test_a_store_that_is_a_file_is_said_so(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(HistoryError, match="is a file, not a folder"):
        list_runs(tmp_path / "afile")


def test_old_histories_set_aside_in_the_same_second_never_overwrite_each_other(tmp_path, monkeypatch):
    from stallscope.history import store as store_mod

    monkeypatch.setattr(store_mod.time, "strftime", lambda fmt, *a: "20260101-000000")  # one second for all
    history = tmp_path / "history.sqlite3"
    names = []
    for content in ("first", "second", "third"):
        history.write_text(content)
        names.append(store_mod._set_aside(history))
    assert [p.name for p in names] == ["history.sqlite3.before-rebuild-20260101-000000",
                                       "history.sqlite3.before-rebuild-20260101-000000-2",
                                       "history.sqlite3.before-rebuild-20260101-000000-3"]
    assert [p.read_text() for p in names] == ["first", "second", "third"] and not history.exists()


def test_an_emptied_history_beside_saved_runs_says_to_rebuild(tmp_path):
    """A 0-byte history.sqlite3 (a disk that filled, a file truncated by hand) next to saved runs: the runs are not
    lost, and the message says how to get their rows back."""
    store.history_path(tmp_path).write_bytes(b"")
    with pytest.raises(HistoryError, match="no run history .* yet"):
        list_runs(tmp_path)
    saved = tmp_path / "runs" / "20240101-000000-aaaaaa"
    saved.mkdir(parents=True)
    (saved / "session.json").write_text("{}")
    with pytest.raises(HistoryError, match=r"holds no runs, but .*runs does: .*stallscope history --rebuild"):
        list_runs(tmp_path)
