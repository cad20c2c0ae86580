"""A damaged or read-only history says what to do and can be rebuilt from the saved sessions (issue 18,
case 10)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS

TINY = str(SCRIPTS / "tiny_train.py")


def stallscope(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallscope", *args], capture_output=True, text=True, timeout=240,
                          cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("history") / "store"
    for _ in range(2):
        done = stallscope("run", "--quiet", "--store", str(where), "--", sys.executable, TINY, "--n", "48",
                          cwd=where.parent)
        assert done.returncode == 0, done.stderr
    return where


def _run_ids(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if line[:8].isdigit()]


def test_a_damaged_history_says_how_to_rebuild_it_and_rebuild_brings_the_runs_back(store, tmp_path):
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    before = _run_ids(stallscope("history", "--store", str(copy), cwd=tmp_path).stdout)
    assert len(before) == 2
    (copy / "history.sqlite3").write_bytes(b"\x00garbage, not a database" * 200)
    for suffix in ("-wal", "-shm"):
        (copy / f"history.sqlite3{suffix}").unlink(missing_ok=True)
    broken = stallscope("history", "--store", str(copy), cwd=tmp_path)
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    [line] = broken.stderr.strip().splitlines()
    assert "is damaged" in line and f"stallscope history --rebuild --store {copy}" in line
    compare = stallscope("compare", before[0], before[1], "--store", str(copy), cwd=tmp_path)
    assert "Traceback" not in compare.stderr
    rebuilt = stallscope("history", "--rebuild", "--store", str(copy), cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "from 2 saved session(s)" in rebuilt.stderr and "the old file is kept as" in rebuilt.stderr
    assert _run_ids(rebuilt.stdout) == before
    assert list(copy.glob("history.sqlite3.before-rebuild-*")), "the damaged file is kept, not deleted"


def test_a_read_only_history_is_still_read(store, tmp_path):
    """A store on a read-only mount (root ignores file modes, so a bind mount makes it read-only)."""
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare to mount the store read-only")
    py = sys.executable
    script = (f"mount --bind {copy} {copy} && mount -o remount,bind,ro {copy} || exit 77; "
              f"{py} -m stallscope history --store {copy}")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path)
    if done.returncode == 77:
        pytest.skip("this machine does not allow a read-only bind mount")
    assert done.returncode == 0, done.stderr
    assert len(_run_ids(done.stdout)) == 2


def test_a_rebuild_that_cannot_read_every_session_leaves_the_history_as_it_was(store, tmp_path):
    """A session the file system will not read (here a folder where the file should be, an OSError even for root;
    permissions do the same) still is a run: rebuilding without it would drop it from the history for good."""
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    before = (copy / "history.sqlite3").read_bytes()
    blocked = copy / "runs" / "20000101-000000-abcdef"
    (blocked / "session.json").mkdir(parents=True)
    done = stallscope("history", "--rebuild", "--store", str(copy), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"cannot read {blocked / 'session.json'}: Is a directory" in done.stderr
    assert "the history is left as it was" in done.stderr and "Traceback" not in done.stderr
    assert (copy / "history.sqlite3").read_bytes() == before
    assert not list(copy.glob("history.sqlite3.before-rebuild-*"))


def test_two_rebuilds_in_one_second_keep_both_old_files(store, tmp_path):
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    for _ in range(2):
        done = stallscope("history", "--rebuild", "--store", str(copy), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    kept = sorted(p.name for p in copy.glob("history.sqlite3.before-rebuild-*") if not p.name.endswith("-wal"))
    assert len(kept) == 2, kept  # named by the second, then -2 when they share it: never one over the other


def test_a_run_the_history_could_not_take_says_how_to_get_it_back(tmp_path):
    """The session is saved but the history cannot be written (here a folder where the database should be): the
    warning says that a rebuild adds it later, and a rebuild does once the history can be written."""
    store = tmp_path / "store"
    (store / "history.sqlite3").mkdir(parents=True)
    done = stallscope("run", "--quiet", "--store", str(store), "--", sys.executable, TINY, "--n", "48", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "the run was not added to the history" in done.stderr
    assert "stallscope history --rebuild adds it from its saved session" in done.stderr
    (store / "history.sqlite3").rmdir()
    rebuilt = stallscope("history", "--rebuild", "--store", str(store), cwd=tmp_path)
    assert rebuilt.returncode == 0 and len(_run_ids(rebuilt.stdout)) == 1, rebuilt.stderr
