"""Turn the per-process event files of a run directory into a Session.

The event kinds and their fields are written by ``stallscope.record`` and named in
``record/schema.py``; this is the only place that reads them, by those names. Unknown kinds are ignored (a newer recorder may add some) and a truncated last
line (a process killed mid-write) is skipped.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from stallscope.constants import SESSION_SCHEMA
from stallscope.record.schema import fields_of
from stallscope.session import (
    RECORD_LISTS,
    CollectiveRecord,
    ErrorRecord,
    FetchRecord,
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
    StopRecord,
    TransferRecord,
    WorkerStartRecord,
    sort_in_time,
)


def read_event_files(events_dir: Path) -> list[tuple[dict[str, Any], list[list[Any]]]]:
    """[(header, records)] for every process that wrote events."""
    result = []
    for path in sorted(events_dir.glob("*.jsonl")):
        header: dict[str, Any] | None = None
        records: list[list[Any]] = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(item, dict) and "header" in item:
                    header = header or item["header"]
                elif isinstance(item, list) and item:
                    if isinstance(item[0], list):  # a line of records (a record starts with its kind)
                        records.extend(r for r in item if isinstance(r, list) and r)
                    else:
                        records.append(item)
        if header is not None:
            result.append((header, records))
    return result


#: Events whose named fields are their record's fields, one for one: kind -> (Session list, record type).
_BY_NAME: dict[str, tuple[str, type]] = {
    "iter": ("iters", IterRecord), "next": ("nexts", NextRecord), "stop": ("stops", StopRecord),
    "send": ("sends", SendRecord), "worker_start": ("worker_starts", WorkerStartRecord),
    "opt": ("optimizer_steps", OptimizerStepRecord), "pin": ("pins", PinRecord), "h2d": ("transfers", TransferRecord),
    "gpu_span": ("gpu_spans", GpuSpanRecord),
}


def build_session(run_dir: Path, meta: dict[str, Any]) -> Session:
    lists: dict[str, list[Any]] = {name: [] for name in RECORD_LISTS if name != "ranks"}
    ranks: dict[int, RankRecord] = {}
    notes: list[str] = []
    batch_info: list[dict[str, Any]] = []
    lmdb_opens: list[dict[str, Any]] = []
    step_limit_hit = False
    for header, records in read_event_files(run_dir / "events"):
        pid = int(header["pid"])
        role = header.get("role", "child")
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
                                                         f["overrides"]))
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
                elif kind == "lmdb_open":
                    lmdb_opens.append({"pid": f["pid"], "t_ns": f["t_ns"], "path": f["path"]})
                elif kind == "rank":
                    known = ranks.get(pid)
                    ranks[pid] = RankRecord(pid, f["rank"], f["local_rank"], f["world_size"], f["node_rank"], f["host"],
                                            known.backend if known else None,
                                            known.init_start_ns if known else None,
                                            known.init_end_ns if known else None)
                elif kind == "pg_init":
                    known = ranks.get(pid) or RankRecord(pid, f["rank"], -1, f["world_size"], -1,
                                                         str(header.get("host", "?")))
                    ranks[pid] = RankRecord(pid, f["rank"], known.local_rank, f["world_size"], known.node_rank,
                                            known.host, f["backend"], f["start_ns"], f["end_ns"])
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
        lists["processes"].append(ProcessRecord(pid, int(header.get("ppid", -1)), role,
                                                list(header.get("argv", [])), int(header["wall_ns"]),
                                                int(header["mono_ns"]), _owner(header, pid), **life))
    sort_in_time(lists)
    ended_by = meta["ended_by"]
    if step_limit_hit and ended_by == "exit":
        ended_by = "steps"
    return Session(
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
        notes=notes + meta.get("notes", []),
        batch_info=batch_info,
        lmdb_opens=lmdb_opens,
        ranks=sorted(ranks.values(), key=lambda r: (r.rank, r.pid)),
        **lists,
    )


def _record(kind: type, values: dict[str, Any], **extra: Any) -> Any:
    """A record dataclass from an event's named fields: fields it lacks take their defaults, and a
    missing required one raises TypeError (the event is reported as malformed)."""
    names = {f.name for f in dataclasses.fields(kind)}
    return kind(**{k: v for k, v in values.items() if k in names}, **extra)


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
