"""The live view, driven in a real pseudo-terminal: the status line updates under the script's output,
the script's own lines reach the terminal whole, ``--quiet`` turns it off, and piped output is what
the script wrote, byte for byte."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from tests.conftest import SCRIPTS

pytestmark = pytest.mark.e2e

STALLSCOPE = [sys.executable, "-m", "stallscope"]
JOB = [sys.executable, str(SCRIPTS / "live_job.py")]
ERASE = b"\r\x1b[2K"
STATUS = re.compile(rb"\r\x1b\[2K((?:\x1b\[[0-9;]*m)*stallscope \xe2\x96\xb8 [^\r]*)(?=\r\x1b\[2K)")


def _in_terminal(argv: list[str], cwd, columns: int = 120, stdout=None,
                 until: bytes | None = None, then=None) -> tuple[int, bytes]:
    """Run ``argv`` with stdin, stdout and stderr on one pseudo-terminal, as in a terminal window (``stdout``:
    somewhere else instead). ``then(child)`` is called once ``until`` has appeared in the output."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(columns))
    child = subprocess.Popen(argv, stdin=slave, stdout=slave if stdout is None else stdout, stderr=slave, cwd=cwd,
                             env=env, start_new_session=True)
    os.close(slave)
    output = b""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if until is not None and re.search(until, output):
            then(child)
            until = None
        ready, _, _ = select.select([master], [], [], 5)
        if not ready:
            if child.poll() is not None:
                break
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    return child.wait(timeout=60), output


def _without_status(output: bytes) -> bytes:
    return STATUS.sub(b"", output).replace(ERASE, b"")


def test_status_line_updates_under_intact_script_output(tmp_path):
    code, output = _in_terminal([*STALLSCOPE, "run", "--store", str(tmp_path / "store"), "--json",
                                 str(tmp_path / "s.json"), "--", *JOB, "150"], tmp_path)
    assert code == 0, output[-3000:]
    statuses = [m.group(1) for m in STATUS.finditer(output)]
    steps = [int(m) for s in statuses for m in re.findall(rb"step ([0-9,]+) ", s.replace(b",", b""))]
    assert len(set(steps)) >= 2, statuses[-5:]  # it updated while the script ran
    assert steps == sorted(steps)
    assert any(b"steps/s" in s and b"data wait" in s and b"leading so far: " in s for s in statuses), statuses[-3:]
    assert all(len(re.sub(rb"\x1b\[[0-9;]*m", b"", s).decode()) < 120 for s in statuses)  # one line, never wrapped

    clean = _without_status(output)
    lines = clean.split(b"\r\n")
    script_lines = [line for line in lines if line.startswith(b"script ")]
    expected_out = [f"script line {k}: ".encode() for k in range(8)]
    assert [line[:len(p)] for line, p in zip([x for x in script_lines if x.startswith(b"script line")],
                                               expected_out)] == expected_out
    assert all(line.endswith(b"and some words after it") for line in script_lines if b"script line" in line)
    assert [x for x in script_lines if x.startswith(b"script warning")] == [
        f"script warning {k}".encode() for k in range(4)]
    assert b"script done" in script_lines
    # the summary follows on lines of its own, the status line erased before it
    after = re.sub(rb"\x1b\[[0-9;]*m", b"", clean[clean.index(b"script done"):])
    assert re.search(rb"\r\nverdict: input-bound ", after), after[:400]
    assert json.loads((tmp_path / "s.json").read_text())["steps"] == 150


def test_quiet_shows_no_status_line(tmp_path):
    code, output = _in_terminal([*STALLSCOPE, "run", "--quiet", "--store", str(tmp_path / "store"), "--", *JOB, "60"],
                                tmp_path)
    assert code == 0, output[-3000:]
    assert "stallscope ▸".encode() not in output and ERASE not in output
    assert b"script line 2: " in output and b"script done" in output


def test_piped_output_is_what_the_script_wrote(tmp_path):
    plain = subprocess.run([*JOB, "100"], capture_output=True, cwd=tmp_path, timeout=120, check=False)
    recorded = subprocess.run([*STALLSCOPE, "run", "--store", str(tmp_path / "store"), "--", *JOB, "100"],
                              capture_output=True, cwd=tmp_path, timeout=240, check=False)
    assert plain.returncode == recorded.returncode == 0, recorded.stderr[-3000:]
    assert recorded.stdout == plain.stdout
    assert recorded.stderr.startswith(plain.stderr)  # then the summary, and nothing of the live view
    assert "stallscope ▸".encode() not in recorded.stderr and ERASE not in recorded.stderr


def test_exit_code_is_the_scripts_under_the_view(tmp_path):
    code, output = _in_terminal([*STALLSCOPE, "run", "--store", str(tmp_path / "store"), "--", *JOB, "40",
                                 "--exit-code", "7"], tmp_path)
    assert code == 7, output[-3000:]
    assert b"script done" in output and b"Traceback" not in output


def test_ctrl_c_under_the_view_saves_the_session(tmp_path):
    summary = tmp_path / "s.json"
    code, output = _in_terminal([*STALLSCOPE, "run", "--store", str(tmp_path / "store"), "--json", str(summary), "--",
                                 *JOB, "100000"], tmp_path, until=rb"script line 3: ",
                                then=lambda child: os.kill(child.pid, signal.SIGINT))
    assert code == 130, output[-3000:]
    saved = json.loads(summary.read_text())
    assert saved["ended_by"] == "interrupt" and saved["steps"] >= 60 and saved["session"]
    # the script's own KeyboardInterrupt traceback is Python's, as without stallscope; none from the launcher
    assert not re.search(rb"stallscope/(launcher|render|cli|api)", output), output[-3000:]
    assert b"Exception in thread" not in output


def test_a_process_left_writing_after_the_script_ended(tmp_path):
    code, output = _in_terminal([*STALLSCOPE, "run", "--store", str(tmp_path / "store"), "--json",
                                 str(tmp_path / "s.json"), "--", *JOB, "30", "--orphan"], tmp_path)
    assert code == 0, output[-3000:]
    assert b"Exception in thread" not in output and b"Traceback" not in output
    assert json.loads((tmp_path / "s.json").read_text())["steps"] == 30
    assert b"orphan line 0" in output  # copied through, status line gone before it


def test_stdout_and_stderr_keep_the_order_they_were_written_in(tmp_path):
    code, output = _in_terminal([*STALLSCOPE, "run", "--store", str(tmp_path / "store"), "--", *JOB, "30",
                                 "--interleave", "150"], tmp_path)
    assert code == 0, output[-3000:]
    lines = [line for line in _without_status(output).split(b"\r\n") if re.fullmatch(rb"[OE][0-9]+", line)]
    assert lines == [f"{kind}{k}".encode() for k in range(150) for kind in "OE"]


def test_stdout_piped_while_stderr_is_a_terminal_gets_no_view(tmp_path):
    plain = subprocess.run([*JOB, "60"], capture_output=True, cwd=tmp_path, timeout=120, check=False)
    code, output = _in_terminal([*STALLSCOPE, "run", "--store", str(tmp_path / "store"), "--", *JOB, "60"], tmp_path,
                                stdout=subprocess.PIPE)
    assert code == 0
    assert "stallscope ▸".encode() not in output and ERASE not in output  # like | tee: nothing drawn
    assert output.replace(b"\r\n", b"\n").startswith(plain.stderr)
