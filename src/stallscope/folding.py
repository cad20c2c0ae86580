"""Fold a long run's raw events into per-window figures as it goes, keeping full detail only where it tells.

A run of days at ten steps a second writes gigabytes of raw events, and reading them back takes minutes and
memory in proportion. So the launcher folds them while the job runs (``Folder.poll``). The run's time is cut into
chunks (``CHUNK_NS``); a chunk closes once no process can still write into it (``LAG_NS``), and its records are
counted into its window's row of figures per process (steps, batches, samples, data wait, fetches,
forward/backward/optimizer time, epochs, stalls, errors). Windows are ``WINDOW_NS`` long, doubled with their
neighbours' rows merged whenever there would be more than ``MAX_WINDOWS``, so the rows stay bounded however long
the run. A closed chunk's records are kept in full only where they tell: the leading chunks (the first
``LEAD_RECORDS`` records), chunks holding an anomaly (a later epoch's start, a stall, an error, a step
``SLOW_STEP_FACTOR`` times the recent ones; up to ``ANOMALY_RECORDS``) and the trailing chunks (the last
``TRAIL_RECORDS``); the others' detail is dropped once later chunks push them out of the trailing ones, and their
spans are listed as folded. Raw segments (``recorder/events.py``) whose records all lie in closed chunks are
deleted. Records that say what the run is (a loader, an epoch, an error, a rank) are always kept.

Everything lives in the run's ``folded/`` folder, written so that a launcher killed at any moment leaves a state
that reads back whole: ``state.json`` (replaced atomically) names the chunks closed so far; a chunk's kept records
are in its own folder, written before the state names it; the always-kept records are appended tagged with their
chunk, and read back only for closed ones; records of chunks not yet closed are still in the raw segments, and
:func:`read_run` takes from those only what lies beyond the closed chunks, folding it in memory without writing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stallscope.background import start_thread
from stallscope.paths import write_file
from stallscope.recorder.schema import EVENT_FIELDS
from stallscope.settings import ENV_FOLDING

WINDOW_NS = 10_000_000_000
CHUNK_NS = 1_000_000_000
MAX_WINDOWS = 1024
#: A kept entry (a folder of records) takes in the next chunk kept for the same reason up to this many records.
GROUP_RECORDS = 4000
#: A chunk closes once the clock is this far past its end: processes write their records out at least every half
#: second (``recorder/events.py``), so none can still arrive for it but from a process stalled that long.
LAG_NS = 5_000_000_000
#: How often the launcher reads what the processes wrote: the records it parsed wait in memory until their chunk
#: closes (``LAG_NS`` later), so a shorter period holds fewer of them at once (docs/calibration.md, fold-period).
PERIOD_S = 2.0
#: The fold state (every window's figures, what is kept) is written whole at most this often, and at the end: raw
#: segments and dropped detail are deleted only once a saved state covers them, so a kill loses nothing, and the
#: short ``PERIOD_S`` costs no write of a state that grows with the run at every poll (docs/calibration.md,
#: fold-period).
STATE_SAVE_NS = 10_000_000_000
LEAD_RECORDS = 30_000
TRAIL_RECORDS = 30_000
ANOMALY_RECORDS = 15_000
SLOW_STEP_FACTOR = 4.0
#: Record kinds written per step or per batch: what a window's figures sum up, and what folding drops.
HIGH_VOLUME = frozenset({"next", "fetch", "send", "opt", "fwd", "bwd", "pin", "h2d", "gpu_span", "coll", "ddp_wait",
                         "ddp", "stack_samples", "step_samples", "threads_info", "gc", "batch_bytes"})
#: Fields that date a record, in order of preference; a record without any takes the time of the one before it.
_TIME_FIELDS = ("start_ns", "t_ns", "created_ns", "started_ns", "launched_ns")
_SEGMENT = re.compile(r"^(\d+)(?:\.(\d+))?\.jsonl$")
FOLDED_DIR = "folded"
STATE_FILE = "state.json"
#: The launcher's system samples so far (``SystemSampler.snapshot``), replaced every ``SAMPLES_SAVE_S``: what a
#: launcher killed mid-run leaves of them to ``report``.
SAMPLES_FILE = "system_samples.json"
SAMPLES_SAVE_S = 30.0


def _position(kind: str, name: str) -> int | None:
    """Where a field of an event kind sits in its record (``recorder/schema.py``): the kind is at 0."""
    names = EVENT_FIELDS.get(kind, ())
    return names.index(name) + 1 if name in names else None


#: kind -> the position of the field that dates it (the first of ``_TIME_FIELDS`` it has), read by position
#: because this runs for every record of a run.
_TIME_AT: dict[str, int] = {kind: at for kind in EVENT_FIELDS
                            if (at := next((p for n in _TIME_FIELDS if (p := _position(kind, n))), None))}
def _at(kind: str, name: str) -> int:
    at = _position(kind, name)
    if at is None:
        raise KeyError(f"recorder/schema.py names no {name} in {kind} events")
    return at


#: the positions ``_count`` reads, per kind
_START = {kind: _at(kind, "start_ns") for kind in ("next", "opt", "fetch", "fwd", "bwd")}
_END = {kind: _at(kind, "end_ns") for kind in _START}
_BATCH_SIZE = _at("next", "batch_size")
_FETCH_CPU = _at("fetch", "cpu_ns")
_H2D_BYTES = _at("h2d", "nbytes")
_GC_NS = _at("gc", "total_ns")
_GC_COUNT = _at("gc", "collections")
_GC_LONGEST = _at("gc", "longest_ns")
_BATCH_BYTES = _at("batch_bytes", "nbytes")


def record_time(record: list[Any]) -> int | None:
    at = _TIME_AT.get(record[0])
    if at is None or len(record) <= at:
        return None
    value = record[at]
    return value if type(value) is int else None


def segment_of(path: Path) -> tuple[int, int] | None:
    """(pid, segment) of a raw event file's name; None for any other file."""
    match = _SEGMENT.match(path.name)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def parse_lines(lines: Iterable[bytes | str]) -> tuple[dict[str, Any] | None, list[list[Any]], int]:
    """(header, records, damaged lines) of event-file lines: a line of records, one record, or the header."""
    header: dict[str, Any] | None = None
    records: list[list[Any]] = []
    damaged = 0
    for line in lines:
        try:
            item = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            damaged += 1
            continue
        if isinstance(item, dict) and "header" in item:
            header = header or item["header"]
        elif isinstance(item, list) and item:
            if isinstance(item[0], list):
                records.extend(r for r in item if isinstance(r, list) and r)
            else:
                records.append(item)
    return header, records, damaged


@dataclass(frozen=True)
class Limits:
    """The folding's sizes; tests shrink them through ``ENV_FOLDING`` ("window_ms=500,lead=2000,samples_ms=500,..."),
    so that a run of seconds folds as one of days would."""
    window_ns: int = WINDOW_NS
    chunk_ns: int = CHUNK_NS
    lead: int = LEAD_RECORDS
    trail: int = TRAIL_RECORDS
    anomaly: int = ANOMALY_RECORDS
    period_s: float = PERIOD_S
    lag_ns: int = LAG_NS
    samples_s: float = SAMPLES_SAVE_S
    state_ns: int = STATE_SAVE_NS

    @classmethod
    def from_env(cls) -> Limits:
        values: dict[str, Any] = {}
        for item in os.environ.get(ENV_FOLDING, "").split(","):
            name, _, value = item.partition("=")
            with contextlib.suppress(ValueError):
                if name in ("window_ms", "chunk_ms"):
                    values[name.replace("_ms", "_ns")] = int(float(value) * 1e6)
                elif name in ("lead", "trail", "anomaly"):
                    values[name] = int(value)
                elif name in ("period_ms", "samples_ms"):
                    values[name.replace("_ms", "_s")] = float(value) / 1e3
                elif name in ("lag_ms", "state_ms"):
                    values[name.replace("_ms", "_ns")] = int(float(value) * 1e6)
        return cls(**values)


@dataclass
class _Tail:
    """One raw segment, read up to its last whole line."""
    path: Path
    pid: int
    segment: int
    offset: int = 0
    last_ns: int | None = None  # the latest record time read from it
    header: dict[str, Any] | None = None

    def read(self, whole: bool) -> tuple[list[list[Any]], int]:
        """(records, damaged lines) appended since the last read; ``whole``: the writer has ended, so a last line
        without its end is read too (and counted as damaged)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return [], 0
        end = len(chunk) if whole else chunk.rfind(b"\n") + 1
        self.offset += end
        header, records, damaged = parse_lines(chunk[:end].splitlines())
        self.header = self.header or header
        return records, damaged

    def last_write_ns(self) -> int | None:
        """When the process last wrote this file, on its monotonic clock (the header maps wall to monotonic)."""
        if self.header is None:
            return None
        try:
            return int(self.header["mono_ns"]) + self.path.stat().st_mtime_ns - int(self.header["wall_ns"])
        except (OSError, KeyError, TypeError, ValueError):
            return None


@dataclass
class _StepState:
    """A process's step rule (``recorder/steps.py``): a step ends at an optimizer step after a batch."""
    batches_since: int = 0
    saw_optimizer: bool = False
    last_end_ns: int | None = None
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=64))
    typical: float | None = None  # the median of ``recent``, renewed every 8 steps (a median a step would cost)
    since_typical: int = 0
    gc_ns: int = 0  # the process's garbage collection totals last seen (recorder/gc_timing.py)
    gc_count: int = 0


#: A window's figures that are also summed over the folded spans (``Session.recording``'s ``folded_counts``).
_COUNTED = ("steps", "batches", "samples", "wait_ns", "step_ns")


def _new_row(pid: int, start: int, end: int) -> dict[str, Any]:
    return {"pid": pid, "start_ns": start, "end_ns": end, "steps": 0, "batches": 0, "samples": 0,
            "samples_known": True, "wait_ns": 0, "step_ns": 0, "max_step_ns": 0, "fetches": 0, "fetch_ns": 0,
            "fetch_cpu_ns": 0, "forward_ns": 0, "backward_ns": 0, "optimizer_ns": 0, "h2d_bytes": 0, "epochs": 0,
            "stalls": 0, "errors": 0, "records": 0, "gc_ns": 0, "gc_collections": 0,
            "gc_longest_ns": 0, "batch_bytes": 0, "batches_sized": 0}


class Folder:
    """The folding of one run directory. ``persist``: write ``folded/`` and delete folded raw segments (the
    launcher); otherwise everything stays in memory and the run directory is only read (a report on a run still
    going, or one rebuilt after a kill)."""

    def __init__(self, run_dir: Path, *, persist: bool, limits: Limits | None = None) -> None:
        self.limits = limits or Limits.from_env()
        window_ns = self.limits.window_ns
        #: the span whose records are kept or folded together: a window's detail can be kept in part, and a long
        #: run's doubled windows never make the detail kept at once larger
        self.chunk_ns = min(self.limits.chunk_ns, window_ns)
        self.run_dir = run_dir
        self.persist = persist
        self._mem: dict[str, dict[int, list[list[Any]]]] = {}
        self.folded_dir = run_dir / FOLDED_DIR
        self.window_ns = window_ns
        self.origin_ns: int | None = None
        self.closed_until: int | None = None
        self.rows: dict[tuple[int, int], dict[str, Any]] = {}  # (window start, pid) -> figures
        #: kept entries: consecutive closed chunks kept for one reason, {start_ns, end_ns, why, records, dir, counts}
        self.kept: list[dict[str, Any]] = []
        self.folded: list[list[int]] = []  # [start, end] of closed chunks whose detail was dropped
        self.headers: dict[int, dict[str, Any]] = {}
        self.budgets = {"lead": 0, "anomaly": 0}
        self.trailing: deque[dict[str, Any]] = deque()  # kept for being recent: dropped when pushed out
        self.steps: dict[int, _StepState] = {}
        self.tails: dict[Path, _Tail] = {}
        self.open: dict[int, dict[int, list[list[Any]]]] = {}  # chunk start -> pid -> records
        self.anomalous: set[int] = set()
        self.damaged: dict[int, int] = {}
        self.saved_until: int | None = None  # the closed chunks the state on disk names: what its files may hold
        self._state_saved_ns: int | None = None  # when the state was last written (the poll's clock)
        self._unsaved_drops: list[str] = []  # dropped entries' folders, deleted once a saved state no longer names them
        self.folded_counts: dict[str, list[int]] = {}  # pid -> _COUNTED summed over the folded windows
        self.last_write: dict[int, int] = {}  # pid -> the latest time it is known to have written
        self._load_state()
        if self.origin_ns is None:
            self.origin_ns = _run_start(run_dir)

    # --- reading -------------------------------------------------------------------------------------------
    def poll(self, now_ns: int | None = None, *, final: bool = False) -> None:
        """Read what the processes wrote since the last poll and close the chunks no process can still write into
        (``final``: every chunk, the job has ended)."""
        self._read_raw(final)
        now = time.perf_counter_ns() if now_ns is None else now_ns
        horizon = None if final else now - self.limits.lag_ns
        while self.open:
            start = min(self.open)
            if horizon is not None and start + self.chunk_ns > horizon:
                break
            self._close(start)
        if self.persist:
            if final or self._state_saved_ns is None or now - self._state_saved_ns >= self.limits.state_ns:
                self._save_state()
                self._state_saved_ns = now
            self._delete_folded_raw(final)

    def _read_raw(self, final: bool) -> None:
        events = self.run_dir / "events"
        try:
            paths = sorted(events.glob("*.jsonl"), key=lambda p: segment_of(p) or (0, 0))
        except OSError:
            return
        for path in paths:
            named = segment_of(path)
            if named is None:
                continue
            tail = self.tails.get(path)
            if tail is None:
                tail = self.tails[path] = _Tail(path, *named)
            records, damaged = tail.read(final)
            if damaged:
                self.damaged[tail.pid] = self.damaged.get(tail.pid, 0) + damaged
            if final and (written := tail.last_write_ns()) is not None:
                self.last_write[tail.pid] = max(self.last_write.get(tail.pid, written), written)
            if tail.header is not None:
                self.headers.setdefault(tail.pid, tail.header)
                if self.origin_ns is None:
                    self.origin_ns = int(tail.header.get("mono_ns") or 0)  # no run.json start: a run's first process
            t = tail.last_ns if tail.last_ns is not None else (tail.header or {}).get("mono_ns")
            latest = tail.last_ns
            closed = self.closed_until if self.closed_until is not None else -1
            chunk_start, chunk_end, chunk = 0, -1, None  # the chunk the last record went to: most records share one
            late: list[tuple[list[Any], int]] = []
            pid = tail.pid
            for record in records:
                when = record_time(record)
                t = when if when is not None else t
                if t is None:
                    continue
                if latest is None or t > latest:
                    latest = t
                if t < closed:
                    late.append((record, t))  # its chunk has closed already
                    continue
                if chunk is None or not chunk_start <= t < chunk_end:
                    chunk_start = self._chunk_start(t)
                    chunk_end = chunk_start + self.chunk_ns
                    chunk = self.open.setdefault(chunk_start, {}).setdefault(pid, [])
                chunk.append(record)
            if late:
                self._late(pid, late)
            if latest is not None:
                tail.last_ns = latest
                self.last_write[pid] = max(self.last_write.get(pid, latest), latest)

    def _window_start(self, t: int) -> int:
        origin = self.origin_ns or 0
        return origin + (t - origin) // self.window_ns * self.window_ns

    def _chunk_start(self, t: int) -> int:
        origin = self.origin_ns or 0
        return origin + (t - origin) // self.chunk_ns * self.chunk_ns

    def _late(self, pid: int, records: list[tuple[list[Any], int]]) -> None:
        """Records for chunks already closed (a process that could not write for seconds: a loaded machine, an
        import holding the interpreter): counted there, and kept with what is always kept unless their chunk was
        folded. A reader of a run folded before (not ``persist``) met them then: skipped."""
        if not self.persist:
            return
        by_chunk: dict[int, list[list[Any]]] = {}
        for record, t in records:
            chunk = self._chunk_start(t)
            self._count(pid, record, chunk)
            if record[0] not in HIGH_VOLUME or not any(a <= t < b for a, b in reversed(self.folded)):
                by_chunk.setdefault(chunk, []).append(record)
        for chunk, kept in by_chunk.items():
            self._write_always(chunk, {pid: kept})

    def _row(self, pid: int, start: int) -> dict[str, Any]:
        row = self.rows.get((start, pid))
        if row is None:
            row = self.rows[(start, pid)] = _new_row(pid, start, start + self.window_ns)
        return row

    def _count(self, pid: int, record: list[Any], start: int, row: dict[str, Any] | None = None) -> None:
        """Count a record of the chunk beginning at ``start`` into its window's ``row``. Fields are read by
        position (``recorder/schema.py``): this runs for every record of the run."""
        kind = record[0]
        row = row if row is not None else self._row(pid, self._window_start(start))
        row["records"] += 1
        try:
            if kind in _START:
                took = record[_END[kind]] - record[_START[kind]]
                if kind == "next":
                    state = self.steps.get(pid) or self.steps.setdefault(pid, _StepState())
                    state.batches_since += 1
                    row["batches"] += 1
                    row["wait_ns"] += took
                    size = record[_BATCH_SIZE] if len(record) > _BATCH_SIZE else None
                    if type(size) is int:
                        row["samples"] += size
                    else:
                        row["samples_known"] = False
                elif kind == "opt":
                    state = self.steps.get(pid) or self.steps.setdefault(pid, _StepState())
                    state.saw_optimizer = True
                    row["optimizer_ns"] += took
                    if state.batches_since > 0:
                        self._step(pid, state, row, record[_END[kind]], start)
                elif kind == "fetch":
                    row["fetches"] += 1
                    row["fetch_ns"] += took
                    row["fetch_cpu_ns"] += max(0, record[_FETCH_CPU] or 0)
                else:
                    row["forward_ns" if kind == "fwd" else "backward_ns"] += took
            elif kind == "h2d":
                row["h2d_bytes"] += int(record[_H2D_BYTES] or 0)
            elif kind == "gc":  # cumulative: this window gets what grew since the process's last one
                state = self.steps.get(pid) or self.steps.setdefault(pid, _StepState())
                total, count = int(record[_GC_NS]), int(record[_GC_COUNT])
                row["gc_ns"] = row.get("gc_ns", 0) + max(0, total - state.gc_ns)
                row["gc_collections"] = row.get("gc_collections", 0) + max(0, count - state.gc_count)
                state.gc_ns, state.gc_count = total, count
                if len(record) > _GC_LONGEST:
                    row["gc_longest_ns"] = max(row.get("gc_longest_ns", 0), int(record[_GC_LONGEST] or 0))
            elif kind == "batch_bytes":
                row["batch_bytes"] = row.get("batch_bytes", 0) + int(record[_BATCH_BYTES] or 0)
                row["batches_sized"] = row.get("batches_sized", 0) + 1
            elif kind == "iter":
                row["epochs"] += 1
                if row["epochs"] == 1 and self.steps.get(pid) and self.steps[pid].last_end_ns is not None:
                    self.anomalous.add(start)  # a later epoch's start (the first is in the leading chunks)
            elif kind == "next_stall":
                row["stalls"] += 1
                self.anomalous.add(start)
            elif kind in ("exception", "fetch_error"):
                row["errors"] += 1
                self.anomalous.add(start)
        except (IndexError, TypeError, ValueError):
            pass

    def _step(self, pid: int, state: _StepState, row: dict[str, Any], end: int, start: int) -> None:
        state.batches_since = 0
        row["steps"] += 1
        if state.last_end_ns is not None:
            duration = end - state.last_end_ns
            row["step_ns"] += duration
            row["max_step_ns"] = max(row["max_step_ns"], duration)
            if state.typical is not None and duration > SLOW_STEP_FACTOR * state.typical:
                self.anomalous.add(start)
            state.recent.append(duration)
            state.since_typical += 1
            if state.since_typical >= 8:
                state.typical, state.since_typical = statistics.median(state.recent), 0
        state.last_end_ns = end

    # --- closing windows -----------------------------------------------------------------------------------
    def _close(self, start: int) -> None:
        by_pid = self.open.pop(start)
        end = start + self.chunk_ns
        counts: dict[str, list[int]] = {}
        for pid, records in by_pid.items():
            row = self._row(pid, self._window_start(start))
            before = [row[name] for name in _COUNTED]
            for record in records:
                self._count(pid, record, start, row)
            counts[str(pid)] = [row[name] - was for name, was in zip(_COUNTED, before)]
        always = {pid: [r for r in records if r[0] not in HIGH_VOLUME] for pid, records in by_pid.items()}
        detail = {pid: [r for r in records if r[0] in HIGH_VOLUME] for pid, records in by_pid.items()}
        count = sum(len(records) for records in detail.values())
        self._write_always(start, always)
        why = self._why_kept(start, count)
        if count:
            entry = self._group(start, end, why, count, counts)
            self._write_detail(entry["dir"], start, detail)
            if why == "trailing":
                if not self.trailing or self.trailing[-1] is not entry:
                    self.trailing.append(entry)
                held = sum(e["records"] for e in self.trailing)
                while len(self.trailing) > 1 and held > self.limits.trail:
                    dropped = self.trailing.popleft()
                    held -= dropped["records"]
                    self._drop(dropped)
        self.anomalous.discard(start)
        self.closed_until = end
        if len({s for s, _ in self.rows}) > MAX_WINDOWS:
            self._coarsen()

    def _group(self, start: int, end: int, why: str, count: int, counts: dict[str, list[int]]) -> dict[str, Any]:
        """The kept entry a closed chunk joins: the last one, where it was kept for the same reason, ends where the
        chunk begins and holds fewer than ``GROUP_RECORDS`` records, and a quarter of its reason's budget (a slow run's
        chunks would each be a folder of a few records otherwise); else a new one."""
        last = self.kept[-1] if self.kept else None
        budget = {"leading": self.limits.lead, "anomaly": self.limits.anomaly, "trailing": self.limits.trail}[why]
        if (last is not None and last["why"] == why and last["end_ns"] == start
                and last["records"] < min(GROUP_RECORDS, budget // 4)):
            last["end_ns"] = end
            last["records"] += count
            for pid, values in counts.items():
                into = last["counts"].setdefault(pid, [0] * len(_COUNTED))
                last["counts"][pid] = [a + b for a, b in zip(into, values)]
            return last
        entry: dict[str, Any] = {"start_ns": start, "end_ns": end, "why": why, "records": count, "dir": f"w{start}",
                                 "counts": counts}
        self.kept.append(entry)
        return entry

    def _why_kept(self, start: int, count: int) -> str:
        if self.budgets["lead"] < self.limits.lead:
            self.budgets["lead"] += count
            return "leading"
        if start in self.anomalous and self.budgets["anomaly"] + count <= self.limits.anomaly:
            self.budgets["anomaly"] += count
            return "anomaly"
        return "trailing"

    def _drop(self, entry: dict[str, Any]) -> None:
        self.kept.remove(entry)
        for pid, counts in entry.get("counts", {}).items():
            into = self.folded_counts.setdefault(pid, [0] * len(_COUNTED))
            self.folded_counts[pid] = [a + b for a, b in zip(into, counts)]
        if self.persist:
            self._unsaved_drops.append(entry["dir"])  # the saved state may still name it: deleted after the next save
        else:
            self._mem.pop(entry["dir"], None)
        if self.folded and self.folded[-1][1] == entry["start_ns"]:
            self.folded[-1][1] = entry["end_ns"]
        else:
            self.folded.append([entry["start_ns"], entry["end_ns"]])

    def _coarsen(self) -> None:
        """Twice the window, neighbours' rows merged: the rows stay under ``MAX_WINDOWS`` however long the run.
        Kept detail and folded spans keep their own bounds."""
        self.window_ns *= 2
        merged: dict[tuple[int, int], dict[str, Any]] = {}
        for (start, pid), row in sorted(self.rows.items()):
            key = (self._window_start(start), pid)
            into = merged.get(key)
            if into is None:
                merged[key] = {**row, "start_ns": key[0], "end_ns": key[0] + self.window_ns}
                continue
            for name, value in row.items():
                if name in ("max_step_ns", "gc_longest_ns"):
                    into[name] = max(into.get(name, 0), value)
                elif name == "samples_known":
                    into[name] = into[name] and value
                elif name not in ("pid", "start_ns", "end_ns"):
                    into[name] = into.get(name, 0) + value
        self.rows = merged

    # --- storage -------------------------------------------------------------------------------------------
    def _write_always(self, start: int, always: dict[int, list[list[Any]]]) -> None:
        for pid, records in always.items():
            if not records:
                continue
            if not self.persist:
                self._mem.setdefault("always", {}).setdefault(pid, []).extend(records)
                continue
            path = self._folded_subdir("always") / f"{pid}.jsonl"
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"window": start, "records": records}, separators=(",", ":")) + "\n")

    def _folded_subdir(self, name: str) -> Path:
        """A folder of the folded directory, made where missing, but never the run's folder itself: a run folder removed
        while the job ran raises here (``FoldingThread`` then stops folding) rather than coming back empty."""
        self.folded_dir.mkdir(exist_ok=True)
        folder = self.folded_dir / name
        folder.mkdir(exist_ok=True)
        return folder

    def _write_detail(self, name: str, chunk: int, detail: dict[int, list[list[Any]]]) -> None:
        """Append a closed chunk's records to its kept entry's folder, each line tagged with the chunk: a line of a
        chunk the state does not name as closed yet (the launcher was killed between the two) is not read back."""
        if not self.persist:
            for pid, records in detail.items():
                self._mem.setdefault(name, {}).setdefault(pid, []).extend(records)
            return
        folder = self._folded_subdir(name)
        for pid, records in detail.items():
            if records:
                with open(folder / f"{pid}.jsonl", "a", encoding="utf-8") as f:
                    for i in range(0, len(records), 256):
                        f.write(json.dumps({"chunk": chunk, "records": records[i:i + 256]}, separators=(",", ":"))
                                + "\n")

    def _save_state(self) -> None:
        state = {"window_ns": self.window_ns, "origin_ns": self.origin_ns, "closed_until": self.closed_until,
                 "rows": [r for r in self.rows.values() if r["start_ns"] < (self.closed_until or 0)],
                 "kept": self.kept, "folded": self.folded,
                 "headers": {str(pid): h for pid, h in self.headers.items()}, "budgets": self.budgets,
                 "damaged": {str(pid): n for pid, n in self.damaged.items()}, "folded_counts": self.folded_counts,
                 "last_write": {str(pid): n for pid, n in self.last_write.items()},
                 "trailing": [e["dir"] for e in self.trailing],
                 "steps": {str(pid): [s.batches_since, s.saw_optimizer, s.last_end_ns, list(s.recent), s.gc_ns,
                                      s.gc_count] for pid, s in self.steps.items()}}
        self.folded_dir.mkdir(exist_ok=True)
        write_file(self.folded_dir / STATE_FILE, json.dumps(state, separators=(",", ":")))
        self.saved_until = self.closed_until
        for name in self._unsaved_drops:
            shutil.rmtree(self.folded_dir / name, ignore_errors=True)
        self._unsaved_drops.clear()

    def _load_state(self) -> None:
        try:
            state = json.loads((self.folded_dir / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        if not isinstance(state, dict):
            return
        self.window_ns = int(state.get("window_ns") or self.window_ns)
        self.origin_ns = state.get("origin_ns")
        self.closed_until = state.get("closed_until")
        self.saved_until = self.closed_until
        self.rows = {(int(r["start_ns"]), int(r["pid"])): r for r in state.get("rows", [])}
        self.kept = list(state.get("kept", []))
        self.folded = [list(span) for span in state.get("folded", [])]
        self.headers = {int(pid): h for pid, h in state.get("headers", {}).items()}
        self.budgets = {**self.budgets, **state.get("budgets", {})}
        self.damaged = {int(pid): int(n) for pid, n in state.get("damaged", {}).items()}
        self.folded_counts = dict(state.get("folded_counts", {}))
        self.last_write = {int(pid): int(n) for pid, n in state.get("last_write", {}).items()}
        trailing = set(state.get("trailing", []))
        self.trailing = deque(e for e in self.kept if e["dir"] in trailing)
        for pid, (since, saw, last, recent, *gc_seen) in state.get("steps", {}).items():
            gc_ns, gc_count = (gc_seen + [0, 0])[:2]
            self.steps[int(pid)] = _StepState(since, saw, last, deque(recent, maxlen=64), gc_ns=gc_ns,
                                              gc_count=gc_count)

    def _delete_folded_raw(self, final: bool) -> None:
        """Raw segments every record of which lies in a chunk the saved state names as closed: finished (the process
        writes a later one, or has ended) and read to their end."""
        if self.saved_until is None:
            return
        newest: dict[int, int] = {}
        for tail in self.tails.values():
            newest[tail.pid] = max(newest.get(tail.pid, -1), tail.segment)
        for path, tail in list(self.tails.items()):
            finished = final or tail.segment < newest[tail.pid] or not _alive(tail.pid)
            if not finished or (tail.last_ns is not None and tail.last_ns >= self.saved_until):
                continue
            try:
                if path.stat().st_size != tail.offset:
                    continue
                path.unlink()
            except OSError:
                continue
            del self.tails[path]

    # --- the result ----------------------------------------------------------------------------------------
    def result(self) -> FoldedRun:
        """Every process's records (kept windows, the open ones, what no window closed over), the rows and the
        folded spans: what ``collect`` builds the session from."""
        records: dict[int, list[list[Any]]] = {}
        for pid, always in self._always_records().items():
            records.setdefault(pid, []).extend(always)
        for entry in self.kept:
            for pid, detail in self._detail_records(entry["dir"]).items():
                records.setdefault(pid, []).extend(detail)
        for by_pid in (self.open[s] for s in sorted(self.open)):
            for pid, open_records in by_pid.items():
                records.setdefault(pid, []).extend(open_records)
        rows = sorted(self.rows.values(), key=lambda r: (r["start_ns"], r["pid"]))
        return FoldedRun(self.headers, records, rows, [(int(a), int(b)) for a, b in self.folded], self.window_ns,
                         [{k: e[k] for k in ("start_ns", "end_ns", "why", "records")} for e in self.kept],
                         self.damaged, self.last_write,
                         {pid: dict(zip(_COUNTED, counts)) for pid, counts in self.folded_counts.items()})

    def _always_records(self) -> dict[int, list[list[Any]]]:
        found = {pid: list(r) for pid, r in self._mem.get("always", {}).items()}
        folder = self.folded_dir / "always"
        if not folder.is_dir():
            return found
        for path in folder.glob("*.jsonl"):
            found.setdefault(int(path.stem), []).extend(_tagged_records(path, "window", self.saved_until))
        return found

    def _detail_records(self, name: str) -> dict[int, list[list[Any]]]:
        """A kept entry's records: those written to its folder for chunks the saved state names as closed, then
        those this folder added in memory."""
        found: dict[int, list[list[Any]]] = {}
        folder = self.folded_dir / name
        if folder.is_dir():
            for path in folder.glob("*.jsonl"):
                found[int(path.stem)] = list(_tagged_records(path, "chunk", self.saved_until))
        for pid, records in self._mem.get(name, {}).items():
            found.setdefault(pid, []).extend(records)
        return found


def _tagged_records(path: Path, tag: str, until: int | None) -> Iterable[list[Any]]:
    """The records of a folded file's lines (``{tag: chunk start, "records": [...]}``) whose chunk lies before
    ``until``: a line cut by a kill, or written for a chunk the saved state does not name as closed, is left out (its
    records are still in the raw segments)."""
    if until is None:
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                item = json.loads(line)
                if int(item[tag]) < until:
                    yield from item["records"]
            except (ValueError, KeyError, TypeError):
                continue


@dataclass(frozen=True)
class FoldedRun:
    headers: dict[int, dict[str, Any]]
    records: dict[int, list[list[Any]]]
    rows: list[dict[str, Any]]
    folded: list[tuple[int, int]]
    window_ns: int
    kept: list[dict[str, Any]]
    damaged: dict[int, int]  # pid -> lines that could not be read
    last_write: dict[int, int]  # pid -> when it last wrote (monotonic)
    folded_counts: dict[str, dict[str, int]]  # pid -> steps, batches, samples, wait_ns in the folded spans

    def recording(self) -> dict[str, Any]:
        """``Session.recording``: the window, the spans whose records were folded, the kept windows by why."""
        kept: dict[str, int] = {}
        for entry in self.kept:
            kept[entry["why"]] = kept.get(entry["why"], 0) + 1
        return {"window_ns": self.window_ns, "folded": [list(span) for span in self.folded], "kept_windows": kept,
                "folded_counts": self.folded_counts}


def read_run(run_dir: Path) -> FoldedRun:
    """Everything a run directory holds, without changing it: what the launcher folded, and the raw events beyond
    it folded in memory (a run still going, or one whose launcher was killed)."""
    folder = Folder(run_dir, persist=False)
    folder.poll(final=True)
    return folder.result()


def saved_samples(run_dir: Path) -> dict[str, Any] | None:
    """The system samples the launcher last saved while the job ran (``FoldingThread``); None where it saved none
    or they cannot be read."""
    try:
        samples = json.loads((run_dir / FOLDED_DIR / SAMPLES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return samples if isinstance(samples, dict) and isinstance(samples.get("t_ns"), list) else None


def _run_start(run_dir: Path) -> int | None:
    try:
        start = json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get("start_ns")
    except (OSError, ValueError, AttributeError):
        return None
    return start if isinstance(start, int) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return status != "Z"
    return True


class FoldingThread:
    """The launcher's folding while the job runs. A write that fails (a full disk, the run's folder removed) stops
    the folding where it stands: the state on disk is the last whole one, and the raw events beyond it stay."""

    def __init__(self, run_dir: Path, samples: Callable[[], str] | None = None) -> None:
        self.folder = Folder(run_dir, persist=True)
        self.period_s = self.folder.limits.period_s
        self.samples = samples  # the system samples so far, as JSON (saved every SAMPLES_SAVE_S)
        self._samples_saved = time.monotonic()
        self.failed: OSError | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = start_thread(self._loop, "stallscope-fold")

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s) and self._poll():
            pass

    def _poll(self, final: bool = False) -> bool:
        with self._lock:
            if self.failed is not None:
                return False
            try:
                self.folder.poll(final=final)
            except OSError as exc:
                self.failed = exc
                return False
            due = time.monotonic() - self._samples_saved >= self.folder.limits.samples_s
            if self.samples is not None and due and not final:
                self._samples_saved = time.monotonic()
                with contextlib.suppress(OSError):  # the events matter more: their folding goes on without these
                    write_file(self.folder.folded_dir / SAMPLES_FILE, self.samples())
            return True

    def finish(self) -> FoldedRun | None:
        """Fold what is left (the job has ended) and give the run; None where folding failed (``collect`` then
        reads the run directory as it stands)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.folder.result() if self._poll(final=True) else None
