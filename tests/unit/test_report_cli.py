"""``stallscope report`` on a saved session, through the real CLI: its output read by a program (a pipe, a file) keeps
each sentence on its line, and ``--quiet`` writes the files asked for without a word."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from stallscope.analysis import analyze
from stallscope.render import terminal, words
from stallscope.render.safe_text import terminal_console
from tests.unit.report_fixtures import two_worker_session

RUN_ID = "20240101-000000-abcdef"


def _store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    two_worker_session(run_id=RUN_ID).save(store / "runs" / RUN_ID / "session.json")
    return store


def _report(store: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # as a program that pipes it
    return subprocess.run([sys.executable, "-m", "stallscope", "report", "--store", str(store), *args],
                          capture_output=True, text=True, timeout=120, env=env, cwd=cwd or store.parent)


def test_report_into_a_pipe_keeps_each_sentence_on_one_line(tmp_path):
    store = _store(tmp_path)
    done = _report(store, "last")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    session = two_worker_session(run_id=RUN_ID)
    said = words.evidence(analyze(session))
    assert said and all(f"  • {line}" in lines for line in said), lines  # each one whole, not cut at 80 columns
    assert (f"session: {store / 'runs' / RUN_ID / 'session.json'}   re-render: stallscope report --store {store} "
            f"{RUN_ID}") in lines
    assert max(len(line) for line in lines) > 80
    rule = next(line for line in lines if "stallscope" in line and "─" in line)
    assert len(rule) == 80  # a rule keeps a width a reader can take in


def test_on_a_terminal_the_summary_wraps_at_its_width():
    session = two_worker_session(run_id=RUN_ID)
    buffer = io.StringIO()
    console = terminal_console(file=buffer, force_terminal=True, color_system=None)
    terminal.render(session, analyze(session), console)
    lines = buffer.getvalue().splitlines()
    assert max(len(line) for line in lines) <= console.width and len(lines) > len(words.evidence(analyze(session)))


def test_report_quiet_writes_the_files_asked_for_and_says_nothing(tmp_path):
    store = _store(tmp_path)
    done = _report(store, "last", "--quiet")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    out = tmp_path / "summary.json"
    done = _report(store, "last", "-q", "--json", str(out))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert json.loads(out.read_text())["schema"] == "stallscope.summary/1"
    # an error is still said, and still fails
    done = _report(store, "no-such-run", "--quiet")
    assert done.returncode == 2 and "no-such-run" in done.stderr
    helped = _report(store, "--help").stdout
    assert "-q, --quiet" in helped
