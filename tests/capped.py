"""A Python child with its memory capped and a deadline, for tests of code that must never read without bound or
wait for ever: a regression fails the test instead of eating the machine or hanging it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

#: The data segment a capped child may use: far more than the code under test needs, far less than a device read
#: to its end (``/dev/zero`` passes it in a second). Not the address space: LMDB maps a terabyte it never touches.
MEMORY_CAP = 1 << 30


def capped_python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -c CODE ARGS`` with ``MEMORY_CAP``; after ``timeout`` seconds it is killed and its stderr says it
    hung. Its whole process group is killed at the end (a worker of it left blocked on a FIFO)."""
    prologue = f"import resource; resource.setrlimit(resource.RLIMIT_DATA, ({MEMORY_CAP}, {MEMORY_CAP}))\n"
    proc = subprocess.Popen([sys.executable, "-c", prologue + code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", f"still running after {timeout} s (hung)"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
