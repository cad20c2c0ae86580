"""How far a running job has got, read from its event files as they grow: the live view's numbers.

The launcher polls this at most twice a second while the script runs. It reads only the bytes
appended since the last poll, and only whole lines (a process may be in the middle of a write), so
a poll costs the launcher a few milliseconds however long the run is. The figures are a running
tally, not the analysis: steps end at an optimizer step after at least one batch (the recorder's
rule), the data wait leaves out each iterator's first batch (worker start-up), and the leading
input stage is split from the workers' timed fetches the way the analysis splits them, roughly.
The summary printed at the end is the authority.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallscope.recorder.schema import fields_of

#: Below this data-wait fraction the training step itself leads (the verdict's compute-bound line).
COMPUTE_LEADS_BELOW = 0.10
#: Steps per second are measured over about this much recent time.
RATE_WINDOW_NS = 5_000_000_000
#: The trend compares the steps/s of the last minute with those of the first minute after the first step's
#: ``TREND_SKIP_NS`` (start-up), once ``TREND_AFTER_NS`` have passed since the first step; shown from a change of
#: ``TREND_SHOWN`` (the over-time finding's ``CHANGE_AT`` and more, so a minute's noise is not said).
TREND_MINUTE_NS = 60_000_000_000
TREND_SKIP_NS = 10_000_000_000
TREND_AFTER_NS = 180_000_000_000
TREND_SHOWN = 0.2


@dataclass(frozen=True)
class Progress:
    steps: int
    steps_per_s: float | None  # over the last few seconds; None before two polls saw steps
    data_wait_fraction: float | None  # of the time since the first batch arrived; None before that
    leading: str | None  # node id leading so far; None before the first batch
    elapsed_s: float
    #: the recent minute's steps/s over the first steady minute's, where they differ by ``TREND_SHOWN`` or more after
    #: ``TREND_AFTER_NS`` of steps (the over-time finding as it appears; the summary at the end says why)
    trend: float | None = None


class _Tail:
    """One event file, read from where the last poll stopped; a cut line waits for its end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.role: str | None = None

    def new_records(self) -> list[list[Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        records: list[list[Any]] = []
        for line in chunk[:end].splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and "header" in item:
                self.role = self.role or str(item["header"].get("role", "child"))
            elif isinstance(item, list) and item:
                records.extend(r for r in item if isinstance(r, list) and r) if isinstance(item[0], list) \
                    else records.append(item)
        for record in records:
            if record[0] == "role" and len(record) > 1:  # a spawned process that became a rank says so
                self.role = str(record[1])
        return records


class ProgressTally:
    """A running tally of a job's steps, data wait and input work, from ``run_dir/events``."""

    def __init__(self, events_dir: Path, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.events_dir = events_dir
        self.clock = clock
        self.started_ns = clock()
        self._tails: dict[Path, _Tail] = {}
        self._counted: str | None = None  # the pid of the training process whose batches and steps are counted
        self._steps = 0
        self._batches = 0
        self._batches_since_step = 0
        self._saw_optimizer = False
        self._wait_ns = 0
        self._first_batch_end_ns: int | None = None
        self._last_ns: int | None = None
        self._seen_iters: set[tuple[Any, Any]] = set()
        self._input_ns: dict[str, int] = {}
        self._rates: deque[tuple[int, int]] = deque()
        self._first_step: tuple[int, int] | None = None  # (time, steps) at the first poll that saw a step
        self._first_minute: float | None = None  # steps/s over the first steady minute
        self._minute: deque[tuple[int, int]] = deque()  # (time, steps) over about the last minute

    def poll(self) -> Progress:
        try:
            paths = sorted(self.events_dir.glob("*.jsonl"))
        except OSError:
            paths = []
        for path in paths:
            tail = self._tails.setdefault(path, _Tail(path))
            records = tail.new_records()
            pid = path.name.split(".", 1)[0]  # a process's segments (recorder/events.py) are one process
            if self._counted is None and tail.role in ("main", "rank", "child") \
                    and any(r[0] == "next" for r in records):
                # the script itself, a program it started (a launcher script's python train.py), or under
                # torchrun / mp.spawn the first rank seen taking batches; never a DataLoader worker
                self._counted = pid
            for record in records:
                self._add(record, is_main=pid == self._counted)
        present = set(paths)
        for path in [p for p in self._tails if p not in present]:  # folded and deleted (folding.py)
            del self._tails[path]
        now = self.clock()
        steps = self._steps if self._saw_optimizer else self._batches
        if self._rates and steps < self._rates[-1][1]:  # the first optimizer step: batches were not steps
            self._rates.clear()
        if steps:  # the rate counts from the first poll that saw a step: start-up is not in it
            self._rates.append((now, steps))
            while len(self._rates) > 2 and now - self._rates[1][0] >= RATE_WINDOW_NS:
                self._rates.popleft()
        t0, s0 = self._rates[0] if self._rates else (now, steps)
        rate = (steps - s0) * 1e9 / (now - t0) if now > t0 else None
        return Progress(steps, rate, self._wait_fraction(), self._leading(), (now - self.started_ns) / 1e9,
                        self._trend(now, steps))

    def _trend(self, now: int, steps: int) -> float | None:
        """The last minute's rate over the first steady minute's, where it moved by ``TREND_SHOWN`` or more."""
        if not steps:
            return None
        if self._first_step is None or steps < self._first_step[1]:
            self._first_step, self._first_minute = (now, steps), None
            self._minute.clear()
        self._minute.append((now, steps))
        while len(self._minute) > 2 and now - self._minute[1][0] >= TREND_MINUTE_NS:
            self._minute.popleft()
        t0, s0 = self._first_step
        if self._first_minute is None:
            begun = [(t, s) for t, s in self._minute if t - t0 >= TREND_SKIP_NS]
            if begun and now - begun[0][0] >= TREND_MINUTE_NS:
                self._first_minute = (steps - begun[0][1]) * 1e9 / (now - begun[0][0])
            return None
        ta, sa = self._minute[0]
        if now - t0 < TREND_AFTER_NS or now <= ta or self._first_minute <= 0:
            return None
        ratio = (steps - sa) * 1e9 / (now - ta) / self._first_minute
        return ratio if abs(ratio - 1) >= TREND_SHOWN else None

    def _add(self, record: list[Any], *, is_main: bool) -> None:
        kind, f = fields_of(record)
        if kind == "fetch":
            self._add_fetch(f)
        elif not is_main:
            return
        elif kind == "next":
            self._add_batch(f)
        elif kind == "opt":
            self._saw_optimizer = True
            self._last_ns = max(self._last_ns or 0, int(f.get("end_ns", 0)))
            if self._batches_since_step > 0:
                self._steps += 1
                self._batches_since_step = 0

    def _add_batch(self, f: dict[str, Any]) -> None:
        start, end = int(f["start_ns"]), int(f["end_ns"])
        self._batches += 1
        self._batches_since_step += 1
        self._last_ns = max(self._last_ns or 0, end)
        iterator = (f.get("loader_id"), f.get("iter_id"))
        if iterator not in self._seen_iters:  # an iterator's first batch waits for its workers to start
            self._seen_iters.add(iterator)
            if self._first_batch_end_ns is None:
                self._first_batch_end_ns = end
            return
        self._wait_ns += end - start

    def _add_fetch(self, f: dict[str, Any]) -> None:
        if not f.get("timed", True):
            return
        wall = int(f["end_ns"]) - int(f["start_ns"])
        cpu, runqueue = int(f.get("cpu_ns", 0)), max(0, int(f.get("runqueue_ns", -1)))
        called_cpu = 0
        for node, row in (f.get("by_node") or {}).items():
            self._input_ns[node] = self._input_ns.get(node, 0) + max(0, int(row[0]))
            called_cpu += max(0, int(row[1]))
        outside = max(0, wall - sum(max(0, int(r[0])) for r in (f.get("by_node") or {}).values()))
        own_cpu = min(outside, max(0, cpu - called_cpu) + runqueue)
        self._input_ns["transform"] = self._input_ns.get("transform", 0) + own_cpu
        self._input_ns["storage"] = self._input_ns.get("storage", 0) + outside - own_cpu

    def _wait_fraction(self) -> float | None:
        if self._first_batch_end_ns is None or self._last_ns is None or self._last_ns <= self._first_batch_end_ns:
            return None
        return min(1.0, self._wait_ns / (self._last_ns - self._first_batch_end_ns))

    def _leading(self) -> str | None:
        fraction = self._wait_fraction()
        if fraction is None:
            return None
        if fraction < COMPUTE_LEADS_BELOW or not self._input_ns:
            return "compute" if fraction < COMPUTE_LEADS_BELOW else "loader"
        return max(self._input_ns, key=self._input_ns.__getitem__)
