"""User text (arguments, paths, exception messages, --set values) is printed as written, never read as rich
markup: no traceback, no lost exit code, no text swallowed, and the history and reports still open."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS

pytestmark = pytest.mark.e2e
MESSAGE = "failed to read [/data/train/x.jpg]: reduction must be one of [mean, sum, none], got [red]"


def stallscope(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400"}  # whole lines, so the text can be checked as written
    return subprocess.run([sys.executable, "-m", "stallscope", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env=env)


def test_brackets_in_arguments_messages_paths_and_set_values(tmp_path):
    cwd = tmp_path / "[red]proj"
    cwd.mkdir()
    script = cwd / "train.py"
    script.write_text((SCRIPTS / "markup_text.py").read_text())
    ok = stallscope(cwd, "run", "--set", "pin_memory_device=[/x]", "--", sys.executable, str(script),
                    "data.dirs=[/mnt/a,/mnt/b]")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "Traceback" not in ok.stderr and "[/x]" in ok.stderr  # the overrides line, as given
    assert str(cwd / ".stallscope") in ok.stderr  # the saved session's path, brackets included

    failed = stallscope(cwd, "run", "--", sys.executable, str(script), "--fail")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "Traceback (most recent call last)" in failed.stderr  # the script's own traceback, nothing of ours
    assert failed.stderr.count("Traceback (most recent call last)") == 1
    assert f"ValueError: {MESSAGE}" in failed.stderr.split("stallscope")[-1] or MESSAGE in failed.stderr
    summary_part = failed.stderr[failed.stderr.index("the script failed"):]
    assert MESSAGE in summary_part

    history = stallscope(cwd, "history")
    assert history.returncode == 0, history.stderr
    assert "pin_memory_device=[/x]" in history.stdout
    for ref in ("last", "last"):
        report = stallscope(cwd, "report", ref)
        assert report.returncode == 0 and MESSAGE in report.stdout, report.stderr[-2000:]
    compare = stallscope(cwd, "compare", "last~1", "last")
    assert compare.returncode == 0, compare.stderr
