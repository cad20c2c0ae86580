"""How the script failed, from its recorded exceptions and exit code: in which process (the training process or a
DataLoader worker, with its pid) and at which line of the user's own code, not of torch's internals.

torch re-raises a worker's exception in the training process from ``torch/_utils.py`` as ``Caught X in DataLoader
worker process N.`` followed by the worker's traceback: the worker's own record is the failure, and where it was
lost the failure is read back out of that message.
"""

from __future__ import annotations

import os
import re

import stallscope
from stallscope.analysis.findings import Failure
from stallscope.analysis.frameworks import is_user_file
from stallscope.session import ErrorRecord, Session

_HEADER = "Traceback (most recent call last):"
_FRAME = re.compile(r'^  File "(?P<file>.+)", line (?P<line>\d+)(?:, in .*)?$')
#: torch's ExceptionWrapper: where the exception was caught, then the original traceback.
_WRAPPED = re.compile(r"^Caught (?P<type>\S+) in (?P<place>[^\n]+?)\.\nOriginal (?P<traceback>"
                      + re.escape(_HEADER) + r"\n.*)$", re.DOTALL)
_WORKER_PLACE = re.compile(r"DataLoader worker process (\d+)")
_OWN_CODE = os.path.dirname(os.path.abspath(stallscope.__file__)) + os.sep


def frames_and_tail(traceback: str) -> tuple[list[tuple[str, int]], str]:
    """The (file, line) frames of a formatted traceback's last block (the exception raised, after any chained
    ones), outermost first, and the text after them (the exception's ``Type: message`` lines). A traceback cut at
    its start (a recorder keeps its last few thousand characters) is read from its first frame."""
    frames: list[tuple[str, int]] = []
    tail: list[str] = []
    in_frames = not traceback.startswith(_HEADER) and traceback.startswith("  ")
    for line in traceback.splitlines():
        if line == _HEADER:
            frames, tail, in_frames = [], [], True
        elif in_frames and line.startswith("  "):
            if found := _FRAME.match(line):
                frames.append((found["file"], int(found["line"])))
        else:
            in_frames = False
            tail.append(line)
    return frames, "\n".join(tail)


def user_location(traceback: str | None) -> str | None:
    """``file:line`` of the innermost frame in the user's own code (not the standard library, site-packages, the
    frameworks nor stallscope itself); None where the traceback has none."""
    frames, _ = frames_and_tail(traceback or "")
    for path, line in reversed(frames):
        if is_user_file(path) and not os.path.abspath(path).startswith(_OWN_CODE):
            return f"{path}:{line}"
    return None


def _unwrapped(message: str) -> tuple[str, str, str, int | None] | None:
    """(type, message, traceback, worker) of the original exception torch wrapped in ``message`` (worker None
    where it was caught elsewhere, such as the pin-memory thread); None for any other message."""
    found = _WRAPPED.match(message)
    if not found:
        return None
    _, tail = frames_and_tail(found["traceback"])
    kind = found["type"]
    # "Type: message", the type qualified (module.Error) where it is not a builtin; "Type" alone for no message
    said = re.sub(rf"^(?:[\w.]*\.)?{re.escape(kind)}(?:: |:?$)", "", tail.strip(), count=1, flags=re.MULTILINE)
    worker = _WORKER_PLACE.fullmatch(found["place"])
    return kind, said.strip(), found["traceback"], int(worker.group(1)) if worker else None


def _located(error: ErrorRecord) -> str | None:
    return user_location(error.traceback) or error.location


def _the_worker_error(worker_errors: list[ErrorRecord], named: int | None) -> ErrorRecord:
    """The worker error the job failed of: the one torch named in the training process, else the first."""
    chosen = [e for e in worker_errors if e.worker == named] if named is not None else []
    return min(chosen or worker_errors, key=lambda e: e.t_ns)


#: A distributed backend's words for a connection to another rank that went away (gloo's pair, NCCL's watchdog,
#: the c10d store), as opposed to an error of the rank's own.
_BACKEND = re.compile(r"gloo|nccl|c10d|ProcessGroup|TCPStore", re.IGNORECASE)
_LOST = re.compile(r"(reset|closed) by peer|broken pipe|connection refused|remote process exited|"
                   r"communicator was aborted|peer (closed|disconnected)", re.IGNORECASE)


def peer_lost(message: str) -> bool:
    """The error says the rank lost its connection to another rank (which ended first)."""
    return bool(_BACKEND.search(message) and _LOST.search(message))


def _job_errors(session: Session, errors: list[ErrorRecord]) -> list[ErrorRecord]:
    """The uncaught exceptions that say how the job failed, the training process's first: a wrapper's own error
    (``CalledProcessError``) only passes on its child's. An exception in another program the script started (a
    probe, a converter) is the job's failure only where the job failed and nothing closer is known."""
    own = [e for e in errors if e.pid in (session.main_pid, session.launched_pid)]
    if own:
        return sorted(own, key=lambda e: (e.pid != session.main_pid, e.t_ns))
    return errors if session.exit_code != 0 else []


def failure(session: Session) -> Failure | None:
    """How the script failed, or None where it did not (exit code 0 and no exception)."""
    # Ctrl-C reaches the workers too (one process group): their KeyboardInterrupt is not a failure of theirs.
    worker_errors = [e for e in session.errors if e.where == "worker" and e.type != "KeyboardInterrupt"]
    in_main = [e for e in session.errors if e.where == "main" and e.type != "SystemExit"]
    main_errors = _job_errors(session, in_main)
    ranks = {r.pid: r.rank for r in session.ranks}
    # a distributed job failed of the rank that failed first on its own: not of a rank that then lost its connection
    # to it, nor of the launcher's ChildFailedError (torchrun may end the other ranks before they record theirs)
    first = min((e for e in in_main if e.pid in ranks and not peer_lost(e.message or "")), key=lambda e: e.t_ns,
                default=None)
    if first is not None:
        main_errors = [first, *(e for e in main_errors if e is not first)]
    wrapped = _unwrapped(main_errors[0].message) if main_errors else None
    if worker_errors:
        e = _the_worker_error(worker_errors, wrapped[3] if wrapped else None)
        return Failure("worker", e.type, e.message, _located(e), e.loader_id, e.worker, pid=e.pid,
                       traceback=e.traceback)
    if main_errors:
        e = main_errors[0]
        if wrapped is not None:  # the worker's own record was lost (or made before workers recorded theirs)
            kind, message, traceback, worker = wrapped
            location = user_location(traceback) or _innermost(traceback)
            if worker is not None:
                loaders = {ld.loader_id for ld in session.loaders}
                return Failure("worker", kind, message, location, loaders.pop() if len(loaders) == 1 else None,
                               worker, traceback=traceback)
            return Failure("main", kind, message, location, pid=e.pid, traceback=traceback)
        rank = ranks.get(e.pid)
        cause = "peer-lost" if rank is not None and peer_lost(e.message or "") else None
        return Failure("main", e.type, e.message, _located(e), pid=e.pid, traceback=e.traceback, cause=cause,
                       rank=rank)
    if session.exit_code != 0:
        # sys.exit("message"): Python prints the message and exits with 1; the recorder kept it
        exits = [e for e in session.errors if e.type == "SystemExit" and e.pid == session.main_pid]
        if exits and session.exit_code == 1:
            e = exits[-1]
            return Failure("main", "exit", e.message, _located(e), exit_code=1, pid=e.pid, traceback=e.traceback)
        return Failure("main", "exit", None, None, exit_code=session.exit_code)
    return None


def _innermost(traceback: str) -> str | None:
    frames, _ = frames_and_tail(traceback)
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else None
