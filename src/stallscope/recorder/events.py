"""Per-process event files: buffered appends, periodic flush, safe across fork.

Each process that records anything writes ``events/<pid>.jsonl`` in the run directory, then, every
``SEGMENT_BYTES``, a next segment ``events/<pid>.<n>.jsonl``: the launcher folds finished segments into
per-window figures as the run goes (``folding.py``), so a run of days leaves bounded raw events. Each
segment's first line is a header (pid, parent pid, clocks, segment number); every later line is a JSON array of up to
``RECORDS_PER_LINE`` records, each ``[kind, ...fields]`` (one encoder call per line costs a
third of one per record, and this runs in the training process). Appends only touch an in-memory
list; the list is written out when it grows past a size or an age, at process exit, and from
multiprocessing's finalizers (which run in DataLoader workers where ``atexit`` does not). A crash
loses at most the unflushed tail.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from stallscope.background import start_thread
from stallscope.oserrors import os_error_words
from stallscope.settings import ENV_RANK_PID, ENV_SEGMENT_BYTES

#: Small on purpose: buffered records that outlive a young-generation collection make Python's
#: garbage collector traverse them again (512 doubled the gen-1 collection time of a toy loop).
FLUSH_EVERY_RECORDS = 64
FLUSH_EVERY_NS = 500_000_000
#: Records per written line: a process killed in the middle of a write loses at most one line.
RECORDS_PER_LINE = 64
#: A segment's size: small enough that a finished one is folded within a minute at the busiest rate measured
#: (tiny steps), large enough that a file a segment costs nothing.
SEGMENT_BYTES = 8 << 20
_encode = json.JSONEncoder(default=repr, separators=(",", ":")).encode

_run_dir: Path | None = None
_buffer: list[tuple[Any, ...]] = []
_pid: int = -1
_file: TextIO | None = None
_last_flush_ns = 0
_flush_lock = threading.Lock()
_role = "main"
_background_flusher = False  # this process runs start_background_flusher's thread
_process_hooks = False  # flush at exit and the fork handler are registered (once per process)
_segment = 0  # this process's segment being written
_segment_bytes = 0  # written into it
_segment_limit = SEGMENT_BYTES


def configure(run_dir: str | os.PathLike[str], role: str = "main") -> None:
    """Point this process's events at ``run_dir``; called once by the bootstrap (and by tests, which
    end with :func:`reset`). The exit flush and the fork handler are registered once per process."""
    global _run_dir, _role, _process_hooks, _file, _pid, _last_flush_ns, _segment, _segment_bytes, _segment_limit
    _run_dir = Path(run_dir)
    _role = role
    _buffer.clear()
    _segment, _segment_bytes = 0, 0
    try:
        _segment_limit = max(4096, int(os.environ.get(ENV_SEGMENT_BYTES) or SEGMENT_BYTES))
    except ValueError:
        _segment_limit = SEGMENT_BYTES
    _file, _pid, _last_flush_ns = None, -1, time.perf_counter_ns()
    if not _process_hooks:
        atexit.register(flush)
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _process_hooks = True


def reset() -> None:
    """Stop recording in this process: unflushed records are dropped and the event file is closed."""
    global _run_dir, _file, _pid
    _run_dir = None
    _buffer.clear()
    if _file is not None:
        try:
            _file.close()
        except OSError:
            pass
    _file, _pid = None, -1


def set_role(role: str) -> None:
    """Name what this process is (``main``, ``worker``); written in the header of its file."""
    global _role
    _role = role
    emit("role", role)


def enabled() -> bool:
    return _run_dir is not None


def emit(*record: Any) -> None:
    """Append one record. The hot path: a list append and, rarely, a flush. Where the background
    flusher runs, it alone flushes by age (no clock read per record)."""
    if _run_dir is None:
        return
    _buffer.append(record)
    if len(_buffer) >= FLUSH_EVERY_RECORDS or (
            not _background_flusher and time.perf_counter_ns() - _last_flush_ns > FLUSH_EVERY_NS):
        flush()


def append(*record: Any) -> None:
    """Append one record without ever flushing: for code that may run inside a flush (a finalizer the garbage
    collector calls while ``flush`` holds its lock, which is not re-entrant). The next ``emit`` or the exit
    writes it."""
    if _run_dir is not None:
        _buffer.append(record)


def segment_name(pid: int, segment: int) -> str:
    """The file name of a process's ``segment``: the first keeps the name it had before there were segments."""
    return f"{pid}.jsonl" if segment == 0 else f"{pid}.{segment}.jsonl"


def _open_file() -> TextIO:
    global _file, _pid, _last_flush_ns, _segment_bytes
    assert _run_dir is not None
    _pid = os.getpid()
    events_dir = _run_dir / "events"
    events_dir.mkdir(exist_ok=True)  # never the run's folder above it: a script that deleted it keeps it deleted
    _file = open(events_dir / segment_name(_pid, _segment), "a", encoding="utf-8")
    _segment_bytes = 0
    header = {
        "pid": _pid,
        "ppid": os.getppid(),
        "role": _role,
        "argv": sys.argv[:8],
        "wall_ns": time.time_ns(),
        "mono_ns": time.perf_counter_ns(),
        "owner": os.environ.get(ENV_RANK_PID),  # the rank process this one works for, if any
        "segment": _segment,
    }
    _file.write(json.dumps({"header": header}) + "\n")
    _last_flush_ns = time.perf_counter_ns()
    return _file


def flush(wait_s: float | None = None) -> None:
    """Write the buffer out. Safe to call from any thread and at exit.

    ``wait_s``: wait at most that long for the lock, else skip: for signal handlers and ``os._exit``, which
    can run in the main thread while it is inside ``flush`` itself (the lock is not re-entrant)."""
    global _last_flush_ns, _segment_bytes
    if _run_dir is None or not _buffer:
        return
    lock = _flush_lock
    if not lock.acquire(timeout=-1 if wait_s is None else wait_s):
        return
    try:
        records = _buffer[:]
        del _buffer[: len(records)]
        try:
            out = _file
            if out is None or _pid != os.getpid():
                out = _open_file()
            text = "".join(_encode(records[i:i + RECORDS_PER_LINE]) + "\n"
                           for i in range(0, len(records), RECORDS_PER_LINE))
            out.write(text)
            out.flush()
            _segment_bytes += len(text)
            if _segment_bytes >= _segment_limit:
                _next_segment(out)
        except OSError as exc:
            _write_failed(exc)
        except ValueError:  # interpreter teardown closed the file: losing the tail is the contract
            pass
        _last_flush_ns = time.perf_counter_ns()
    finally:
        lock.release()


def _next_segment(finished: TextIO) -> None:
    """Close the segment being written; the next flush opens the next one (the folder may now fold this one)."""
    global _file, _segment
    _segment += 1
    _file = None
    finished.close()


#: How long an ending path (a fatal signal's handler, ``os._exit``) waits for a flush in progress.
ENDING_FLUSH_WAIT_S = 1.0
_warned_write = False


def _write_failed(exc: OSError) -> None:
    """Events that cannot be written are lost; say so once per process (a full disk must not pass
    silently), except when the run directory was removed under us (the run is over)."""
    global _warned_write
    if _warned_write or exc.errno == errno.ENOENT:
        return
    _warned_write = True
    try:
        where = _run_dir / "events" / f"{os.getpid()}.jsonl" if _run_dir is not None else None
        sys.stderr.write(f"stallscope: events of process {os.getpid()} could not be written "
                         f"({os_error_words(exc, where)}); the session will miss them\n")
    except (OSError, ValueError):
        pass


def start_background_flusher(period_s: float = FLUSH_EVERY_NS / 1e9) -> None:
    """Flush every ``period_s`` even when nothing new is appended, so a process killed outright
    (SIGKILL, the OOM killer) loses at most that much. A daemon thread that sleeps almost always."""

    global _background_flusher

    def loop() -> None:
        pid = os.getpid()
        while os.getpid() == pid:
            time.sleep(period_s)
            flush()

    start_thread(loop, "stallscope-flush")
    _background_flusher = True


def flush_at_process_exit() -> None:
    """Flush when a multiprocessing child ends: such children leave through ``os._exit``, skipping
    ``atexit``, but run multiprocessing's finalizers. Call it once the child is running (the
    registry is cleared when a child starts, so registering at fork time would be lost)."""
    import multiprocessing.util

    multiprocessing.util.Finalize(None, flush, exitpriority=100)


def _after_fork_in_child() -> None:
    """A forked child inherits the parent's unflushed records; they are the parent's, not ours."""
    global _file, _pid, _flush_lock, _background_flusher, _segment
    _background_flusher = False  # threads do not survive a fork
    _buffer.clear()
    _file, _segment = None, 0
    _pid = -1
    _flush_lock = threading.Lock()
