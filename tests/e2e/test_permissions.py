"""Files and folders the user may not read or write are one line that names them and the permission missing,
never Python's ``[Errno 13]`` or advice that does not fit (``chmod u+w`` for a file that cannot even be read,
"make room" for a folder that has room but is not writable).

As root nothing is refused, so there the CLI runs as an unprivileged user (``setpriv``, uid 65534) in a folder
under /tmp that user can reach.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stallscope.analysis import analyze
from stallscope.history import runs, store
from tests.unit.report_fixtures import two_worker_session

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the unprivileged user can enter (pytest's own tmp_path is private to root)."""
    where = Path(tempfile.mkdtemp(prefix="stallscope-permissions-", dir="/tmp"))
    os.chmod(where, 0o755)
    try:
        yield where
    finally:
        for folder, dirs, files in os.walk(where):
            for name in dirs + files:
                os.chmod(os.path.join(folder, name), 0o700)
        shutil.rmtree(where, ignore_errors=True)


def as_user(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m stallscope ARGS`` as an unprivileged user (as this user, where that is not root)."""
    command = [sys.executable, "-m", "stallscope", *args]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: nothing can be refused")
        command = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": SRC, **(env or {})}, stdin=subprocess.DEVNULL)
    if os.geteuid() == 0 and "No module named" in done.stderr:
        pytest.skip(f"the unprivileged user cannot run this Python here: {done.stderr[-300:]}")
    return done


def test_a_history_that_cannot_be_read_asks_for_read_permission(shared):
    """mode 000: reading the history needs the r bit; the w bit it was told to add would not have helped."""
    session = two_worker_session()
    where = shared / "store"
    store.record_run(where, runs.row_from_session(session, analyze(session), None))
    os.chmod(where, 0o755)
    db = store.history_path(where)
    os.chmod(db, 0)
    done = as_user(["history", "--store", str(where)], cwd=shared)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line == (f"stallscope history: the run history {db} cannot be read: permission denied; give yourself "
                    f"access with: chmod u+r {db}, or choose another store with --store DIR")


def test_a_folder_where_the_history_file_should_be_is_named_as_such_not_a_permission(tmp_path):
    """No chmod opens a folder as a database: reading and writing say what is there and what to do."""
    where = tmp_path / "store"
    db = store.history_path(where)
    db.mkdir(parents=True)
    expected = (f"the run history {db} is a folder, not a file: move it out of the way (mv {db} {db}.folder), or "
                "choose another store with --store DIR")
    listed = subprocess.run([sys.executable, "-m", "stallscope", "history", "--store", str(where)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert listed.returncode == 2 and listed.stderr.strip() == f"stallscope history: {expected}", listed.stderr
    session = two_worker_session()
    with pytest.raises(store.HistoryError) as raised:
        store.record_run(where, runs.row_from_session(session, analyze(session), None))
    assert str(raised.value) == expected


@pytest.mark.parametrize("inside", [False, True])
def test_a_demo_cache_that_is_not_writable_says_so_not_make_room(shared, inside):
    """A read-only cache folder; or one inside a folder this user may not even search (where asking whether a
    path exists raises, which once turned the message into an internal error)."""
    refused = shared / "cache"
    refused.mkdir()
    os.chmod(refused, 0o600 if inside else 0o555)
    cache = refused / "inner" if inside else refused
    done = as_user(["demo", "--store", str(shared / "store")], cwd=shared, env={"XDG_CACHE_HOME": str(cache)})
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line == (f"stallscope demo: cannot write the demo dataset in {cache}/stallscope/datasets: {refused} is not "
                    "writable (Permission denied): set XDG_CACHE_HOME to a folder you can write (the dataset takes "
                    "about 80 MB)")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("verb", [["plan", "last"], ["export", "last", "--to", "tensorboard"],
                                  ["merge", "last", "-o", "merged.json"], ["report", "last"],
                                  ["compare", "last", "last"]])
def test_a_session_that_cannot_be_read_is_named_with_the_reason(shared, verb):
    run_dir = shared / ".stallscope" / "runs" / "20240101-000000-abcdef"
    run_dir.mkdir(parents=True)
    session = two_worker_session().save(run_dir / "session.json")
    for folder in (shared / ".stallscope", shared / ".stallscope" / "runs", run_dir):
        os.chmod(folder, 0o755)
    os.chmod(session, 0)
    done = as_user(verb, cwd=shared)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        (f"stallscope {verb[0]}: cannot read {session}: permission denied; its owner can make it readable with: "
         f"chmod a+r {session}")]
