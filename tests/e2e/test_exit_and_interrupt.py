"""The script's exit code is kept, and the session is saved on crashes and on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e
TINY = str(SCRIPTS / "tiny_train.py")


def _session_files(store: Path) -> list[Path]:
    return sorted(store.glob("runs/*/session.json"))


def test_exception_in_main_process_keeps_exit_code_and_saves(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "2", "--crash-main-at", "3"])
    assert result.returncode == 1
    assert "planted main failure" in result.stderr
    summary = result.summary
    assert summary["exit_code"] == 1
    assert summary["failure"]["where"] == "main"
    assert summary["failure"]["type"] == "RuntimeError"
    assert "tiny_train.py" in summary["failure"]["location"]
    assert summary["steps"] == 3
    assert Path(summary["session"]).is_file()


def test_exception_in_worker_is_attributed_to_the_worker(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, TINY, "--workers", "2", "--crash-worker-at", "20"])
    assert result.returncode == 1
    summary = result.summary
    assert summary["failure"]["where"] == "worker"
    assert summary["failure"]["type"] == "ValueError"
    assert "planted dataset failure" in summary["failure"]["message"]
    assert summary["failure"]["worker"] in (0, 1)
    assert Path(summary["session"]).is_file()


def test_plain_exit_code_is_kept(tmp_path):
    result = run_cli(tmp_path, [TINY, "--exit-code", "7"])
    assert result.returncode == 7
    assert result.summary["exit_code"] == 7
    assert result.summary["failure"]["type"] == "exit"


def test_sigint_to_launcher_stops_script_and_saves_session(tmp_path):
    store = tmp_path / "store"
    out = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "stallscope", "run", "--json", str(out), "--store", str(store), "--",
           sys.executable, TINY, "--workers", "2", "--forever", "--sleep-ms", "2", "--print-loss"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        lines = 0
        while lines < 20:  # wait until the script is really training
            line = proc.stdout.readline()
            assert line, proc.stderr.read()[-3000:]
            lines += line.startswith("loss")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["ended_by"] == "interrupt"
    assert summary["steps"] >= 19
    assert summary["exit_code"] == 128 + signal.SIGINT
    assert len(_session_files(store)) == 1
    assert not list(store.glob("runs/*/events")), "raw event files are folded into the session"


def test_script_not_found_is_a_clear_error(tmp_path):
    result = run_cli(tmp_path, ["--", sys.executable, str(tmp_path / "missing.py")])
    assert result.returncode == 2
    assert "script not found" in result.stderr
    assert result.summary is None


def test_bad_set_is_refused_before_running(tmp_path):
    result = run_cli(tmp_path, ["--set", "num_wrokers=2", "--", sys.executable, TINY])
    assert result.returncode == 2
    assert "num_wrokers" in result.stderr and "num_workers" in result.stderr
    result = run_cli(tmp_path, ["--set", "num_workers=lots", "--", sys.executable, TINY])
    assert result.returncode == 2
    assert "expected an integer" in result.stderr


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")
def test_killed_script_reports_signal(tmp_path):
    script = tmp_path / "suicide.py"
    # Killed outright (like the OOM killer): what was recorded more than ~0.5 s before survives. The script
    # waits until the recorder's background flusher has written its 4 batches (no flush of its own: the
    # file is only read), so a slow flusher thread on a loaded machine delays the kill instead of losing them.
    script.write_text("import os, signal, time, torch\nfrom torch.utils.data import DataLoader\n"
                      "for b in DataLoader(list(range(8)), batch_size=2):\n    time.sleep(0.01)\n"
                      "path = os.path.join(os.environ['STALLSCOPE_RUN_DIR'], 'events', f'{os.getpid()}.jsonl')\n"
                      "deadline = time.time() + 60\n"
                      "while time.time() < deadline:\n"
                      "    if os.path.exists(path) and open(path).read().count('[\"next\",') >= 4:\n"
                      "        break\n"
                      "    time.sleep(0.1)\n"
                      "os.kill(os.getpid(), signal.SIGKILL)\n")
    result = run_cli(tmp_path, [str(script)])
    assert result.returncode == 128 + signal.SIGKILL
    assert result.summary["ended_by"] == "signal"
    assert result.summary["steps"] == 4


@pytest.mark.parametrize("where", ["a-file", "under-a-file"])
def test_a_store_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, where):
    """Chosen behaviour: nothing would be saved, so the script is not started (documented in the README)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    store = blocker if where == "a-file" else blocker / "store"
    marker = tmp_path / "ran"
    script = tmp_path / "t.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    for verb in ("run", "tune"):
        done = subprocess.run([sys.executable, "-m", "stallscope", verb, "--store", str(store), "--",
                               sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert str(blocker) in done.stderr
    assert not marker.exists()
