"""An OSError is said with the file (or folder) it concerns, never as Python's bare ``[Errno 2] No such file or
directory``: in the history warning, in ``report``'s refusal, and wherever stallscope says one."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope.analysis import analyze
from stallscope.api import record_history
from stallscope.oserrors import os_error_words
from tests.unit.report_fixtures import two_worker_session


def _real_error(call) -> OSError:
    try:
        call()
    except OSError as exc:
        return exc
    raise AssertionError("no error")


def test_an_os_error_is_said_with_its_file_the_path_in_hand_or_the_folder_that_went(tmp_path, monkeypatch):
    missing = tmp_path / "nothing-here"
    assert os_error_words(_real_error(missing.read_bytes)) == f"{missing}: no such file or directory"
    moved = _real_error(lambda: os.rename(missing, tmp_path / "b"))
    assert os_error_words(moved) == f"{missing} -> {tmp_path / 'b'}: no such file or directory"
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a write names no file: the one in hand is said
    assert os_error_words(full, tmp_path / "history.sqlite3") == f"{tmp_path / 'history.sqlite3'}: no space left on device"
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    cwd = _real_error(os.getcwd)
    assert str(cwd) == "[Errno 2] No such file or directory"  # what Python says: no name at all
    assert os_error_words(cwd) == f"the current folder {gone} no longer exists (it was deleted or moved)"


def test_the_history_warning_names_what_is_missing(tmp_path, monkeypatch):
    """A run whose history could not be written where the current folder went away while it ran (the default
    store, ./.stallscope, is found from it)."""
    monkeypatch.delenv("STALLSCOPE_HOME", raising=False)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    session = two_worker_session()
    error = record_history(None, session, analyze(session), None)
    assert error is not None and "Errno" not in error and str(gone) in error, error


@pytest.mark.parametrize("verb", [["report", "last"], ["history"]])
def test_a_verb_started_in_a_folder_that_was_deleted_names_it(tmp_path, verb):
    gone = tmp_path / "gone"
    gone.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "STALLSCOPE_HOME"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # -m finds stallscope without the current folder
    done = subprocess.run(["sh", "-c", f'cd "{gone}" && rmdir "{gone}" && exec "{sys.executable}" -m stallscope '
                                       + " ".join(verb)], capture_output=True, text=True, timeout=120, env=env,
                          cwd=Path(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "Errno" not in done.stderr and str(gone) in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
