"""A full disk costs the saved session, never the script's exit code or the summary (issue 18, case 5).

Two ways: a real full file system (a 16 MiB tmpfs in a private mount namespace, where the machine
allows mounting one), and a simulated ENOSPC from the session save (always).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from stallscope import api
from tests.conftest import SCRIPTS, can_mount_tmpfs

FILL = str(SCRIPTS / "fill_disk.py")


def test_a_disk_that_fills_during_training_keeps_the_exit_code_and_prints_the_summary(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    if not can_mount_tmpfs(store):
        pytest.skip("this machine does not allow mounting a tmpfs (the simulated ENOSPC test still runs)")
    out, rebuilt, leftovers = tmp_path / "summary.json", tmp_path / "rebuilt.json", tmp_path / "leftovers.txt"
    py = sys.executable
    driver = (f"mount -t tmpfs -o size=16m tmpfs {store} && "
              f"FILL_DIR={store} {py} -m stallscope run --store {store} --json {out} -- {py} {FILL}; "
              f"echo $? > {tmp_path / 'rc'}; "
              f"(find {store} -name '*.tmp' | wc -l; ls {store}/runs/*/events | wc -l) > {leftovers}; "
              f"rm {store}/filler && {py} -m stallscope report {store}/runs/* --json {rebuilt} > /dev/null")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", driver], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert (tmp_path / "rc").read_text().strip() == "3", done.stderr[-3000:]  # the script's own exit code
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "could not be saved" in done.stderr and "the disk is full" in done.stderr  # the summary, from memory
    assert "verdict:" in done.stderr
    summary = json.loads(out.read_text())  # written outside the full disk
    assert summary["exit_code"] == 3 and summary["session"] is None and summary["steps"] == 30
    notes = " ".join(summary["notes"])
    assert "the disk is full" in notes and "stallscope report" in notes
    tmp_files, event_files = (int(n) for n in leftovers.read_text().split())
    assert tmp_files == 0, "a partial file was left on the full disk"
    assert event_files >= 1, "the raw events are kept to rebuild the session"
    # Once there is room again, report rebuilds the session from the kept raw events.
    assert done.returncode == 0, done.stderr[-3000:]
    again = json.loads(rebuilt.read_text())
    assert again["ended_by"] == "recovered" and again["steps"] == 30
    # the script's own code, kept by the launcher in space reserved at the start (it used to be inferred: 137)
    assert again["exit_code"] == 3 and any("the one stallscope recorded" in n for n in again["notes"])


def test_a_session_save_that_fails_with_enospc_is_a_note_not_a_crash(tmp_path, monkeypatch):
    from stallscope import paths

    real_fdopen = os.fdopen

    class HalfWritten:
        """The session's temporary file: part of it reaches the disk, then the disk is full."""

        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            self.fh.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    def full_disk(fd, *args, **kwargs):
        fh = real_fdopen(fd, *args, **kwargs)
        return HalfWritten(fh) if ".session.json." in os.readlink(f"/proc/self/fd/{fd}") else fh

    monkeypatch.setattr(paths.os, "fdopen", full_disk)
    script = tmp_path / "t.py"
    script.write_text("import sys\nfrom torch.utils.data import DataLoader\n"
                      "for b in DataLoader(list(range(20)), batch_size=2):\n    pass\nsys.exit(5)\n")
    result = api.run([sys.executable, str(script)], store=tmp_path / "store")
    assert result.exit_code == 5 and result.summary["exit_code"] == 5
    assert result.session_path is None and result.summary["session"] is None
    assert result.summary["steps"] == 10
    assert "the disk is full" in (result.history_error or "")
    [run_dir] = list((tmp_path / "store" / "runs").iterdir())
    assert not list(run_dir.glob("*.tmp")) and not (run_dir / "session.json").exists()
    assert list((run_dir / "events").glob("*.jsonl")), "the raw events are kept"
    assert any("could not be saved" in n and "the disk is full" in n for n in result.summary["notes"])
