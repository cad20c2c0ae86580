"""Turn the per-process event files of a run directory into a Session.

The event kinds and their fields are written by ``stallscope.recorder`` and named in
``recorder/schema.py``; this is the only place that reads them, by those names. Unknown kinds are ignored (a newer
recorder may add some) and a truncated last line (a process killed mid-write) is skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import signal
import time
from pathlib import Path
from typing import Any, NamedTuple

from stallscope.constants import SESSION_SCHEMA
from stallscope.folding import FoldedRun, read_run, saved_samples
from stallscope.recorder.schema import fields_of
from stallscope.session import (
    RECORD_LISTS,
    BackwardRecord,
    CollectiveRecord,
    ErrorRecord,
    FetchRecord,
    ForwardRecord,
    GpuSpanRecord,
    IterRecord,
    LoaderRecord,
    NextRecord,
    OptimizerStepRecord,
    PinRecord,
    ProcessRecord,
    RankRecord,
    SendRecord,
    Session,
    ShutdownRecord,
    StallRecord,
    StopRecord,
    TransferRecord,
    WorkerStartRecord,
    sort_in_time,
)

#: Events of facts about the training step (recorder/model_facts.py, recorder/step_threads.py): kind without
#: "_info".
_COMPUTE_FACTS = ("optimizer_info", "model_info", "ddp_info", "threads_info", "allocator_info")


def read_event_files(events_dir: Path) -> list[tuple[dict[str, Any], list[list[Any]]]]:
    """[(header, records)] for every process that wrote events (its segments joined) into a run's ``events_dir``."""
    return [(f.header, f.records) for f in _read_events(read_run(events_dir.parent))]


class EventFile(NamedTuple):
    header: dict[str, Any]
    records: list[list[Any]]
    damaged: int  # lines that could not be read: cut short by a kill or a full disk
    last_write_ns: int  # when the process last wrote, on its monotonic clock


def _read_events(run: FoldedRun) -> list[EventFile]:
    """Every process's events: what was folded and kept, and the raw segments beyond it (``folding.py``); a line cut
    short by a kill or a full disk is skipped and counted, so the session can say that process's last events are
    missing."""
    result = []
    for pid in sorted(run.headers):
        header = run.headers[pid]
        last = run.last_write.get(pid, int(header["mono_ns"]))
        result.append(EventFile(header, run.records.get(pid, []), run.damaged.get(pid, 0), last))
    return result


#: Events whose named fields are their record's fields, one for one: kind -> (Session list, record type).
_BY_NAME: dict[str, tuple[str, type]] = {
    "iter": ("iters", IterRecord), "next": ("nexts", NextRecord), "stop": ("stops", StopRecord),
    "shutdown": ("shutdowns", ShutdownRecord),
    "next_stall": ("stalls", StallRecord),
    "send": ("sends", SendRecord), "worker_start": ("worker_starts", WorkerStartRecord),
    "opt": ("optimizer_steps", OptimizerStepRecord), "fwd": ("forwards", ForwardRecord),
    "bwd": ("backwards", BackwardRecord), "pin": ("pins", PinRecord), "h2d": ("transfers", TransferRecord),
    "gpu_span": ("gpu_spans", GpuSpanRecord),
}


def build_session(run_dir: Path, meta: dict[str, Any], run: FoldedRun | None = None) -> Session:
    """The session of ``run_dir``: ``run``, what the launcher's folder holds at the end, or read from the folder
    (``folding.read_run``)."""
    run = run if run is not None else read_run(run_dir)
    lists: dict[str, list[Any]] = {name: [] for name in RECORD_LISTS if name != "ranks"}
    ranks: dict[int, RankRecord] = {}
    notes: list[str] = []
    batch_info: list[dict[str, Any]] = []
    lmdb_opens: list[dict[str, Any]] = []
    shared_connections: list[dict[str, Any]] = []
    framework_args: list[dict[str, Any]] = []
    tracker_runs: list[dict[str, Any]] = []
    calibrations: list[dict[str, Any]] = []
    compute_facts: list[dict[str, Any]] = []
    op_windows: list[dict[str, Any]] = []
    stack_counts: dict[tuple[Any, ...], int] = {}
    sampler_off: dict[str, list[int]] = {}
    thread_sampled: dict[str, list[int]] = {}  # why the thread sampler ran -> processes
    step_limit_hit = False
    cut_short: set[int] = set()
    files = _read_events(run)
    recorded = {int(f.header["pid"]) for f in files}
    for header, records, damaged, _ in files:
        pid = int(header["pid"])
        if damaged:
            notes.append(f"{damaged} line(s) of process {pid}'s events were cut short (killed mid-write, or the "
                         "disk was full): its last events may be missing")
        role = _header_role(header, recorded)
        life: dict[str, Any] = {}
        for rec in records:
            kind = rec[0] if isinstance(rec[0], str) else repr(rec[0])
            try:
                _, f = fields_of(rec)
                if kind == "role":
                    role = f["role"]
                elif kind == "process_start":
                    life["start_ns"] = f["t_ns"]
                elif kind == "process_exit":
                    life["exit_ns"] = f["t_ns"]
                elif kind == "cuda_init":
                    life["cuda_device"] = f["device"]
                elif kind == "loader":
                    lists["loaders"].append(LoaderRecord(f["loader_id"], pid, f["created_ns"], f["site"], f["config"],
                                                         f["overrides"], list(f.get("stack") or [])))
                elif kind in _BY_NAME:
                    name, record_type = _BY_NAME[kind]
                    extra = {} if record_type is WorkerStartRecord else {"pid": pid}  # a worker names its own pid
                    lists[name].append(_record(record_type, f, **extra))
                elif kind == "fetch":
                    lists["fetches"].append(_record(FetchRecord, {**f, "timed": bool(f.get("timed", True))}, pid=pid))
                elif kind == "exception":
                    lists["errors"].append(ErrorRecord("main", pid, f["t_ns"], f["type"], f["message"], f["location"],
                                                       f["traceback"]))
                elif kind == "fetch_error":
                    lists["errors"].append(ErrorRecord("worker", pid, f["t_ns"], f["type"], f["message"],
                                                       _last_frame(f["traceback"]), f["traceback"], f["loader_id"],
                                                       f["worker"]))
                elif kind == "batch_info":
                    batch_info.append({"loader_id": f["loader_id"], "iter_id": f["iter_id"], **f["info"]})
                elif kind == "framework_args":
                    framework_args.append({"pid": pid, **f})
                elif kind == "calibration" and isinstance(f.get("values"), dict):
                    calibrations.append({"pid": pid, "kind": f["kind"], **f["values"]})
                elif kind == "tracker_run":
                    tracker_runs.append({**f["run"], "pid": pid, "tracker": f["tracker"], "t_ns": f["t_ns"]})
                elif kind == "stack_samples":
                    sampler = f.get("sampler")  # absent in events recorded before it was
                    for loader_id, stage, frames, count in f["samples"]:
                        key = (pid, loader_id, stage, tuple(frames), sampler)
                        stack_counts[key] = stack_counts.get(key, 0) + int(count)
                    if sampler == "thread" and f["samples"]:
                        pids = thread_sampled.setdefault(str(f.get("fallback_reason") or "reason not recorded"), [])
                        if pid not in pids:
                            pids.append(pid)
                elif kind in _COMPUTE_FACTS and isinstance(f.get("info"), dict):
                    extra = {"optimizer": f["optimizer"], "optimizer_kind": f["kind"]} if "optimizer" in f else {}
                    compute_facts.append({"pid": pid, "kind": kind.removesuffix("_info"), "t_ns": f["t_ns"],
                                          **extra, **f["info"]})
                elif kind == "op_window":
                    op_windows.append({"pid": pid, **f})
                elif kind == "step_samples":  # the training step's own lines: stage compute, no loader
                    for part, frames, count in f["samples"]:
                        key = (pid, -1, f"compute:{part}", tuple(frames), "thread")
                        stack_counts[key] = stack_counts.get(key, 0) + int(count)
                elif kind == "stack_sampler_off":
                    sampler_off.setdefault(str(f["reason"]), []).append(pid)
                elif kind == "lmdb_open":
                    lmdb_opens.append({"pid": f["pid"], "t_ns": f["t_ns"], "path": f["path"]})
                elif kind == "shared_connection":
                    shared_connections.append({"pid": f["pid"], "t_ns": f["t_ns"], "opened_by": f["opened_by"],
                                               "address": f["address"]})
                elif kind == "rank":
                    known = ranks.get(pid)
                    ranks[pid] = RankRecord(pid, f["rank"], f["local_rank"], f["world_size"], f["node_rank"], f["host"],
                                            known.backend if known else None,
                                            known.init_start_ns if known else None,
                                            known.init_end_ns if known else None, f.get("job"), f.get("store"))
                elif kind == "pg_init":
                    known = ranks.get(pid) or RankRecord(pid, f["rank"], -1, f["world_size"], -1,
                                                         str(header.get("host", "?")))
                    ranks[pid] = RankRecord(pid, f["rank"], known.local_rank, f["world_size"], known.node_rank,
                                            known.host, f["backend"], f["start_ns"], f["end_ns"], known.job,
                                            known.store)
                elif kind == "coll":
                    lists["collectives"].append(CollectiveRecord(f["op"], f["seq"], f["start_ns"], f["end_ns"], pid,
                                                                 f["group_size"], not f["is_async"]))
                elif kind == "ddp_wait":
                    lists["collectives"].append(CollectiveRecord("ddp.allreduce", -1, f["computed_ns"],
                                                                 f["returned_ns"], pid, enter_ns=f["started_ns"]))
                elif kind == "ddp":  # one gradient bucket (sessions recorded before ddp_wait)
                    lists["collectives"].append(CollectiveRecord("ddp.allreduce", -1, f["launched_ns"], f["done_ns"],
                                                                 pid, blocking=False, bucket=f["bucket"]))
                elif kind == "gpu_span_lost":
                    notes.append(f"{f['count']} CUDA-event timings of process {pid} were not resolved and are missing")
                elif kind == "step_limit":
                    step_limit_hit = True
                elif kind == "signal":
                    notes.append(f"process {pid} received {f['signal']}")
            except (TypeError, KeyError):
                notes.append(f"malformed {kind!r} event from process {pid} skipped")
        ended_unrecorded = "exit_ns" not in life and not any(r[0] == "signal" for r in records)
        if role == "main" and ended_unrecorded:
            notes.append(f"the script's process {pid} ended without writing out its last events (killed "
                         "outright, like SIGKILL or the OOM killer): up to its last 0.5 s may be missing")
        elif role == "child" and ended_unrecorded and (header.get("role") == "main" or "start_ns" in life):
            cut_short.add(pid)  # a child that records its own exit did not: said below if it is the training one
        lists["processes"].append(ProcessRecord(pid, int(header.get("ppid", -1)), role,
                                                list(header.get("argv", [])), int(header["wall_ns"]),
                                                int(header["mono_ns"]), _owner(header, pid), **life))
    sort_in_time(lists)
    for reason, pids in sampler_off.items():
        notes.append(f"stack sampling did not run in process{'es' if len(pids) > 1 else ''} "
                     f"{', '.join(map(str, pids))} ({reason}): no hotspots from {'them' if len(pids) > 1 else 'it'}")
    if thread_sampled:
        notes.append(thread_sampler_note(thread_sampled))
    ended_by = meta["ended_by"]
    if step_limit_hit and ended_by == "exit":
        ended_by = "steps"
    session = Session(
        schema=SESSION_SCHEMA,
        run_id=meta["run_id"],
        command=meta["command"],
        cwd=meta["cwd"],
        started_wall=meta["started_wall"],
        start_ns=meta["start_ns"],
        end_ns=meta["end_ns"],
        exit_code=meta["exit_code"],
        ended_by=ended_by,
        overrides=meta.get("overrides", {}),
        max_steps=meta.get("max_steps"),
        environment=meta.get("environment", {}),
        checks=meta.get("checks", []),
        system_samples=meta.get("system_samples", {}),
        pauses=list(meta.get("pauses") or []),
        windows=run.rows,
        recording=run.recording(),
        notes=notes + meta.get("notes", []),
        batch_info=batch_info,
        lmdb_opens=lmdb_opens,
        shared_connections=shared_connections,
        framework_args=framework_args,
        tracker_runs=sorted(tracker_runs, key=lambda r: r["t_ns"]),
        calibrations=calibrations,
        compute_facts=compute_facts,
        op_windows=op_windows,
        stack_samples=[_stack_row(pid, loader_id, stage, frames, sampler, n)
                       for (pid, loader_id, stage, frames, sampler), n in stack_counts.items()],
        ranks=sorted(ranks.values(), key=lambda r: (r.rank, r.pid)),
        **lists,
    )
    if session.main_pid in cut_short:
        session.notes.append(f"the training process {session.main_pid} ended without writing out its last events "
                             "(killed outright, like SIGKILL or the OOM killer): up to its last 0.5 s may be missing")
    return session


def thread_sampler_note(reasons: dict[str, list[int]]) -> str:
    """One note for every process whose stacks the thread sampler took (``reasons``: why it ran -> pids): its
    samples lean toward where the fetching thread releases the GIL, so hotspot shares are read with that in mind."""
    pids = sorted({pid for found in reasons.values() for pid in found})
    named = ", ".join(map(str, pids[:6])) + (f" and {len(pids) - 6} more" if len(pids) > 6 else "")
    why = "; ".join(sorted(reasons))
    return (f"stack samples of process{'es' if len(pids) > 1 else ''} {named} were taken by the "
            f"thread sampler ({why}): it is biased toward points where the fetching thread releases the GIL (a "
            "library call, a read), so a pure-Python line's share of its stage can be understated and the call "
            "after it overstated")


def _header_role(header: dict[str, Any], recorded: set[int]) -> str:
    """The role a process's header names, except that a ``main`` whose parent recorded events is a child the
    script forked (``os.fork``, a ``multiprocessing`` fork): it inherited the role, but only the process stallscope
    started is the script's own."""
    role = str(header.get("role", "child"))
    if role == "main" and int(header.get("ppid", -1)) in recorded:
        return "child"
    return role


def _record(kind: type, values: dict[str, Any], **extra: Any) -> Any:
    """A record dataclass from an event's named fields: fields it lacks take their defaults, and a
    missing required one raises TypeError (the event is reported as malformed)."""
    names = _field_names(kind)
    return kind(**{k: v for k, v in values.items() if k in names}, **extra)


@functools.cache
def _field_names(kind: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(kind))


def _owner(header: dict[str, Any], pid: int) -> int | None:
    """The rank process a process works for (its DataLoader workers), from the inherited environment."""
    try:
        owner = int(header.get("owner") or 0)
    except (TypeError, ValueError):
        return None
    return owner if owner and owner != pid else None


def _last_frame(tb: str) -> str | None:
    for line in reversed(tb.splitlines()):
        line = line.strip()
        if line.startswith('File "'):
            try:
                path = line.split('"')[1]
                lineno = line.split("line ")[1].split(",")[0]
                return f"{path}:{lineno}"
            except IndexError:
                return None
    return None


class RecoveryError(ValueError):
    """A run directory that cannot be rebuilt into a session (no run.json, or its run still in progress)."""


def recover_session(run_dir: Path, *, running: bool = False) -> Session:
    """Rebuild the session of a run whose launcher ended before saving it (killed, or the disk was full),
    from its ``run.json`` and raw event files. What only the launcher knew is inferred and said so: the
    exit code from the main process's last events, the end from the event files' last writes; the
    system samples are those the launcher last saved as the run went (every ``folding.SAMPLES_SAVE_S``).
    ``running``: a run still in progress is read as it stands (the summary so far, ``ended_by`` "running"),
    without writing anything into its folder; otherwise it raises RecoveryError."""
    try:
        meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RecoveryError(f"{run_dir} cannot be rebuilt: no readable run.json ({exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("run_id"), str):
        raise RecoveryError(f"{run_dir} cannot be rebuilt: run.json is not a stallscope run description")
    if in_progress(run_dir, meta):
        if not running:
            raise RecoveryError(f"{run_dir} is a run still in progress (stallscope process "
                                f"{meta.get('launcher_pid')}); report it once it has ended")
        return _session_so_far(run_dir, meta)
    run = read_run(run_dir)
    processes = _read_events(run)
    recorded = {int(f.header["pid"]) for f in processes}
    main = next((f for f in processes if _header_role(f.header, recorded) == "main"), None)
    ends = [f.last_write_ns for f in processes]
    start_ns = meta.get("start_ns")
    if not isinstance(start_ns, int):
        start_ns = min((int(f.header["mono_ns"]) for f in processes), default=0)
    end_ns = max([start_ns, *ends])
    ending = _recorded_ending(run_dir)
    if ending is not None:  # the launcher saw the end but could not save the session (a full disk)
        exit_code = ending["exit_code"]
        end_ns = ending["end_ns"] if isinstance(ending.get("end_ns"), int) else end_ns
        pauses = ending.get("pauses")
        if isinstance(pauses, list):
            meta = {**meta, "pauses": [p for p in pauses if isinstance(p, dict)
                                       and isinstance(p.get("start_ns"), int) and isinstance(p.get("end_ns"), int)]}
        why = (f"rebuilt from raw events: the session could not be saved when the run ended; the exit code "
               f"{exit_code} is the one stallscope recorded then")
    else:
        exit_code, how = _inferred_exit(main.records if main else [])
        why = (f"rebuilt from raw events: stallscope ended before the script did (killed, or the session could not "
               f"be saved); the exit code {exit_code} is inferred ({how})")
    samples, said = _samples_left(run_dir, end_ns)
    meta = {**meta, "start_ns": start_ns, "end_ns": end_ns, "exit_code": exit_code, "ended_by": "recovered",
            "notes": [*meta.get("notes", []), f"{why}; {said}"], **({"system_samples": samples} if samples else {})}
    return build_session(run_dir, meta, run)


def in_progress(run_dir: Path, meta: dict[str, Any]) -> bool:
    """Whether a launcher still records the run: it holds the lock, or its process lives on this host."""
    launcher = meta.get("launcher_pid")
    return _locked(run_dir / "run.json") or (
        isinstance(launcher, int) and launcher != os.getpid() and _alive(launcher) and _same_host(meta))


def _session_so_far(run_dir: Path, meta: dict[str, Any]) -> Session:
    """The session of a run still going, up to now: read, never written (``folding.read_run``)."""
    run = read_run(run_dir)
    recorded_start = meta.get("start_ns")
    start_ns: int = recorded_start if isinstance(recorded_start, int) else min(
        (int(h["mono_ns"]) for h in run.headers.values()), default=0)
    end_ns: int = max([start_ns, *run.last_write.values()])
    if _same_host(meta):
        end_ns = max(end_ns, time.perf_counter_ns())
    samples, said = _samples_left(run_dir, end_ns)
    note = ("the run is still going: this is its summary so far, read from its events without changing them; the "
            f"exit code is not known yet (-1); {said}")
    meta = {**meta, "start_ns": start_ns, "end_ns": end_ns, "exit_code": -1, "ended_by": "running",
            "notes": [*meta.get("notes", []), note], **({"system_samples": samples} if samples else {})}
    return build_session(run_dir, meta, run)


def _samples_left(run_dir: Path, end_ns: int) -> tuple[dict[str, Any] | None, str]:
    """The system samples the launcher saved as the run went (``folding.saved_samples``), and what the note says of
    them."""
    samples = saved_samples(run_dir)
    ticks = samples.get("t_ns") if samples else None
    if not ticks:
        return None, "no system samples"
    before = max(0.0, (end_ns - int(ticks[-1])) / 1e9)
    return samples, f"system samples up to {before:.0f} s before its end (saved as it ran)"


def _recorded_ending(run_dir: Path) -> dict[str, Any] | None:
    """How the run ended, where the launcher could write it (``launcher.write_ending``); None: not written (the
    launcher was killed) or unreadable."""
    try:
        ending = json.loads((run_dir / "ending.json").read_text(encoding="utf-8") or "null")
    except (OSError, ValueError):
        return None
    return ending if isinstance(ending, dict) and isinstance(ending.get("exit_code"), int) else None


def _inferred_exit(records: list[list[Any]]) -> tuple[int, str]:
    kinds = {r[0]: r for r in records if r and isinstance(r[0], str)}
    if "signal" in kinds:
        name = str(kinds["signal"][-1])
        number = getattr(signal.Signals, name, None) if name in signal.Signals.__members__ else None
        if number is not None:
            return 128 + int(number), f"the script received {name}"
    if "exception" in kinds:
        return 1, "the script raised an uncaught exception"
    if "process_exit" in kinds:
        status = kinds["process_exit"][2] if len(kinds["process_exit"]) > 2 else None
        if isinstance(status, int):
            return status, "the script called os._exit"
        return 0, "the script reached its normal exit; a code set by sys.exit is not recorded"
    return 128 + signal.SIGKILL, "no exit was recorded: killed outright, like SIGKILL"


def _locked(run_json: Path) -> bool:
    """Whether a launcher holds the run's lock (``launcher._in_progress``)."""
    try:
        import fcntl

        with open(run_json, "rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except (ImportError, OSError):
        return False
    return False


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live stallscope launcher (a reused pid of another program is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        return b"stallscope" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc to ask: assume it is


def _same_host(meta: dict[str, Any]) -> bool:
    environment = meta.get("environment")
    host = environment.get("hostname") if isinstance(environment, dict) else None
    return host is None or host == platform.node()


def _stack_row(pid: int, loader_id: int, stage: str, frames: tuple[str, ...], sampler: str | None, count: int
               ) -> dict[str, Any]:
    """One ``Session.stack_samples`` row; the training step's samples (``compute:PART``) carry their part."""
    row: dict[str, Any] = {"pid": pid, "loader_id": loader_id, "stage": stage, "frames": list(frames), "count": count}
    if stage.startswith("compute:"):
        row["stage"], row["part"] = "compute", stage.split(":", 1)[1]
    if sampler:
        row["sampler"] = sampler
    return row
