"""A failure is said where it happened, in one line: the DataLoader worker and the line of the user's code for an
exception in worker_init_fn, __getitem__ or collate_fn (under fork and spawn), the message of
``sys.exit("message")``, and a /dev/shm too small for the batches as the pitfall it is."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stallscope.session import Session
from tests.conftest import SCRIPTS, on_a_small_disk

pytestmark = pytest.mark.e2e
SCRIPT = SCRIPTS / "failing_parts.py"
#: part -> (exception type, message as str() gives it, the marker comment on the line that raises)
FAILURES = {
    "worker_init": ("RuntimeError", "cannot open the shard list", "# the worker_init failure"),
    "getitem": ("ValueError", "sample 5 is damaged", "# the getitem failure"),
    "collate": ("KeyError", "'no label'", "# the collate failure"),
}


def _line_of(marker: str) -> int:
    return next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if marker in line)


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, "-m", "stallscope", "run", "--json", str(out), "--store",
                           str(tmp_path / "store"), "--", sys.executable, str(SCRIPT), *args],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env={**os.environ, "COLUMNS": "1000"})  # no wrapping of the lines asserted on
    return proc, json.loads(out.read_text())


def _said_from(stderr: str) -> list[str]:
    """stallscope's own lines: what follows its rule (the script's traceback comes before it)."""
    lines = stderr.splitlines()
    start = max(i for i, line in enumerate(lines) if "stallscope" in line and set(line) & {"─"})
    return lines[start + 1:]


@pytest.mark.parametrize("part, context", [("worker_init", "fork"), ("worker_init", "spawn"),
                                           ("getitem", "fork"), ("collate", "spawn")])
def test_a_worker_failure_is_placed_on_the_worker_at_the_users_line_in_one_line(tmp_path, part, context):
    proc, summary = _run(tmp_path, part, context)
    assert proc.returncode == 1, proc.stderr[-3000:]
    kind, message, marker = FAILURES[part]
    # the worker torch names in the exception it raises in the training process
    named = re.search(r"Caught \w+ in DataLoader worker process (\d+)", proc.stderr)
    assert named, proc.stderr[-3000:]
    worker = int(named.group(1))
    failure = summary["failure"]
    location = f"{SCRIPT}:{_line_of(marker)}"
    assert (failure["where"], failure["worker"], failure["type"], failure["message"], failure["location"]) == (
        "worker", worker, kind, message, location), failure
    assert isinstance(failure["pid"], int) and failure["pid"] != Session.load(summary["session"]).main_pid
    # the training process's wait for a batch that the failed worker never made is the failure, not a hang
    assert "loader-stalled" not in [p["id"] for p in summary["pitfalls"]]
    said = _said_from(proc.stderr)
    failed = [line for line in said if line.startswith("the script failed")]
    assert failed == [(f"the script failed in worker {worker} (pid {failure['pid']}) of loader 0: {kind}: "
                       f"{message}  at {location}")], said
    assert not any("Traceback" in line or line.lstrip().startswith('File "') for line in said), said


def test_sys_exit_with_a_message_is_said_with_its_message(tmp_path):
    proc, summary = _run(tmp_path, "exit_message", "fork")
    assert proc.returncode == 1
    assert proc.stderr.startswith("fatal: bad config\n")  # what Python itself prints, untouched
    failure = summary["failure"]
    assert (failure["type"], failure["exit_code"], failure["message"]) == (
        "exit", 1, "the script exited with code 1: fatal: bad config"), failure
    assert failure["location"] == f"{SCRIPT}:{_line_of('# the exit message')}"
    failed = [line for line in _said_from(proc.stderr) if line.startswith("the script failed")]
    assert failed == [("the script failed in the main process: the script exited with code 1: fatal: bad config"
                       f"  at {failure['location']}")]


def test_a_dev_shm_too_small_for_the_batches_is_named_with_its_fix(tmp_path):
    """A real /dev/shm of 2 MiB (a tmpfs mounted over it in a private mount namespace) under batches of 8 MiB:
    the workers fail to allocate the shared memory a batch travels in, and the report names the cause and the fix,
    not only the failure."""
    out = tmp_path / "summary.json"
    done = on_a_small_disk(tmp_path, Path("/dev/shm"), shlex.join(
        [sys.executable, "-m", "stallscope", "run", "--json", str(out), "--store", str(tmp_path / "store"), "--",
         sys.executable, str(SCRIPTS / "shm_batches.py")]), size="2m", env={**os.environ, "COLUMNS": "1000"})
    assert done.returncode == 1, done.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["failure"]["where"] == "worker" and "No space left on device" in summary["failure"]["message"]
    [shm] = [p for p in summary["pitfalls"] if p["id"] == "shm-exhausted"]
    assert shm["facts"]["shm_size_bytes"] == 2 << 20 and shm["facts"]["workers"] == 2
    assert "--shm-size" in shm["fix"] and "prefetch_factor" in shm["fix"]
    said = _said_from(done.stderr)
    assert f"pitfall (loader): {shm['title']}" in said and f"    fix: {shm['fix']}" in said, said
