"""``paths.write_file``: what a user names as an output is written whole or not at all, through links, and never
destroys a special file; ``refuse_store_file`` keeps outputs off the store's own files."""

from __future__ import annotations

import errno
import os
import stat
import threading
import time

import pytest

from stallscope import paths
from stallscope.paths import refuse_store_file, write_file


def test_a_new_file_and_a_replaced_one_keep_sane_permissions(tmp_path):
    target = tmp_path / "deep" / "out.json"
    write_file(target, "one")
    assert target.read_text() == "one" and os.listdir(target.parent) == ["out.json"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()
    target.chmod(0o640)
    write_file(target, b"two")
    assert target.read_bytes() == b"two" and stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_symbolic_link_is_written_through(tmp_path):
    real = tmp_path / "real" / "target.json"
    real.parent.mkdir()
    real.write_text('{"mine": 1}')
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_file(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_fifo_is_written_to_not_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    try:
        for _ in range(200):  # until the reader has the FIFO open: before that, no program reads it (ENXIO)
            try:
                write_file(fifo, "through the pipe")
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                time.sleep(0.02)
        reader.join(timeout=10)
    finally:
        if reader.is_alive():  # never leave the reader blocked in open(): pytest would not exit
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_fifo_nobody_reads_is_an_error_not_a_wait(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="no program is reading"):
        write_file(fifo, "x")


def test_dev_stdout_is_the_descriptor_held_not_the_file_reopened(tmp_path):
    """Reopening /dev/stdout would truncate the file a shell appends to (>>), and fails on a pipe."""
    import subprocess
    import sys

    log = tmp_path / "log.txt"
    log.write_text("precious\n")
    code = "from stallscope.paths import write_file; print('before', flush=True); write_file('/dev/stdout', 'json\\n')"
    with open(log, "a") as appended:
        subprocess.run([sys.executable, "-c", code], stdout=appended, check=True)
    assert log.read_text() == "precious\nbefore\njson\n"
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert piped.stdout == "before\njson\n"


def test_a_full_device_is_an_error_and_stays_a_device():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with pytest.raises(OSError) as caught:
        write_file("/dev/full", "x" * 100_000)
    assert caught.value.errno == errno.ENOSPC and stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    target = tmp_path / "out.json"
    target.write_text("old")

    def fail(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(paths.os, "replace", fail)
    with pytest.raises(OSError):
        write_file(target, "new")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]


def test_a_user_file_named_like_the_temporary_one_is_not_touched(tmp_path):
    mine = tmp_path / "out.json.tmp"
    mine.write_text("mine")
    write_file(tmp_path / "out.json", "new")
    assert mine.read_text() == "mine"


def test_folders_in_the_way_are_clear_errors(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(NotADirectoryError, match="a folder on its path is a file"):
        write_file(tmp_path / "afile" / "out.json", "x")
    with pytest.raises(IsADirectoryError):
        write_file(tmp_path, "x")


def test_outputs_stay_off_the_store(tmp_path):
    store = tmp_path / "store"
    run = store / "runs" / "20240101-000000-aaaaaa"
    run.mkdir(parents=True)
    (run / "session.json").write_text("{}")
    (store / "history.sqlite3").write_text("")
    for inside in (run / "session.json", store / "history.sqlite3", run / "new.json", store / "runs" / "x.json"):
        with pytest.raises(ValueError, match="inside the store"):
            refuse_store_file(inside, store)
    link = tmp_path / "link.json"
    link.symlink_to(run / "session.json")
    with pytest.raises(ValueError, match="inside the store"):
        refuse_store_file(link, store)
    refuse_store_file(tmp_path / "summary.json", store)  # beside the store: fine
    refuse_store_file(store / "summary.json", store)  # a new file at the store's top: fine
    (store / "summary.json").write_text("{}")
    refuse_store_file(store / "summary.json", store)  # and written again by the next run: still the user's
    (store / "tune" / "20240101-000000").mkdir(parents=True)
    (store / "tune" / "20240101-000000" / "tune.json").write_text("{}")
    for owned in (store, store / "runs", store / "history.sqlite3-wal", store / "history.sqlite3.before-rebuild-1",
                  store / "tune" / "20240101-000000" / "tune.json"):  # an existing record in another folder of it
        with pytest.raises(ValueError, match="inside the store"):
            refuse_store_file(owned, store)
    refuse_store_file(store / "tune" / "new.json", store)  # a new file there overwrites nothing


def test_a_case_insensitive_spelling_of_the_stores_files_is_still_the_store(tmp_path):
    """On macOS's and Windows' default file systems ``RUNS/x/session.json`` is ``runs/x/session.json``: the
    check compares existing files and folders by identity, not by name. Shown with another name for the same
    folder (a link) and for the same file (a hard link, which keeps its own name)."""
    store = tmp_path / "store"
    run = store / "runs" / "20240101-000000-aaaaaa"
    run.mkdir(parents=True)
    (run / "session.json").write_text("{}")
    (store / "history.sqlite3").write_text("")
    (store / "RUNS").symlink_to(store / "runs")  # another name for the same folder
    (store / "History.sqlite3").symlink_to(store / "history.sqlite3")
    import os

    os.link(store / "history.sqlite3", store / "db")
    for other in (store / "RUNS" / run.name / "session.json", store / "History.sqlite3", store / "db"):
        with pytest.raises(ValueError, match="inside the store"):
            refuse_store_file(other, store)


def test_another_stores_files_are_known_by_their_shape_and_a_users_own_are_not(tmp_path):
    import json

    other = tmp_path / "elsewhere" / "runs" / "20240101-000000-aaaaaa"
    (other / "events").mkdir(parents=True)
    (other / "run.json").write_text(json.dumps({"run_id": other.name}))
    (other / "session.json").write_text("{}")
    (tmp_path / "elsewhere" / "history.sqlite3").write_text("")
    store = tmp_path / "store"  # the verb's own store is another one
    for theirs in (other / "session.json", other / "run.json", other / "events" / "1.jsonl",
                   tmp_path / "elsewhere" / "history.sqlite3"):
        with pytest.raises(ValueError, match="stallscope run|run history"):
            refuse_store_file(theirs, store)
    refuse_store_file(other / "report.html", store)  # a new file beside a run's: nothing of it is lost
    mine = tmp_path / "results"  # a user's folder with a session.json copied in and a run.json of their own
    mine.mkdir()
    (mine / "session.json").write_text("{}")
    (mine / "run.json").write_text('{"lr": 0.1}')
    refuse_store_file(mine / "report.html", store)
    refuse_store_file(mine / "run.json", store)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_last_names_the_runs_that_never_saved_their_session(tmp_path):
    """A full disk left a run without its session: ``last`` means the last saved one, and says where the other is."""
    import json

    from stallscope.paths import resolve_run

    store = tmp_path / "store"
    unsaved = store / "runs" / "20240101-000000-aaaaaa"
    unsaved.mkdir(parents=True)
    (unsaved / "run.json").write_text(json.dumps({"run_id": unsaved.name}))
    with pytest.raises(FileNotFoundError, match="it holds 0; 1 more never saved their session .* the newest is "
                                                "20240101-000000-aaaaaa"):
        resolve_run("last", store)
    assert resolve_run("20240101", store) == unsaved  # by its id it resolves, to be rebuilt


def test_run_references_that_name_nothing_or_too_much_are_said_so(tmp_path):
    from stallscope.paths import resolve_run

    store = tmp_path / "store"
    for k in range(7):
        run = store / "runs" / f"20260101-00000{k}-abc"
        run.mkdir(parents=True)
        (run / "session.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"7 run ids start with it \(.*, 20260101-000004-abc and 2 more\); "
                                                r"give more of it"):
        resolve_run("2026", store)
    with pytest.raises(FileNotFoundError, match="no run named: give a run id"):
        resolve_run("", store)
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(FileNotFoundError, match="the store .* is a file, not a folder"):
        resolve_run("last", a_file)
    # a store that does not exist is said so, not counted as holding no run (the tester's "it holds 0")
    with pytest.raises(FileNotFoundError, match=r"no run 'last': there is no store at .*nowhere \(nothing was "
                                                r"recorded there\)"):
        resolve_run("last", tmp_path / "nowhere")
    assert resolve_run("20260101-000003", store) == store / "runs" / "20260101-000003-abc" / "session.json"


def test_a_damaged_newest_session_says_how_to_reach_the_runs_around_it(tmp_path):
    """``report last`` on a newest session that is not valid JSON: the error says how to go on (the tester was
    left with "not a stallscope session" while ``compare last`` read another run from the history)."""
    from stallscope.cli.report_cmd import load_run

    store = tmp_path / "store"
    run = store / "runs" / "20260101-000000-abc"
    run.mkdir(parents=True)
    (run / "session.json").write_text('{"schema": "stallscope.session/1", "run_id": ')  # cut short
    # the only run: nothing before it to name
    with pytest.raises(ValueError, match=r"is not a stallscope session \(invalid JSON.*\)\. To go on: a run id "
                                         r"from stallscope history$"):
        load_run("last", str(store), "plan")
    newer = store / "runs" / "20260102-000000-abc"
    newer.mkdir()
    (newer / "session.json").write_text("not json")
    with pytest.raises(ValueError, match=r"\. To go on: stallscope plan last~1 for the saved run before it, or a "
                                         r"run id from stallscope history$"):
        load_run("last", str(store), "plan")
    with pytest.raises(ValueError, match=r"\. To go on: a run id from stallscope history$"):
        load_run("last~1", str(store))  # the oldest: nothing before it
    with pytest.raises(ValueError, match=r"not a stallscope session \(invalid JSON[^.]*\)$"):
        load_run(run.name, str(store))  # named by its id: nothing to add
