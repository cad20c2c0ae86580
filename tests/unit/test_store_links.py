"""The store writes only its own files (issue 43, case 1): a planted symbolic link that leads out of the store is
refused by name, and a database of another program is never taken for the history, whatever its name."""

from __future__ import annotations

import sqlite3

import pytest

from stallscope import launcher, paths
from stallscope.analysis import analyze
from stallscope.history import runs, store
from stallscope.history.store import HistoryError
from tests.unit.report_fixtures import two_worker_session


def _tables(path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}


def _other_app_database(path):
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT)")
        conn.execute("INSERT INTO accounts (owner) VALUES ('alice')")
    return path


def _row():
    session = two_worker_session()
    return runs.row_from_session(session, analyze(session), None)


def test_a_history_linked_to_another_programs_database_is_refused_and_left_as_it_was(tmp_path):
    other = _other_app_database(tmp_path / "app.sqlite")
    before = other.read_bytes()
    home = tmp_path / "store"
    home.mkdir()
    (home / "history.sqlite3").symlink_to(other)
    with pytest.raises(HistoryError) as caught:
        store.record_run(home, _row())
    assert str(home / "history.sqlite3") in str(caught.value) and str(other) in str(caught.value)
    assert "outside the store" in str(caught.value) and "\n" not in str(caught.value)
    assert _tables(other) == {"accounts"} and other.read_bytes() == before
    with pytest.raises(HistoryError, match="outside the store"):  # nor read through it
        store.list_runs(home)


@pytest.mark.parametrize("target", ["empty", "missing"])
def test_a_history_linked_to_an_empty_or_missing_file_outside_is_refused(tmp_path, target):
    outside = tmp_path / "elsewhere" / "x.db"
    outside.parent.mkdir()
    if target == "empty":
        outside.write_bytes(b"")
    home = tmp_path / "store"
    home.mkdir()
    (home / "history.sqlite3").symlink_to(outside)
    with pytest.raises(HistoryError, match="outside the store"):
        store.record_run(home, _row())
    assert (outside.read_bytes() == b"") if target == "empty" else not outside.exists()
    assert not list(outside.parent.glob("x.db-*"))  # no -wal or -shm beside it either


def test_a_database_of_another_program_in_the_stores_place_is_not_taken_for_the_history(tmp_path):
    home = tmp_path / "store"
    home.mkdir()
    _other_app_database(home / "history.sqlite3")
    with pytest.raises(HistoryError, match="not a stallscope history") as caught:
        store.record_run(home, _row())
    assert "accounts" in str(caught.value)
    assert _tables(home / "history.sqlite3") == {"accounts"}


def test_a_link_inside_the_store_and_a_store_that_is_itself_a_link_are_the_stores_own(tmp_path):
    real = tmp_path / "big-disk" / "stallscope"
    real.mkdir(parents=True)
    linked_store = tmp_path / "project-store"
    linked_store.symlink_to(real)  # a user's store moved to a bigger disk
    store.record_run(linked_store, _row())
    assert "runs" in _tables(real / "history.sqlite3")
    (real / "old").mkdir()
    (real / "old" / "h.sqlite3").write_bytes((real / "history.sqlite3").read_bytes())
    (real / "history.sqlite3").unlink()
    (real / "history.sqlite3").symlink_to(real / "old" / "h.sqlite3")  # within the store: fine
    assert len(store.list_runs(real)) == 1


def test_an_empty_history_file_in_the_store_is_made_a_history(tmp_path):
    (tmp_path / "history.sqlite3").write_bytes(b"")  # SQLite made it, then the disk filled up
    store.record_run(tmp_path, _row())
    assert len(store.list_runs(tmp_path)) == 1


@pytest.mark.parametrize("linked", ["runs", "tune", "bench"])
def test_store_folders_linked_outside_are_refused_by_name(tmp_path, linked):
    outside = tmp_path / "outside"
    outside.mkdir()
    home = tmp_path / "store"
    home.mkdir()
    (home / linked).symlink_to(outside)
    with pytest.raises(paths.OutsideStoreError) as caught:
        paths.store_folder(home, linked, "x")
    assert str(home / linked) in str(caught.value) and "outside the store" in str(caught.value)
    assert list(outside.iterdir()) == []


def test_a_run_is_refused_before_it_starts_when_the_store_links_out(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    home = tmp_path / "store"
    home.mkdir()
    (home / "runs").symlink_to(outside)
    with pytest.raises(launcher.LaunchError, match="outside the store"):
        launcher.new_run(home, ["python", "train.py"], {}, None)
    assert list(outside.iterdir()) == []
    (home / "runs").unlink()
    (home / "history.sqlite3").symlink_to(_other_app_database(outside / "app.sqlite"))
    with pytest.raises(launcher.LaunchError, match="history.sqlite3"):
        launcher.new_run(home, ["python", "train.py"], {}, None)
    assert not (home / "runs").exists() or list((home / "runs").iterdir()) == []


def test_a_session_is_never_saved_through_a_link_out_of_its_run_folder(tmp_path):
    run_dir, _ = launcher.new_run(tmp_path / "store", ["python", "train.py"], {}, None)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (run_dir / "session.json").symlink_to(victim)
    saved, error = launcher.save_session(two_worker_session(), run_dir)
    assert saved is None and "outside the store" in error and str(run_dir / "session.json") in error
    assert victim.read_text() == "precious" and (run_dir / "events").is_dir()  # the raw events are kept


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_sqlites_side_files_linked_out_of_the_store_are_refused(tmp_path, suffix):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"precious")
    home = tmp_path / "store"
    home.mkdir()
    (home / f"history.sqlite3{suffix}").symlink_to(victim)
    with pytest.raises(HistoryError, match="outside the store"):
        store.record_run(home, _row())
    assert victim.read_bytes() == b"precious"
