"""A real run whose dataset fails on a file name full of terminal control codes, in a folder and with an argument
that carry them too (issue 43, case 2): the failure line, ``report``, ``history`` and ``compare`` show the codes as
visible characters; only the script's own output (its traceback) carries them as it wrote them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import SCRIPTS

SGR = re.compile(r"\x1b\[[0-9;]*m")


def unsafe(output: str) -> list[str]:
    return [ch for ch in SGR.sub("", output) if not ch.isprintable() and ch not in "\n"]


def stallscope(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stallscope", *args], cwd=cwd, capture_output=True, timeout=240,
                          env={**os.environ, "COLUMNS": "400"}, text=True, errors="surrogateescape")


def ours(stderr: str) -> str:
    """What stallscope printed after the script: from its summary's rule on."""
    return stderr[stderr.rindex("stallscope ─") - 40:] if "stallscope ─" in stderr else stderr


def test_control_codes_from_a_run_never_reach_the_terminal(tmp_path):
    cwd = tmp_path / "proj\x1b[8m"
    cwd.mkdir()
    (cwd / "train.py").write_text((SCRIPTS / "control_codes.py").read_text())
    ok = stallscope(cwd, "run", "--", sys.executable, "train.py", "--title=\x1b]0;ARG\x07")
    assert ok.returncode == 0, ok.stderr[-3000:]
    failed = stallscope(cwd, "run", "--", sys.executable, "train.py", "--fail")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "\x1b]0;OWNED" in failed.stderr  # the script's own traceback, as it wrote it
    summary = ours(failed.stderr)
    assert "hidden.jpg" in summary and "␛]0;OWNED" in summary, summary
    assert unsafe(summary) == [], summary
    for verb in (["report", "last"], ["report", "last~1"], ["history"], ["compare", "last~1", "last"]):
        done = stallscope(cwd, *verb)
        assert done.returncode == 0, done.stderr[-2000:]
        assert unsafe(done.stdout + done.stderr) == [], (verb, done.stdout, done.stderr)
    report = stallscope(cwd, "report", "last")
    assert "␛]0;OWNED" in report.stdout  # shown, not hidden
