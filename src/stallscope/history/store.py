"""Run history in SQLite: one ``RunRow`` (``runs.py``) per run.

The database lives in the store directory next to ``runs/``. Several ``stallscope run`` processes may
finish at the same moment and write the same file, so it runs in WAL mode with a busy timeout and
every insert is one ``BEGIN IMMEDIATE`` transaction. This module knows SQLite and nothing of sessions
or analyses: it stores and returns rows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from stallscope import paths
from stallscope.constants import HISTORY_FILENAME
from stallscope.history.runs import RunRow

SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0
#: The files SQLite keeps beside a database: its write-ahead log, the log's index, a rollback journal.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "TEXT PRIMARY KEY"),
    ("recorded_at", "REAL NOT NULL"),
    ("started_wall", "REAL"),
    ("command", "TEXT NOT NULL"),  # JSON list
    ("cwd", "TEXT"),
    ("overrides", "TEXT NOT NULL"),  # JSON object
    ("environment", "TEXT NOT NULL"),  # JSON object
    ("env_fingerprint", "TEXT"),
    ("git_commit", "TEXT"),
    ("exit_code", "INTEGER"),
    ("ended_by", "TEXT"),
    ("verdict", "TEXT"),
    ("bottleneck", "TEXT"),
    ("steps", "INTEGER"),
    ("steady_steps", "INTEGER"),
    ("wall_s", "REAL"),
    ("step_median_s", "REAL"),
    ("step_p90_s", "REAL"),
    ("steps_per_s", "REAL"),
    ("samples_per_s", "REAL"),
    ("data_wait_fraction", "REAL"),
    ("node_seconds", "TEXT NOT NULL"),  # JSON object
    ("gpu_util_mean", "REAL"),
    ("peak_device_mem_bytes", "INTEGER"),
    ("peak_rss_bytes", "INTEGER"),
    ("step_detail", "TEXT NOT NULL"),  # JSON: {"duration_us": [...], "wait_us": [...], "samples": [...]}
    ("session_path", "TEXT"),
)
_JSON_COLUMNS = {"command", "overrides", "environment", "node_seconds", "step_detail"}


class HistoryError(RuntimeError):
    """The history cannot be read or written (unknown run, newer schema, unreadable file). ``damaged``: the
    file is not a readable database, and ``rebuild_history`` can make it again from the saved sessions."""

    def __init__(self, message: str, damaged: bool = False) -> None:
        super().__init__(message)
        self.damaged = damaged


_DAMAGED = ("file is not a database", "malformed", "corrupt")
_READ_ONLY = ("readonly", "read-only", "unable to open", "access permission")


def _explained(path: Path, exc: sqlite3.Error, writing: bool = True) -> HistoryError:
    """The error in words, with what to do about it. ``writing``: whether the history was being written (a run
    recorded) or only read (``history``, ``compare``), which decides the permissions it needs."""
    text = str(exc)
    if any(word in text for word in _DAMAGED):
        return HistoryError(f"the run history {path} is damaged ({text}); rebuild it from the saved sessions "
                            f"with: stallscope history --rebuild --store {path.parent}", damaged=True)
    if _out_of_room(path, exc):
        return _full(path)
    if path.is_dir():
        return _a_folder(path)
    if any(word in text for word in _READ_ONLY):
        if fix := _permission_fix(path, writing):
            return HistoryError(f"the run history {path} cannot be {'written' if writing else 'read'}: permission "
                                f"denied; {fix}, or choose another store with --store DIR")
        return HistoryError(f"the run history {path} cannot be written ({text}): make it and its folder writable "
                            f"(chmod u+w {path} {path.parent}), or choose another store with --store DIR")
    return HistoryError(f"run history {path}: {text}")


def _out_of_room(path: Path, exc: sqlite3.Error) -> bool:
    """SQLite says "database or disk is full" for a full disk, but only "disk I/O error" where growing its -shm
    index or -wal log ran out of room: that one counts as a full disk where the disk has (almost) no room left."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name.startswith("SQLITE_FULL") or "database or disk is full" in str(exc):
        return True
    return (name.startswith("SQLITE_IOERR") or "disk I/O error" in str(exc)) and paths.disk_full(path)


def _a_folder(path: Path) -> HistoryError:
    """A folder where the history's file should be: no permission opens a folder as a database."""
    return HistoryError(f"the run history {path} is a folder, not a file: move it out of the way (mv "
                        f"{shlex.quote(str(path))} {shlex.quote(str(path) + '.folder')}), or choose another store with "
                        "--store DIR")


def _full(path: Path) -> HistoryError:
    return HistoryError(f"the run history {path} cannot be written: the disk holding it is full; free some space "
                        "there, or choose another store with --store DIR")


def _permission_fix(path: Path, writing: bool) -> str | None:
    """The chmod that gives back the access the permission bits deny (reading needs the file readable, writing
    needs it readable and writable and its folder writable, for SQLite's -wal and -shm files beside it); None
    where the bits allow it and something else refuses (a read-only mount, a folder where the file should be)."""
    fixes = []
    if path.exists():
        wanted = (("r", os.R_OK), ("w", os.W_OK)) if writing else (("r", os.R_OK),)
        if missing := "".join(bit for bit, mode in wanted if not os.access(path, mode)):
            fixes.append(f"chmod u+{missing} {path}")
    folder_wanted = (("w", os.W_OK), ("x", os.X_OK)) if writing else (("x", os.X_OK),)
    if missing := "".join(bit for bit, mode in folder_wanted if not os.access(path.parent, mode)):
        fixes.append(f"chmod u+{missing} {path.parent}")
    return f"give yourself access with: {' && '.join(fixes)}" if fixes else None


def history_path(store_dir: str | os.PathLike[str]) -> Path:
    return Path(store_dir) / HISTORY_FILENAME


# --- database ------------------------------------------------------------------------------------

def _open(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:  # switching to WAL takes a lock that the busy handler does not always wait for
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            break
        except sqlite3.OperationalError as exc:
            # Only a lock is worth waiting for; a file or folder we cannot write will not become writable.
            if time.monotonic() > deadline or not any(word in str(exc) for word in ("locked", "busy")):
                conn.close()
                raise
            time.sleep(0.05)
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _ensure_schema(conn: sqlite3.Connection) -> None:
    with _transaction(conn):
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        version = row[0] if row else None
        if version is None:
            columns = ", ".join(f"{name} {kind}" for name, kind in _COLUMNS)
            conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({columns})")
            conn.execute("CREATE INDEX IF NOT EXISTS runs_started ON runs (started_wall)")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        elif version > SCHEMA_VERSION:
            raise HistoryError(f"the history was written by a newer stallscope (schema {version}, "
                               f"this one reads {SCHEMA_VERSION})")


def _refuse_foreign(path: Path) -> None:
    """Never take another program's SQLite database for the history: switching it to WAL and adding our tables
    would change a file that is not ours. An empty file, or a database with no tables yet, is one SQLite made for
    us (then the disk filled up); a file that is not SQLite at all is left to the damaged-history path (rebuild
    keeps it aside)."""
    try:
        if path.stat().st_size == 0:
            return
        conn = _open_read_only(path)
    except (OSError, sqlite3.Error):
        return
    try:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return
    finally:
        conn.close()
    if tables and not {"schema_version", "runs"} <= tables:
        shown = ", ".join(sorted(tables)[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
        raise HistoryError(f"{path} is an SQLite database of another program (tables {shown}), not a stallscope "
                           "history: stallscope leaves it as it is; move it out of the store, or choose another "
                           "store with --store DIR")


@contextmanager
def _connect(store_dir: str | os.PathLike[str], create: bool) -> Iterator[sqlite3.Connection]:
    try:
        path = paths.store_path(store_dir, HISTORY_FILENAME)
        for suffix in SQLITE_SIDE_FILES:  # SQLite writes these beside the database, through any link
            paths.store_path(store_dir, HISTORY_FILENAME + suffix)
    except paths.OutsideStoreError as exc:
        raise HistoryError(str(exc)) from None
    if path.exists():
        _refuse_foreign(path)
    if not create and not path.is_file():
        if problem := paths.store_is_a_file(Path(store_dir)):
            raise HistoryError(problem)
        if path.is_dir():
            raise _a_folder(path)
        raise HistoryError(f"no run history at {path} (record a run with: stallscope run -- python train.py)")
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = _open(path) if create or os.access(path, os.W_OK) else _open_read_only(path)
    except sqlite3.Error as exc:
        if create:
            raise _explained(path, exc) from None
        try:  # a history we may read but not write (a shared, read-only store) is still readable
            conn = _open_read_only(path)
        except sqlite3.Error:
            raise _explained(path, exc, writing=False) from None
    try:
        if create:
            _ensure_schema(conn)
        else:
            _check_schema(conn, path)
        yield conn
    except sqlite3.Error as exc:
        raise _explained(path, exc, writing=create) from None
    finally:
        conn.close()


def _open_read_only(path: Path) -> sqlite3.Connection:
    """Read without writing the database: ``mode=ro`` still sees the write-ahead log (recent runs); where
    even its -shm index cannot be made (a read-only folder or mount), the file is read as it stands."""
    uri = path.resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.OperationalError:
        return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=BUSY_TIMEOUT_S)


def _check_schema(conn: sqlite3.Connection, path: Path) -> None:
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").fetchone() is None:
        # The file is there but its tables are not: SQLite made it, then could not write them (a full disk).
        if paths.disk_full(path):
            raise _full(path)
        if any((path.parent / "runs").glob("*/session.json")):  # its runs are there: the history lost them
            raise HistoryError(f"the run history at {path} holds no runs, but {path.parent / 'runs'} does: "
                               "rebuild it from them with: stallscope history --rebuild")
        raise HistoryError(f"no run history at {path} yet: the file holds no runs (record a run with: "
                           "stallscope run -- python train.py)")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    version = row[0] if row else None
    if version is not None and version > SCHEMA_VERSION:
        raise HistoryError(f"the history was written by a newer stallscope (schema {version}, "
                           f"this one reads {SCHEMA_VERSION})")


def insert_row(store_dir: str | os.PathLike[str], values: dict[str, Any]) -> None:
    names = [name for name, _ in _COLUMNS]
    params = [json.dumps(values.get(n)) if n in _JSON_COLUMNS else _text(values.get(n)) for n in names]
    sql = f"INSERT OR REPLACE INTO runs ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})"
    with _connect(store_dir, create=True) as conn, _transaction(conn):
        conn.execute(sql, params)


def _text(value: Any) -> Any:
    """``value`` as SQLite can store it: a path that is not valid UTF-8 (a folder named in another encoding; Python
    holds its bytes as surrogates) is kept with those bytes shown as U+FFFD instead of failing the whole row."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return value


def record_run(store_dir: str | os.PathLike[str], row: RunRow) -> None:
    """Add (or replace) the run's row in the store's history."""
    insert_row(store_dir, dataclasses.asdict(row))


def _row(record: sqlite3.Row) -> RunRow:
    values = {key: record[key] for key in record.keys()}
    for key in _JSON_COLUMNS:
        try:
            values[key] = json.loads(values[key]) if values[key] is not None else None
        except json.JSONDecodeError:
            values[key] = None
    values["command"] = values["command"] or []
    for key in ("overrides", "environment", "node_seconds", "step_detail"):
        values[key] = values[key] or {}
    return RunRow(**values)


def list_runs(store_dir: str | os.PathLike[str], *, command: str | None = None, verdict: str | None = None,
              git_commit_prefix: str | None = None, since: float | None = None, run_id_prefix: str | None = None,
              limit: int | None = None) -> list[RunRow]:
    """Runs oldest first; ``limit`` keeps the most recent ones. ``command`` matches a substring."""
    where: list[str] = []
    params: list[Any] = []
    if command:
        where.append("instr(command, ?) > 0")
        params.append(json.dumps(command)[1:-1])
    if verdict:
        where.append("verdict = ?")
        params.append(verdict)
    if git_commit_prefix:
        where.append("substr(git_commit, 1, ?) = ?")
        params.extend([len(git_commit_prefix), git_commit_prefix])
    if since is not None:
        where.append("started_wall >= ?")
        params.append(since)
    if run_id_prefix:
        where.append("substr(run_id, 1, ?) = ?")
        params.extend([len(run_id_prefix), run_id_prefix])
    sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY started_wall DESC, run_id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(int(limit))
    with _connect(store_dir, create=False) as conn:
        conn.row_factory = sqlite3.Row
        rows = [_row(r) for r in conn.execute(sql, params).fetchall()]
    return rows[::-1]


def get_run(store_dir: str | os.PathLike[str], ref: str) -> RunRow:
    """A run by id, unique id prefix, ``last`` or ``last~N`` (N runs before the last)."""
    if ref == "last" or ref.startswith("last~"):
        back = 0
        if ref != "last":
            # int() would take -1 (then LIMIT 0, or no LIMIT at all), ' 1' and '²' (an internal error)
            if not (ref[5:].isascii() and ref[5:].isdigit()):
                raise HistoryError(f"bad run reference {ref!r}: use last or last~N, N = 0, 1, 2, ... runs back")
            back = int(ref[5:])
        rows = list_runs(store_dir, limit=back + 1)
        if len(rows) <= back:
            raise HistoryError(f"no run {ref!r}: the history holds {len(rows)} run(s)")
        return rows[0]
    rows = list_runs(store_dir, run_id_prefix=ref)
    exact = [r for r in rows if r.run_id == ref]
    if exact:
        return exact[0]
    if len(rows) == 1:
        return rows[0]
    if rows:
        names = ", ".join(r.run_id for r in rows[:5])
        raise HistoryError(f"run id {ref!r} is ambiguous in the history: {names}")
    raise HistoryError(f"no run {ref!r} in the history at {history_path(store_dir)}")


def _set_aside(path: Path) -> Path:
    """Move ``path`` to ``NAME.before-rebuild-STAMP`` (``-2``, ``-3``... after it when two rebuilds share a
    second), never over an earlier copy: a hard link claims the name atomically, then the old name goes."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        kept = path.with_name(f"{path.name}.before-rebuild-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            os.link(path, kept)
        except FileExistsError:
            continue
        except OSError:  # a file system without hard links: the name is free now, take it the plain way
            if kept.exists():
                continue
            os.replace(path, kept)
            return kept
        os.unlink(path)
        return kept
    raise HistoryError(f"cannot keep the old history beside {path}: too many copies named {path.name}.before-rebuild-*")


def rebuild_history(store_dir: str | os.PathLike[str], rows: Iterator[RunRow]) -> tuple[int, Path | None]:
    """Make the history again from ``rows`` (read from the saved sessions by the caller): the old file, if
    any, is kept beside it as ``history.sqlite3.before-rebuild-STAMP`` (damaged or not). Returns (rows written,
    where the old went)."""
    path = history_path(store_dir)
    kept = _set_aside(path) if path.exists() else None
    if kept is not None:
        wal = Path(f"{path}-wal")
        if wal.exists():  # the old file's last commits travel with it
            os.replace(wal, Path(f"{kept}-wal"))
    written = 0
    for row in rows:
        record_run(store_dir, row)
        written += 1
    if not written:
        with _connect(store_dir, create=True):
            pass
    return written, kept
