"""How the script ended, in words: a failure's headline, its one line, the process it failed in, a stop told from a
failure, and the hint for the commonest first run's mistake (another Python than the one stallscope runs in)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import signal
import sys

from stallscope.analysis import Failure


def failure_message(failure: Failure) -> str:
    if failure.type == "exit" and failure.message is None:
        code = failure.exit_code
        if code is not None and 128 < code < 128 + 65:  # a shell's code for a signal: 139 is SIGSEGV
            try:
                return f"the script was killed by {signal.Signals(code - 128).name} (exit code {code})"
            except ValueError:
                pass
        return f"the script exited with code {code}"
    if failure.type == "exit":  # sys.exit("message"): Python printed the message and exited with 1
        return f"the script exited with code {failure.exit_code}: {failure.message}"
    return failure.message or ""


def first_line(text: str) -> str:
    """``text`` as one line: its first line that says something, marked where more follow (a message of many
    lines, a traceback pasted into one, belongs in the reports that show it whole)."""
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} … ({len(lines) - 1} more line{'s' if len(lines) > 2 else ''})"


#: Exit codes a shell gives a script ended by a signal that asks a program to stop (Ctrl-C, a termination request, a
#: closed terminal, Ctrl-\), which the launcher passes on to the job: a stop, not a failure.
STOPPED_EXIT_CODES = tuple(128 + sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT))


def _interrupted(failure: Failure) -> bool:
    """A KeyboardInterrupt in the script's own process (a worker's is that worker's end, not the user's stop)."""
    return failure.type == "KeyboardInterrupt" and failure.where != "worker"


def failure_is_stop(failure: Failure) -> bool:
    """The script was stopped (an interrupt, or a signal that asks a program to stop), not failing: the steps before
    it are measured all the same."""
    return _interrupted(failure) or (failure.type == "exit" and failure.message is None
                                     and failure.exit_code in STOPPED_EXIT_CODES)


def failure_headline(failure: Failure) -> str:
    """What happened, in the words a user expects."""
    if _interrupted(failure):
        return "the script was interrupted"
    return "the script was stopped" if failure_is_stop(failure) else "the script failed"


def failure_detail(failure: Failure) -> str:
    """The failure's one line: an exit's code or signal, an exception's type and message, and where it was."""
    if _interrupted(failure):
        return "KeyboardInterrupt (Ctrl-C or SIGINT)" + (f" while at {failure.location}" if failure.location else "")
    message = first_line(failure_message(failure))
    said = message if failure.type == "exit" else f"{failure.type}: {message}"
    if failure.cause == "peer-lost":
        said = ("it lost its connection to another rank of the job, which ended first (that rank's node, its "
                f"session or its log, says why; this error is the consequence): {said}")
    return said + (f"  at {failure.location}" if failure.location else "")


def missing_module_hint(failure: Failure, command: list[str]) -> str | None:
    """Where the script could not import a module that stallscope's own Python has: the command's ``python`` is
    another interpreter (the system's, another environment's), the commonest first run's mistake. None otherwise."""
    if failure.type != "ModuleNotFoundError" or not failure.message or not command:
        return None
    named = re.match(r"No module named '([\w.]+)'", failure.message)
    # only where the command is a Python itself: torchrun, accelerate or a shell script take other arguments
    if not named or not re.fullmatch(r"python[\d.]*", os.path.basename(command[0])):
        return None
    module = named.group(1).split(".")[0]
    try:
        here = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        here = False
    theirs = shutil.which(command[0]) or command[0]
    # not resolved through links: a virtual environment's python is a link to the interpreter it was made from,
    # which without the environment lacks its packages
    if not here or os.path.dirname(os.path.abspath(theirs)) == os.path.dirname(os.path.abspath(sys.executable)):
        return None
    return (f"the script's Python ({theirs}) cannot import {module}; stallscope's own Python has it: "
            f"stallscope run -- {shlex.join([sys.executable, *command[1:]])}")


def failure_place(failure: Failure) -> str:
    """The process it failed in: a DataLoader worker by its number, pid and loader, or the training process."""
    if failure.where != "worker" and failure.rank is not None:
        return f"rank {failure.rank}"
    if failure.where != "worker":
        return "the main process"
    pid = f" (pid {failure.pid})" if failure.pid is not None else ""
    loader = f"loader {failure.loader_id}" if failure.loader_id is not None else "a DataLoader"
    return f"worker {failure.worker}{pid} of {loader}"
