"""Run history: one SQLite row per run, with the metrics a before/after comparison needs.

The database lives in the store directory next to ``runs/``. Several ``stallscope run`` processes may
finish at the same moment and write the same file, so it runs in WAL mode with a busy timeout and
every insert is one ``BEGIN IMMEDIATE`` transaction. The per-step durations of the steady steps are
kept in the row (thinned to at most ``MAX_KEPT_STEPS``) so ``compare`` can tell a real change from
run-to-run noise without the session files.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallscope.analyze import Analysis
from stallscope.session import Session

HISTORY_FILENAME = "history.sqlite3"
SCHEMA_VERSION = 1
MAX_KEPT_STEPS = 2000
BUSY_TIMEOUT_S = 30.0
GIT_TIMEOUT_S = 2.0

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
    """The history cannot be read or written (unknown run, newer schema, unreadable file)."""


@dataclass(frozen=True)
class RunRow:
    """One run of the history, as stored."""
    run_id: str
    recorded_at: float
    started_wall: float | None
    command: list[str]
    cwd: str | None
    overrides: dict[str, Any]
    environment: dict[str, Any]
    env_fingerprint: str | None
    git_commit: str | None
    exit_code: int | None
    ended_by: str | None
    verdict: str | None
    bottleneck: str | None
    steps: int | None
    steady_steps: int | None
    wall_s: float | None
    step_median_s: float | None
    step_p90_s: float | None
    steps_per_s: float | None
    samples_per_s: float | None
    data_wait_fraction: float | None
    node_seconds: dict[str, float]
    gpu_util_mean: float | None
    peak_device_mem_bytes: int | None
    peak_rss_bytes: int | None
    step_detail: dict[str, list[Any]]
    session_path: str | None

    @property
    def step_durations_s(self) -> list[float]:
        return [v / 1e6 for v in self.step_detail.get("duration_us", [])]

    @property
    def step_wait_fractions(self) -> list[float]:
        durations = self.step_detail.get("duration_us", [])
        waits = self.step_detail.get("wait_us", [])
        return [w / d if d > 0 else 0.0 for d, w in zip(durations, waits)]


def history_path(store_dir: str | os.PathLike[str]) -> Path:
    return Path(store_dir) / HISTORY_FILENAME


# --- metrics -------------------------------------------------------------------------------------

def _thin(values: list[Any], limit: int = MAX_KEPT_STEPS) -> list[Any]:
    """Evenly spaced subset: keeps the shape of a long run's distribution at a bounded size."""
    if len(values) <= limit:
        return list(values)
    return [values[i * len(values) // limit] for i in range(limit)]


def step_detail(analysis: Analysis) -> dict[str, list[Any]]:
    """Steady-step samples for compare's bootstrap, and per-rank figures of a distributed job."""
    steady = analysis.steps.steady
    detail: dict[str, list[Any]] = {
        "duration_us": _thin([round(s.duration_ns / 1000) for s in steady]),
        "wait_us": _thin([round(s.wait_ns / 1000) for s in steady]),
        "samples": _thin([s.samples for s in steady]),
    }
    if len(analysis.ranks) > 1:
        detail["ranks"] = [{"rank": r.rank, "steps_per_s": r.steps_per_s, "data_wait_fraction": r.data_wait_fraction,
                            "sync_fraction": r.sync_fraction, "verdict": r.verdict, "bottleneck": r.bottleneck_node}
                           for r in analysis.ranks]
    return detail


def _numbers(values: Any) -> list[float]:
    if not isinstance(values, list):
        return []
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def gpu_util_mean(samples: dict[str, Any]) -> float | None:
    """Mean over ticks and devices of ``samples["gpu"]["util_percent"]``; None when absent."""
    gpu = samples.get("gpu") if isinstance(samples, dict) else None
    if not isinstance(gpu, dict):
        return None
    values: list[float] = []
    for tick in gpu.get("util_percent") or []:
        values.extend(_numbers(tick if isinstance(tick, list) else [tick]))
    return sum(values) / len(values) if values else None


def peak_device_memory(samples: dict[str, Any]) -> int | None:
    """The highest memory in use on any one device at any tick (bytes); None when absent."""
    gpu = samples.get("gpu") if isinstance(samples, dict) else None
    if not isinstance(gpu, dict):
        return None
    values: list[float] = []
    for tick in gpu.get("mem_used_bytes") or []:
        values.extend(_numbers(tick if isinstance(tick, list) else [tick]))
    return int(max(values)) if values else None


def process_tree_rss(samples: dict[str, Any]) -> list[float | None]:
    """Summed RSS of every sampled process per tick (None at ticks where no process was sampled)."""
    if not isinstance(samples, dict):
        return []
    ticks = samples.get("t_ns")
    processes = samples.get("processes")
    if not isinstance(ticks, list) or not isinstance(processes, dict):
        return []
    totals: list[float | None] = [None] * len(ticks)
    for proc in processes.values():
        if not isinstance(proc, dict):
            continue
        first = proc.get("first", 0)
        first = first if isinstance(first, int) and first >= 0 else 0
        rss = proc.get("rss_bytes")
        if not isinstance(rss, list):
            continue
        for offset, value in enumerate(rss):
            i = first + offset
            if i < len(totals) and isinstance(value, (int, float)) and not isinstance(value, bool):
                totals[i] = (totals[i] or 0.0) + float(value)
    return totals


def peak_rss(samples: dict[str, Any]) -> int | None:
    values = [v for v in process_tree_rss(samples) if v is not None]
    return int(max(values)) if values else None


def git_commit(cwd: str | None) -> str | None:
    """HEAD of the repository the run started in (a ``+dirty`` suffix when tracked files changed)."""
    if not cwd or not Path(cwd).is_dir():
        return None
    try:
        head = subprocess.run(["git", "-C", cwd, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S)
        if head.returncode != 0:
            return None
        commit = head.stdout.strip() or None
        status = subprocess.run(["git", "-C", cwd, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
        if commit and status.returncode == 0 and status.stdout.strip():
            commit += "+dirty"
        return commit
    except (OSError, subprocess.SubprocessError):
        return None


def env_fingerprint(environment: dict[str, Any]) -> str:
    """A short hash of the environment, so runs on different machines or library versions stand out."""
    blob = json.dumps(environment, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _if_measured(value: float | None, measured: bool) -> float | None:
    """Rates and shares of a run without steady steps are unknown (null), never 0."""
    return value if measured and value is not None else None


def row_values(session: Session, analysis: Analysis, session_path: str | os.PathLike[str] | None,
               commit: str | None) -> dict[str, Any]:
    stats = analysis.steps
    measured = bool(stats.steady) and stats.wall_s > 0
    return {
        "run_id": session.run_id,
        "recorded_at": time.time(),
        "started_wall": session.started_wall,
        "command": list(session.command),
        "cwd": session.cwd,
        "overrides": dict(session.overrides),
        "environment": dict(session.environment),
        "env_fingerprint": env_fingerprint(session.environment),
        "git_commit": commit,
        "exit_code": session.exit_code,
        "ended_by": session.ended_by,
        "verdict": analysis.verdict,
        "bottleneck": analysis.bottleneck_node,
        "steps": len(stats.steps),
        "steady_steps": len(stats.steady),
        "wall_s": session.wall_s,
        "step_median_s": stats.median_step_s,
        "step_p90_s": stats.p90_step_s,
        "steps_per_s": _if_measured(analysis.steps_per_s, measured),
        "samples_per_s": _if_measured(analysis.samples_per_s, measured),
        "data_wait_fraction": _if_measured(analysis.data_wait_fraction, measured),
        "node_seconds": dict(analysis.node_seconds) if measured else {},
        "gpu_util_mean": gpu_util_mean(session.samples),
        "peak_device_mem_bytes": peak_device_memory(session.samples),
        "peak_rss_bytes": peak_rss(session.samples),
        "step_detail": step_detail(analysis),
        "session_path": str(session_path) if session_path else None,
    }


# --- database ------------------------------------------------------------------------------------

def _open(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:  # switching to WAL takes a lock that the busy handler does not always wait for
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            break
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
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


@contextmanager
def _connect(store_dir: str | os.PathLike[str], create: bool) -> Iterator[sqlite3.Connection]:
    path = history_path(store_dir)
    if not create and not path.is_file():
        raise HistoryError(f"no run history at {path} (record a run with: stallscope run -- python train.py)")
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = _open(path)
    except sqlite3.Error as exc:
        raise HistoryError(f"cannot open the run history {path}: {exc}") from None
    try:
        _ensure_schema(conn)
        yield conn
    except sqlite3.Error as exc:
        raise HistoryError(f"run history {path}: {exc}") from None
    finally:
        conn.close()


def insert_row(store_dir: str | os.PathLike[str], values: dict[str, Any]) -> None:
    names = [name for name, _ in _COLUMNS]
    params = [json.dumps(values.get(n)) if n in _JSON_COLUMNS else values.get(n) for n in names]
    sql = f"INSERT OR REPLACE INTO runs ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})"
    with _connect(store_dir, create=True) as conn, _transaction(conn):
        conn.execute(sql, params)


def record_run(store_dir: str | os.PathLike[str], session: Session, analysis: Analysis,
               session_path: str | os.PathLike[str] | None) -> None:
    """Add (or replace) the run's row in the store's history."""
    insert_row(store_dir, row_values(session, analysis, session_path, git_commit(session.cwd)))


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
            try:
                back = int(ref[5:])
            except ValueError:
                raise HistoryError(f"bad run reference {ref!r}: use last or last~N") from None
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


def row_from_session(session: Session, analysis: Analysis,
                     session_path: str | os.PathLike[str] | None) -> RunRow:
    """The row a run would have in the history, built in memory (for runs outside any history)."""
    values = row_values(session, analysis, session_path, git_commit(session.cwd))
    return RunRow(**values)


def record_run_or_warn(store: str | os.PathLike[str] | None, session: Session, analysis: Analysis,
                       session_path: str | os.PathLike[str] | None) -> bool:
    """``record_run`` for the end of ``stallscope run``: a history failure is a warning, never a failed run."""
    from stallscope import paths

    try:
        record_run(paths.store_dir(store), session, analysis, session_path)
        return True
    except Exception as exc:  # noqa: BLE001 - the run itself succeeded; the history is secondary
        print(f"stallscope run: warning: the run was not added to the history: {exc}", file=sys.stderr)
        return False
