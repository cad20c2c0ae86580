"""Planted store contents met through the real CLI (issue 43, case 1): a history linked to another program's
database is refused in one line before the script runs, and that database keeps only its own tables."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_run_refuses_a_history_linked_out_of_the_store(tmp_path):
    other = tmp_path / "app.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY)")
    (tmp_path / ".stallscope").mkdir()
    (tmp_path / ".stallscope" / "history.sqlite3").symlink_to(other)
    shutil.copy(SCRIPTS / "tiny_train.py", tmp_path)
    done = subprocess.run([sys.executable, "-m", "stallscope", "run", "-q", "--", sys.executable, "tiny_train.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "history.sqlite3 is a symbolic link to" in lines[0] and str(other) in lines[0]
    with sqlite3.connect(other) as conn:
        assert {name for (name,) in conn.execute("SELECT name FROM sqlite_master")} == {"accounts"}
    assert not (tmp_path / ".stallscope" / "runs").exists() or not any((tmp_path / ".stallscope" / "runs").iterdir())
