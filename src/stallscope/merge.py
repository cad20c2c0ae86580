"""Combine the sessions of one multi-node job (one per node's launcher) into one Session.

Each node's launcher only knows its own monotonic clock, so the nodes' timelines are aligned from
the job's own synchronizations, not assumed. An operation that no rank can leave before every rank
entered it (``init_process_group``'s rendezvous, a ``barrier``, a blocking ``all_reduce``, a DDP
model's ``backward``, which hands its gradient buckets over and returns once all are reduced: entered
at its start) bounds the offset ``d`` of node B's clock against node A's: B left after A entered and
A left after B entered, so ``start_B - end_A <= d <= end_B - start_A``. The bounds of every matched operation are
intersected and the middle of what is left is the offset; its half-width is the stated uncertainty. Operations are
matched by their order in each process (ranks of one group call collectives in the same order).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from stallscope.environment import recorded_cpu_capacity, recorded_usable_cpus
from stallscope.session import CLOCK_FIELDS, PID_FIELDS, RECORD_LISTS, Session, sort_in_time


class MergeError(ValueError):
    """The sessions cannot be one job (overlapping ranks, no rank records)."""


def sync_points(session: Session) -> dict[tuple[int, str, int], tuple[int, int]]:
    """(rank, stream, index) -> (enter, leave) of each operation every rank leaves only after all entered."""
    rank_of = {r.pid: r.rank for r in session.ranks}
    points: dict[tuple[int, str, int], tuple[int, int]] = {}
    for r in session.ranks:
        if r.init_start_ns is not None and r.init_end_ns is not None:
            points[(r.rank, "init", 0)] = (r.init_start_ns, r.init_end_ns)
    counters: dict[tuple[int, str], int] = {}
    for c in session.collectives:
        rank = rank_of.get(c.pid)
        if rank is None:
            continue
        if c.op == "ddp.allreduce":
            stream = "ddp"
        elif c.blocking and c.op != "wait" and c.group_size in (-1, _world(session)):
            stream = "coll"
        else:
            continue
        index = counters.get((rank, stream), 0)
        counters[(rank, stream)] = index + 1
        points[(rank, stream, index)] = (c.start_ns if c.enter_ns is None else c.enter_ns, c.end_ns)
    return points


def _world(session: Session) -> int:
    return max((r.world_size for r in session.ranks), default=-1)


def clock_offset(reference: Session, other: Session) -> tuple[int, int, int]:
    """(offset, lower bound, upper bound) in ns to subtract from ``other``'s clock to land on ``reference``'s."""
    ref_points, other_points = sync_points(reference), sync_points(other)
    ref_by_op: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for (_, stream, index), span in ref_points.items():
        ref_by_op.setdefault((stream, index), []).append(span)
    low, high = -(1 << 62), 1 << 62
    matched = 0
    for (_, stream, index), (b_in, b_out) in other_points.items():
        for a_in, a_out in ref_by_op.get((stream, index), []):
            low, high = max(low, b_in - a_out), min(high, b_out - a_in)
            matched += 1
    if not matched:
        raise MergeError("no synchronization shared by the two sessions: record the nodes of one job "
                         "(each with its ranks' init_process_group)")
    if low > high:  # a mismatched pair: fall back to the init rendezvous alone
        inits = [(ref_points[k], other_points[j]) for k in ref_points for j in other_points
                 if k[1] == j[1] == "init"]
        low = max(b[0] - a[1] for a, b in inits) if inits else low
        high = min(b[1] - a[0] for a, b in inits) if inits else high
    return (low + high) // 2, low, high


def _shift(record: Any, offset: int, pids: dict[int, int]) -> Any:
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name in CLOCK_FIELDS and isinstance(value, int):
            changes[f.name] = value - offset
        elif f.name in PID_FIELDS and isinstance(value, int) and value in pids:
            changes[f.name] = pids[value]
    return dataclasses.replace(record, **changes) if changes else record


#: Lists of plain dicts with a pid and points on its clock: each node's kept, shifted and renumbered as records are.
DICT_LISTS = ("compute_facts", "op_windows", "windows")
_DICT_CLOCK_KEYS = ("t_ns", "start_ns", "opened_ns", "stop_ns", "end_ns")


def _shift_dict(row: dict[str, Any], offset: int, pids: dict[int, int]) -> dict[str, Any]:
    changes: dict[str, Any] = {k: row[k] - offset for k in _DICT_CLOCK_KEYS if isinstance(row.get(k), int)}
    if row.get("pid") in pids:
        changes["pid"] = pids[row["pid"]]
    return {**row, **changes}


#: Nodes of one job leave its rendezvous at one moment; their wall clocks (NTP) agree far closer than this.
RENDEZVOUS_APART_S = 120


def _job_words(session: Session) -> dict[str, str]:
    words: dict[str, str] = {}
    for r in session.ranks:
        for word in (r.job or "").split():
            key, _, value = word.partition("=")
            words.setdefault(key, value)
    return words


def rendezvous_wall_ns(session: Session) -> int | None:
    """The wall clock at which the session's lowest rank left ``init_process_group``."""
    starts = {p.pid: p for p in session.processes}
    for r in sorted(session.ranks, key=lambda r: r.rank):
        proc = starts.get(r.pid)
        if r.init_end_ns is not None and proc is not None and proc.wall_ns:
            return proc.wall_ns + (r.init_end_ns - proc.mono_ns)
    return None


def _refuse_other_jobs(ordered: Sequence[Session]) -> None:
    """Sessions of different jobs merge into nonsense (a clock offset of minutes, a straggler that is not one):
    refuse where the world sizes, the launcher's job words (``job_identity``) or the moment each left the
    rendezvous (by the nodes' wall clocks) disagree."""
    reference = ordered[0]
    world, words, met = _world(reference), _job_words(reference), rendezvous_wall_ns(reference)
    for s in ordered[1:]:
        if _world(s) != world:
            raise MergeError(f"{reference.run_id} is a job of {world} ranks and {s.run_id} one of {_world(s)}: "
                             "not the nodes of one job")
        theirs = _job_words(s)
        differ = sorted(k for k in words.keys() & theirs.keys() if words[k] != theirs[k])
        if differ:
            said = ", ".join(f"{k} {words[k]} against {theirs[k]}" for k in differ)
            raise MergeError(f"{reference.run_id} and {s.run_id} are different jobs to their launchers ({said}): "
                             "merge the sessions of one job's nodes")
        other = rendezvous_wall_ns(s)
        if met is not None and other is not None and abs(other - met) > RENDEZVOUS_APART_S * 1e9:
            raise MergeError(f"{reference.run_id} and {s.run_id} left their rendezvous {abs(other - met) / 1e9:.0f} s "
                             "apart by their wall clocks: the nodes of one job leave it together, so these are "
                             "different runs")


def merge_sessions(sessions: Sequence[Session], run_id: str | None = None) -> Session:
    """One Session for the whole job: ranks numbered as the job numbered them, clocks on the first
    node's (the one holding the lowest rank), process ids made unique across nodes."""
    if not sessions:
        raise MergeError("nothing to merge")
    for s in sessions:
        if not s.ranks:
            raise MergeError(f"session {s.run_id} has no ranks: record it with `stallscope run -- torchrun ...`")
    ordered = sorted(sessions, key=lambda s: min(r.rank for r in s.ranks))
    seen: dict[int, str] = {}
    for s in ordered:
        for rank in {r.rank for r in s.ranks}:
            if rank in seen:
                raise MergeError(f"rank {rank} is in both {seen[rank]} and {s.run_id}: not the nodes of one job")
            seen[rank] = s.run_id
    _refuse_other_jobs(ordered)
    reference = ordered[0]
    used_pids: set[int] = set()
    lists: dict[str, Any] = {name: [] for name in (*RECORD_LISTS, *DICT_LISTS)}  # passed to replace() by name
    alignment: list[dict[str, Any]] = []
    starts, ends, notes = [], [], []
    pauses: list[dict[str, int]] = []  # each node's Ctrl-Z stops, on the reference's clock
    recording: dict[str, Any] = {}  # each node's folded spans (a long run), on the reference's clock
    for node, s in enumerate(ordered):
        offset, low, high = (0, 0, 0) if s is reference else clock_offset(reference, s)
        pauses += [{"start_ns": p["start_ns"] - offset, "end_ns": p["end_ns"] - offset} for p in s.pauses]
        own_pids = {p.pid for p in s.processes} | {r.pid for r in s.ranks}
        pids = {}
        for pid in sorted(own_pids):
            new = pid
            while new in used_pids:
                new += 1 << 22  # above Linux's pid_max: cannot collide with a real pid of this node
            pids[pid] = new
            used_pids.add(new)
        pids = {k: v for k, v in pids.items() if k != v}
        for name in RECORD_LISTS:
            lists[name].extend(_shift(r, offset, pids) for r in getattr(s, name))
        for name in DICT_LISTS:
            lists[name].extend(_shift_dict(row, offset, pids) for row in getattr(s, name))
        _merge_recording(recording, s.recording, offset, pids)
        starts.append(s.start_ns - offset)
        ends.append(s.end_ns - offset)
        host = s.ranks[0].host if s.ranks else s.environment.get("hostname")
        alignment.append({"node": node, "run_id": s.run_id, "host": host, "offset_ns": offset,
                          "uncertainty_ns": (high - low) // 2, "ranks": sorted({r.rank for r in s.ranks}),
                          "pids_renumbered": len(pids),
                          # each node's own CPUs: the merged session keeps the first node's checks only
                          "usable_cpus": recorded_usable_cpus(s.environment, s.checks),
                          "cpus": recorded_cpu_capacity(s.environment, s.checks)})
        notes += [f"[{s.run_id}] {n}" for n in s.notes]
    sort_in_time(lists)
    lists["ranks"].sort(key=lambda r: (r.rank, r.pid))
    exit_codes = [s.exit_code for s in ordered]
    return dataclasses.replace(
        reference,
        run_id=run_id or f"{reference.run_id}+{len(ordered) - 1}",
        start_ns=min(starts), end_ns=max(ends),
        exit_code=next((c for c in exit_codes if c != 0), 0),
        ended_by=next((s.ended_by for s in ordered if s.exit_code != 0), reference.ended_by),
        notes=notes + [f"merged from {len(ordered)} node sessions: "
                       + ", ".join(f"{a['run_id']} (ranks {a['ranks']}, clock offset {a['offset_ns'] / 1e6:+.3f} ms"
                                   f" +/- {a['uncertainty_ns'] / 1e6:.3f})" for a in alignment)],
        clock_alignment=alignment,
        pauses=sorted(pauses, key=lambda p: p["start_ns"]),
        recording=recording,
        **lists,
    )


def _merge_recording(into: dict[str, Any], recording: dict[str, Any], offset: int, pids: dict[int, int]) -> None:
    """A node's ``Session.recording`` added to the job's: its folded spans shifted to the reference's clock (each
    rank's steps across any of them are left out, conservatively), its counts under the renumbered pids."""
    if not recording:
        return
    into.setdefault("window_ns", recording.get("window_ns"))
    shifted = [[a - offset, b - offset] for a, b in recording.get("folded", [])]
    into["folded"] = sorted([*into.get("folded", []), *shifted])
    kept = into.setdefault("kept_windows", {})
    for why, count in recording.get("kept_windows", {}).items():
        kept[why] = kept.get(why, 0) + count
    counts = into.setdefault("folded_counts", {})
    for pid, values in recording.get("folded_counts", {}).items():
        counts[str(pids.get(int(pid), int(pid)))] = values
