"""A Chrome trace-event JSON file of a run, for ui.perfetto.dev (or chrome://tracing).

Layout: one process for the training process (a track of steps, a track of what its main thread
waited on or did, and the in-process loading of ``num_workers=0``), one process per DataLoader with
one thread track per worker (its start-up, each batch, and the batch's stages), and one process of
counters for the system samples. Times are microseconds from the start of the run.

The stages inside a batch are laid out in pipeline order with their measured durations: the recorder
knows how long each stage took within the batch, not in which order, so the placement is a layout.

Sampled stacks (hotspots) are a layout too: the recorder counts stacks, it does not time them, so each fetching
process gets a track beside its batches where its samples are drawn as a flame graph over the span it fetched in
(stage, then frames from the outermost in, each slice as wide as its share of the process's samples, the largest
first), with the samples, share, file and line in each slice's args.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, TypeGuard

import stallscope
from stallscope.analysis import Analysis
from stallscope.analysis.sampled_stacks import (
    CallNode,
    Frame,
    SampledStack,
    call_tree,
    job_stacks,
)
from stallscope.constants import NODE_IDS
from stallscope.paths import write_file
from stallscope.session import Session

MAIN_PID = 1
SYSTEM_PID = 2
LOADER_PID_BASE = 10
STEPS_TID = 1
MAIN_THREAD_TID = 2
IN_PROCESS_TID = 3
PIN_THREAD_TID = 4
SYNC_TID = 5
GPU_TID = 6
PROFILER_TID = 7
RANK_PID_BASE = 100  # rank r of a distributed job is trace process RANK_PID_BASE + r
STACKS_TID_BASE = 1000  # the sampled stacks of the k-th fetching process are track STACKS_TID_BASE + k
#: Slices of sampled stacks narrower than this (ns) are left out: their caller's slice holds them.
MIN_STACK_SLICE_NS = 1000


class _Events:
    def __init__(self, origin_ns: int) -> None:
        self.origin_ns = origin_ns
        self.events: list[dict[str, Any]] = []

    def ts(self, t_ns: int) -> float:
        return round((t_ns - self.origin_ns) / 1000, 3)

    def span(self, pid: int, tid: int, name: str, start_ns: int, end_ns: int, cat: str,
             args: dict[str, Any] | None = None) -> None:
        event = {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": self.ts(start_ns),
                 "dur": round(max(0, end_ns - start_ns) / 1000, 3)}
        if args:
            event["args"] = args
        self.events.append(event)

    def counter(self, pid: int, name: str, t_ns: int, values: dict[str, float]) -> None:
        self.events.append({"ph": "C", "pid": pid, "tid": 0, "name": name, "ts": self.ts(t_ns), "args": values})

    def instant(self, pid: int, tid: int, name: str, t_ns: int, args: dict[str, Any]) -> None:
        self.events.append({"ph": "i", "s": "t", "pid": pid, "tid": tid, "name": name, "cat": "error",
                            "ts": self.ts(t_ns), "args": args})

    def meta(self, pid: int, tid: int, kind: str, value: Any) -> None:
        key = "name" if kind.endswith("_name") else "sort_index"
        self.events.append({"ph": "M", "pid": pid, "tid": tid, "name": kind, "ts": 0, "args": {key: value}})


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


def _main_process(ev: _Events, session: Session, analysis: Analysis) -> None:
    main_pid = session.main_pid
    rank = next((r.rank for r in session.ranks if r.pid == main_pid), None)
    ev.meta(MAIN_PID, 0, "process_name", f"training process (pid {main_pid}"
            + (f", rank {rank})" if rank is not None else ")"))
    ev.meta(MAIN_PID, 0, "process_sort_index", 0)
    for tid, name in ((STEPS_TID, "training steps"), (MAIN_THREAD_TID, "main thread"),
                      (IN_PROCESS_TID, "in-process loading (num_workers=0)"), (PIN_THREAD_TID, "pin_memory thread")):
        ev.meta(MAIN_PID, tid, "thread_name", name)
        ev.meta(MAIN_PID, tid, "thread_sort_index", tid)
    stats = analysis.steps
    for step in stats.steps:
        ev.span(MAIN_PID, STEPS_TID, f"step {step.index}", step.start_ns, step.end_ns, "step",
                {"wait_ms": _ms(step.wait_ns), "transfer_ms": _ms(step.transfer_ns), "compute_ms": _ms(step.compute_ns),
                 "forward_ms": _ms(step.forward_ns), "backward_ms": _ms(step.backward_ns),
                 "optimizer_ms": _ms(step.optimizer_ns), "sync_ms": _ms(step.sync_ns), "batches": step.batches,
                 "warm_up": step.index < stats.warmup_steps,
                 "excluded_ms": _ms(step.excluded_ns)})
    for it in session.iters:
        if it.pid == main_pid:
            ev.span(MAIN_PID, MAIN_THREAD_TID, f"iter(loader {it.loader_id})", it.start_ns, it.end_ns, "loader",
                    {"epoch": it.epoch, "num_workers": it.num_workers})
    for n in session.nexts:
        if n.pid == main_pid:
            ev.span(MAIN_PID, MAIN_THREAD_TID, "data wait", n.start_ns, n.end_ns, "wait",
                    {"loader": n.loader_id, "epoch": n.epoch, "from_worker": n.worker, "batch_size": n.batch_size})
    for s in session.stops:
        if s.pid == main_pid:
            ev.span(MAIN_PID, MAIN_THREAD_TID, "end of epoch", s.start_ns, s.end_ns, "loader", {"loader": s.loader_id})
    for o in session.optimizer_steps:
        if o.pid == main_pid:
            ev.span(MAIN_PID, MAIN_THREAD_TID, f"{o.kind}.step", o.start_ns, o.end_ns, "compute")
    for f in session.forwards:
        if f.pid == main_pid:
            ev.span(MAIN_PID, MAIN_THREAD_TID, f"forward ({f.module})", f.start_ns, f.end_ns, "compute")
    for b in session.backwards:
        if b.pid == main_pid:
            ev.span(MAIN_PID, MAIN_THREAD_TID, f"backward ({b.how})", b.start_ns, b.end_ns, "compute")
    for w in session.op_windows:
        if w.get("pid") == main_pid:
            ev.meta(MAIN_PID, PROFILER_TID, "thread_name", "profiler window")
            ev.span(MAIN_PID, PROFILER_TID, "profiler window (left out of the figures)", int(w["start_ns"]),
                    int(w["end_ns"]), "profiler", {"steps": w.get("steps"), "folded": w.get("folded")})
    for t in session.transfers:
        if t.pid == main_pid:
            ev.span(MAIN_PID, MAIN_THREAD_TID, t.call, t.start_ns, t.end_ns, "transfer",
                    {"bytes": t.nbytes, "pinned": t.pinned, "non_blocking": t.non_blocking})
    for p in session.pins:
        if p.pid == main_pid:
            ev.span(MAIN_PID, MAIN_THREAD_TID if p.main_thread else PIN_THREAD_TID, "pin_memory",
                    p.start_ns, p.end_ns, "loader")
    _collectives_and_gpu(ev, session, main_pid, MAIN_PID)
    for e in session.errors:
        if e.where == "main":
            ev.instant(MAIN_PID, MAIN_THREAD_TID, f"{e.type}", e.t_ns, {"message": e.message, "location": e.location})


def _collectives_and_gpu(ev: _Events, session: Session, pid: int | None, trace_pid: int) -> None:
    """Time in collectives (the sync node) and the GPU's own step/idle/copy spans of one process."""
    ev.meta(trace_pid, SYNC_TID, "thread_name", "collectives (sync)")
    ev.meta(trace_pid, SYNC_TID, "thread_sort_index", SYNC_TID)
    for c in session.collectives:
        if c.pid == pid:
            ev.span(trace_pid, SYNC_TID, c.op, c.start_ns, c.end_ns, "sync",
                    {"blocking": c.blocking, "bucket": c.bucket, "seq": c.seq})
    spans = [g for g in session.gpu_spans if g.pid == pid]
    if spans:
        ev.meta(trace_pid, GPU_TID, "thread_name", "GPU (CUDA events; CPU times the events were recorded)")
        ev.meta(trace_pid, GPU_TID, "thread_sort_index", GPU_TID)
    for g in spans:
        if g.kind != "idle":
            ev.span(trace_pid, GPU_TID, f"GPU {g.kind}", g.start_ns, g.end_ns, "gpu",
                    {"gpu_ms": _ms(g.gpu_ns), "bytes": g.nbytes, "step": g.step})


def _other_ranks(ev: _Events, session: Session) -> None:
    """Every rank other than the analysed training process: its waits, optimizer steps and collectives."""
    main_pid = session.main_pid
    for index, r in enumerate(session.ranks):
        if r.pid == main_pid:
            continue
        tp = RANK_PID_BASE + (r.rank if r.rank >= 0 else 100_000 + index)  # rank -1: not known, keep apart
        ev.meta(tp, 0, "process_name", f"rank {r.rank} (pid {r.pid}, {r.host})")
        ev.meta(tp, 0, "process_sort_index", tp)
        ev.meta(tp, MAIN_THREAD_TID, "thread_name", "main thread")
        for n in session.nexts:
            if n.pid == r.pid:
                ev.span(tp, MAIN_THREAD_TID, "data wait", n.start_ns, n.end_ns, "wait", {"loader": n.loader_id})
        for o in session.optimizer_steps:
            if o.pid == r.pid:
                ev.span(tp, MAIN_THREAD_TID, f"{o.kind}.step", o.start_ns, o.end_ns, "compute")
        _collectives_and_gpu(ev, session, r.pid, tp)


def _batch(ev: _Events, pid: int, tid: int, fetch: Any, split: dict[str, int]) -> None:
    ev.span(pid, tid, f"batch {fetch.seq}", fetch.start_ns, fetch.end_ns, "batch",
            {"items": fetch.items, "cpu_ms": _ms(fetch.cpu_ns), "os_pid": fetch.pid, "epoch_iter": fetch.iter_id,
             "outcome": fetch.outcome, "calls_timed": fetch.timed,
             "calls_ms": {name: _ms(v[0]) for name, v in fetch.by_name.items()}})
    cursor = fetch.start_ns
    for node in NODE_IDS:
        value = split.get(node, 0)
        if value <= 0:
            continue
        end = min(fetch.end_ns, cursor + value)
        ev.span(pid, tid, node, cursor, end, f"stage,{node}", {"ms": _ms(value)})
        cursor = end


def _loaders(ev: _Events, session: Session, analysis: Analysis) -> None:
    main_pid = session.main_pid
    for index, loader in enumerate(session.loaders):
        pid = LOADER_PID_BASE + loader.loader_id
        workers = int(loader.config.get("num_workers") or 0)
        ev.meta(pid, 0, "process_name", f"loader {loader.loader_id} workers ({loader.site})")
        ev.meta(pid, 0, "process_sort_index", 10 + index)
        seen = sorted({f.worker for f in session.fetches if f.loader_id == loader.loader_id and f.worker >= 0}
                      | {w.worker for w in session.worker_starts if w.loader_id == loader.loader_id}
                      | set(range(workers)))
        for worker in seen:
            ev.meta(pid, worker + 1, "thread_name", f"worker {worker}")
            ev.meta(pid, worker + 1, "thread_sort_index", worker)
        for w in session.worker_starts:
            if w.loader_id == loader.loader_id:
                ev.span(pid, w.worker + 1, "worker start", w.created_ns, w.ready_ns, "loader",
                        {"os_pid": w.pid, "process_start_ms": _ms(w.entered_ns - w.created_ns),
                         "init_ms": _ms(w.ready_ns - w.entered_ns), "threads": w.threads})
    stages = analysis.fetch_stages
    for i, f in enumerate(session.fetches):
        split = stages[i] if i < len(stages) else {}
        if f.worker >= 0:
            _batch(ev, LOADER_PID_BASE + f.loader_id, f.worker + 1, f, split)
        elif f.pid == main_pid:
            _batch(ev, MAIN_PID, IN_PROCESS_TID, f, split)
    for e in session.errors:
        if e.where == "worker" and e.loader_id is not None and e.worker is not None:
            ev.instant(LOADER_PID_BASE + e.loader_id, e.worker + 1, e.type, e.t_ns,
                       {"message": e.message, "location": e.location})


def _stack_tracks(ev: _Events, session: Session, analysis: Analysis) -> None:
    """Per fetching process (and loader): its sampled stacks as a flame graph over the span it fetched in."""
    groups: dict[tuple[int, int], list[SampledStack]] = defaultdict(list)
    for stack in job_stacks(session, analysis.steps.loader_ids):
        groups[(stack.pid, stack.loader_id)].append(stack)
    for k, ((pid, loader_id), stacks) in enumerate(sorted(groups.items())):
        fetches = [f for f in session.fetches if f.pid == pid and f.loader_id == loader_id]
        if not fetches:
            continue
        worker = fetches[0].worker
        trace_pid = LOADER_PID_BASE + loader_id if worker >= 0 else MAIN_PID
        who = f"worker {worker}" if worker >= 0 else f"loader {loader_id} in-process"
        ev.meta(trace_pid, STACKS_TID_BASE + k, "thread_name",
                f"{who} (pid {pid}): sampled stacks by share of samples, not in time")
        ev.meta(trace_pid, STACKS_TID_BASE + k, "thread_sort_index", STACKS_TID_BASE + k)
        root = call_tree(stacks, by_stage=True)
        _stack_slices(ev, trace_pid, STACKS_TID_BASE + k, root, root.count, min(f.start_ns for f in fetches),
                      max(f.end_ns for f in fetches))


def _stack_slices(ev: _Events, pid: int, tid: int, node: CallNode, total: int, start_ns: int, end_ns: int) -> None:
    """``node``'s children laid side by side in [start_ns, end_ns], each as wide as its share of ``node``."""
    cursor = start_ns
    for child in node.ordered():
        width = (end_ns - start_ns) * child.count // node.count
        if width < MIN_STACK_SLICE_NS:
            break
        key = child.key
        args: dict[str, Any] = {"samples": child.count, "share_of_process": round(child.count / total, 4)}
        if isinstance(key, Frame):
            args.update(file=key.file, line=key.line, function=key.function)
        ev.span(pid, tid, key.label if isinstance(key, Frame) else f"{key} (stage)", cursor, cursor + width,
                "stack_sample", args)
        _stack_slices(ev, pid, tid, child, total, cursor, cursor + width)
        cursor += width


def _queue_counters(ev: _Events, session: Session) -> None:
    """Per loader: batches ready in the queue (done by a worker, not yet taken) and indices in flight."""
    by_loader: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for f in session.fetches:
        if f.worker >= 0 and f.outcome != "StopIteration":
            by_loader[f.loader_id].append((f.end_ns, 1, -1))
    for n in session.nexts:
        if n.worker >= 0:
            by_loader[n.loader_id].append((n.end_ns, -1, 0))
    for s in session.sends:
        by_loader[s.loader_id].append((s.t_ns, 0, 1))
    for loader_id, changes in by_loader.items():
        ready = in_flight = 0
        for t_ns, d_ready, d_flight in sorted(changes):
            ready = max(0, ready + d_ready)
            in_flight = max(0, in_flight + d_flight)
            ev.counter(MAIN_PID, f"loader {loader_id} queue", t_ns, {"ready": ready, "in_flight": in_flight})


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _system_counters(ev: _Events, session: Session) -> None:
    samples = session.system
    if not samples.present:
        return
    ev.meta(SYSTEM_PID, 0, "process_name", f"system (sampled every {samples.interval_s} s)")
    ev.meta(SYSTEM_PID, 0, "process_sort_index", 1)
    series: dict[str, list[Any]] = dict(samples.scalar_series())
    rss = samples.tree_rss()
    if any(v is not None for v in rss):
        series["process tree RSS (MiB)"] = [v / 2 ** 20 if v is not None else None for v in rss]
    per_gpu = {name: samples.gpu_series(name) for name in samples.gpu}
    for i, t_ns in enumerate(samples.t_ns):
        if t_ns < session.start_ns:
            continue
        for name, values in series.items():
            if i < len(values) and _number(values[i]):
                ev.counter(SYSTEM_PID, name, t_ns, {"value": values[i]})
        for name, devices in per_gpu.items():
            args: dict[str, float] = {}
            for k, values in enumerate(devices):
                value = values[i] if i < len(values) else None
                if _number(value):
                    args[f"gpu{k}"] = value
            if args:
                ev.counter(SYSTEM_PID, f"gpu {name}", t_ns, args)


def _window_counters(ev: _Events, analysis: Analysis) -> None:
    """The run over time (``analysis/over_time.py``): steps/s and the data wait per window, on the training process."""
    if analysis.over_time is None:
        return
    for w in analysis.over_time.windows:
        if w.steps_per_s is not None:
            ev.counter(MAIN_PID, "steps/s (per window)", w.start_ns, {"value": round(w.steps_per_s, 3)})
        if w.data_wait_fraction is not None:
            ev.counter(MAIN_PID, "data wait % (per window)", w.start_ns,
                       {"value": round(100 * w.data_wait_fraction, 2)})


def render(session: Session, analysis: Analysis) -> dict[str, Any]:
    """The trace as a dict (``{"traceEvents": [...], ...}``) with times relative to ``session.start_ns``."""
    ev = _Events(session.start_ns)
    _main_process(ev, session, analysis)
    _other_ranks(ev, session)
    _loaders(ev, session, analysis)
    _stack_tracks(ev, session, analysis)
    _queue_counters(ev, session)
    _system_counters(ev, session)
    _window_counters(ev, analysis)
    meta = [e for e in ev.events if e["ph"] == "M"]
    timed = sorted((e for e in ev.events if e["ph"] != "M"), key=lambda e: (e["ts"], -e.get("dur", 0)))
    return {
        "traceEvents": meta + timed,
        "displayTimeUnit": "ms",
        "otherData": {"run_id": session.run_id, "command": " ".join(session.command), "cwd": session.cwd,
                      "wall_s": round(session.wall_s, 6), "stallscope": stallscope.__version__,
                      "time_origin": "microseconds since the start of the run"},
    }


def write_trace(path: str | os.PathLike[str], trace: dict[str, Any]) -> Path:
    return write_file(path, json.dumps(trace, separators=(",", ":")))
