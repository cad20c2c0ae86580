"""Turn the per-process event files of a run directory into a Session.

The event kinds and their fields are written by ``stallscope.record``; this is the only place
that reads them. Unknown kinds are ignored (a newer recorder may add some) and a truncated last
line (a process killed mid-write) is skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stallscope.constants import SESSION_SCHEMA
from stallscope.session import (
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


def build_session(run_dir: Path, meta: dict[str, Any]) -> Session:
    lists: dict[str, list[Any]] = {k: [] for k in (
        "processes", "loaders", "iters", "nexts", "stops", "sends", "fetches", "worker_starts",
        "optimizer_steps", "pins", "transfers", "errors", "collectives", "gpu_spans")}
    ranks: dict[int, RankRecord] = {}
    notes: list[str] = []
    batch_info: list[dict[str, Any]] = []
    lmdb_opens: list[dict[str, Any]] = []
    step_limit_hit = False
    for header, records in read_event_files(run_dir / "events"):
        pid = int(header["pid"])
        role = header.get("role", "child")
        for rec in records:
            kind, fields = rec[0], rec[1:]
            try:
                if kind == "role":
                    role = fields[0]
                elif kind == "loader":
                    lists["loaders"].append(LoaderRecord(fields[0], pid, fields[1], fields[2], fields[3], fields[4]))
                elif kind == "iter":
                    lists["iters"].append(IterRecord(*fields[:6], pid=pid))
                elif kind == "next":
                    lists["nexts"].append(NextRecord(*fields[:7], pid=pid,
                                                     unpickle_ns=fields[7] if len(fields) > 7 else 0,
                                                     unpickle_cpu_ns=fields[8] if len(fields) > 8 else 0))
                elif kind == "stop":
                    lists["stops"].append(StopRecord(*fields[:5], pid=pid))
                elif kind == "send":
                    lists["sends"].append(SendRecord(*fields[:6], pid=pid))
                elif kind == "fetch":
                    lists["fetches"].append(FetchRecord(*fields[:12], pid=pid,
                                                       timed=bool(fields[12]) if len(fields) > 12 else True))
                elif kind == "worker_start":
                    lists["worker_starts"].append(WorkerStartRecord(*fields[:8]))
                elif kind == "opt":
                    lists["optimizer_steps"].append(OptimizerStepRecord(*fields[:4], pid=pid))
                elif kind == "pin":
                    lists["pins"].append(PinRecord(*fields[:3], pid=pid))
                elif kind == "h2d":
                    lists["transfers"].append(TransferRecord(*fields[:6], pid=pid))
                elif kind == "exception":
                    t, typ, msg, loc, tb = fields[:5]
                    lists["errors"].append(ErrorRecord("main", pid, t, typ, msg, loc, tb))
                elif kind == "fetch_error":
                    lid, _iter, worker, _pid, t, typ, msg, tb = fields[:8]
                    lists["errors"].append(ErrorRecord("worker", pid, t, typ, msg, _last_frame(tb), tb, lid, worker))
                elif kind == "batch_info":
                    batch_info.append({"loader_id": fields[0], "iter_id": fields[1], **fields[2]})
                elif kind == "lmdb_open":
                    lmdb_opens.append({"pid": fields[0], "t_ns": fields[1], "path": fields[2]})
                elif kind == "rank":
                    rank, local_rank, world, node_rank, host = fields[:5]
                    known = ranks.get(pid)
                    ranks[pid] = RankRecord(pid, rank, local_rank, world, node_rank, host,
                                            known.backend if known else None,
                                            known.init_start_ns if known else None,
                                            known.init_end_ns if known else None)
                elif kind == "pg_init":
                    backend, rank, world, t0, t1 = fields[:5]
                    known = ranks.get(pid) or RankRecord(pid, rank, -1, world, -1, str(header.get("host", "?")))
                    ranks[pid] = RankRecord(pid, rank, known.local_rank, world, known.node_rank, known.host,
                                            backend, t0, t1)
                elif kind == "coll":
                    op, seq, group_size, is_async, t0, t1 = fields[:6]
                    lists["collectives"].append(CollectiveRecord(op, seq, t0, t1, pid, group_size, not is_async))
                elif kind == "ddp_wait":
                    started, computed, returned = fields[:3]
                    lists["collectives"].append(CollectiveRecord("ddp.allreduce", -1, computed, returned, pid,
                                                                 enter_ns=started))
                elif kind == "ddp":  # one gradient bucket (sessions recorded before ddp_wait)
                    bucket, launched, done = fields[:3]
                    lists["collectives"].append(CollectiveRecord("ddp.allreduce", -1, launched, done, pid,
                                                                 blocking=False, bucket=bucket))
                elif kind == "gpu_span":
                    lists["gpu_spans"].append(GpuSpanRecord(*fields[:6], pid=pid))
                elif kind == "gpu_span_lost":
                    notes.append(f"{fields[0]} CUDA-event timings of process {pid} were not resolved and are missing")
                elif kind == "step_limit":
                    step_limit_hit = True
                elif kind == "signal":
                    notes.append(f"process {pid} received {fields[1]}")
            except (TypeError, IndexError):
                notes.append(f"malformed {kind!r} event from process {pid} skipped")
        lists["processes"].append(ProcessRecord(pid, int(header.get("ppid", -1)), role,
                                                list(header.get("argv", [])), int(header["wall_ns"]),
                                                int(header["mono_ns"]), _owner(header, pid)))
    for key in ("nexts", "fetches", "iters", "sends", "optimizer_steps", "pins", "transfers", "collectives", "gpu_spans"):
        lists[key].sort(key=lambda r: getattr(r, "start_ns", getattr(r, "t_ns", 0)))
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
        samples=meta.get("samples", {}),
        notes=notes + meta.get("notes", []),
        batch_info=batch_info,
        lmdb_opens=lmdb_opens,
        ranks=sorted(ranks.values(), key=lambda r: (r.rank, r.pid)),
        **lists,
    )


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
