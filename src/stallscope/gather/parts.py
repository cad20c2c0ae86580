"""Each node's part of a job, the notes that find the other nodes' parts in a shared store folder, and the merge of
what came (the package docstring says how the parts meet).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from stallscope import paths
from stallscope.analysis.ranks import job_of
from stallscope.merge import RENDEZVOUS_APART_S, merge_sessions, rendezvous_wall_ns
from stallscope.session import Session

JOBS = "jobs"


@dataclass(frozen=True)
class Part:
    """One node's share of a job: which ranks its session holds and where that session is."""
    job: str  # the launcher's words for the job (job_names.job_identity)
    world: int
    ranks: tuple[int, ...]
    host: str
    run_id: str
    session: str  # the session file, relative to the store folder
    met_wall_ns: int | None  # the wall clock at which its lowest rank left the rendezvous
    done_wall_ns: int
    address: str | None  # the job's store, ``MASTER_ADDR:MASTER_PORT``

    @classmethod
    def from_json(cls, text: str | bytes) -> Part:
        raw = json.loads(text)
        return cls(**{**raw, "ranks": tuple(raw["ranks"])})


@dataclass
class Gathered:
    """What gathering did on this node: ``merged`` is set on the node that merged (``path`` is where it saved the
    job's session); on the others ``lines`` say where the job's report is, or why there is none."""
    lines: list[str] = dataclasses.field(default_factory=list)
    merged: Session | None = None
    path: Path | None = None
    missing: list[int] = dataclasses.field(default_factory=list)


def part_of(session: Session, session_path: Path, store: Path, now_ns: int | None = None) -> Part | None:
    """This node's part of a larger job, or None where the session holds the whole job (or no rank at all)."""
    job = job_of(session)
    if job is None or job["world_size"] <= len(job["ranks_here"]):
        return None
    address = next((r.store for r in session.ranks if r.store), None)
    try:
        where = str(session_path.resolve().relative_to(store.resolve()))
    except ValueError:
        where = str(session_path.resolve())
    return Part(job["id"] or "", job["world_size"], tuple(job["ranks_here"]), session.ranks[0].host, session.run_id,
                where, rendezvous_wall_ns(session), time.time_ns() if now_ns is None else now_ns, address)


def job_folder(store: Path, job: str) -> Path:
    """``STORE/jobs/<job>``: the job's words made a file name."""
    return paths.store_folder(store, JOBS, re.sub(r"[^A-Za-z0-9._=-]+", "_", job)[:120] or "job")


def belongs(mine: Part, other: Part) -> bool:
    """Whether ``other`` is another node of ``mine``'s job, not a node of an earlier job under the same words (one
    that ended before this job's rendezvous, or met minutes apart)."""
    if other.run_id == mine.run_id or other.job != mine.job or other.world != mine.world:
        return False
    if set(other.ranks) & set(mine.ranks):
        return False
    if mine.met_wall_ns is not None and other.met_wall_ns is not None:
        if abs(mine.met_wall_ns - other.met_wall_ns) > RENDEZVOUS_APART_S * 1e9:
            return False
        if other.done_wall_ns < mine.met_wall_ns:
            return False
    return True


def peers_in_folder(folder: Path, mine: Part) -> list[Part]:
    """The notes other nodes of this job left in the folder, the latest per rank set."""
    found: dict[tuple[int, ...], Part] = {}
    for note in folder.glob("*.part.json"):
        try:
            part = Part.from_json(note.read_text())
        except (OSError, ValueError, TypeError, KeyError):
            continue  # a note being written, or not one of ours
        if belongs(mine, part) and (part.ranks not in found or found[part.ranks].done_wall_ns < part.done_wall_ns):
            found[part.ranks] = part
    return list(found.values())


def covers(parts: list[Part]) -> bool:
    ranks = [r for p in parts for r in p.ranks]
    return bool(parts) and len(ranks) == len(set(ranks)) and set(ranks) == set(range(parts[0].world))


def missing_ranks(parts: list[Part]) -> list[int]:
    have = {r for p in parts for r in p.ranks}
    return [r for r in range(parts[0].world) if r not in have]


def merge_parts(sessions: list[Session], parts: list[Part], waited_s: float) -> tuple[Session, list[int]]:
    """The job's session from what came; ranks that sent nothing are said in its notes."""
    merged = merge_sessions(sessions)
    missing = missing_ranks(parts)
    if missing:
        said = ", ".join(map(str, missing))
        merged = dataclasses.replace(merged, notes=[*merged.notes, (
            f"rank{'s' if len(missing) > 1 else ''} {said} of the job's {parts[0].world} sent no session within "
            f"{waited_s:.0f} s: {'their node' if len(missing) > 1 else 'its node'} died or was killed, or could not "
            "reach the job's address; what it recorded, if anything, is in that node's own store")])
    return merged, missing


def _lock(folder: Path, parts: list[Part]) -> Path | None:
    """The right to merge, taken once per job in a shared folder (O_EXCL): None where another node holds it."""
    lowest = min(parts, key=lambda p: p.ranks[0])
    lock = folder / f"{lowest.run_id}.merging"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return None
    return lock


def save_merged(folder: Path, merged: Session) -> Path:
    return merged.save(folder / f"{merged.run_id}.session.json")


def merge_from_folder(store: Path, folder: Path, parts: list[Part]) -> Gathered:
    """The last node in a shared folder: read every node's session from the store and merge them."""
    if _lock(folder, parts) is None:
        return Gathered([f"another node of the job is merging it in {folder}"])
    sessions = [Session.load(store / p.session if not os.path.isabs(p.session) else p.session) for p in parts]
    merged, missing = merge_parts(sessions, parts, 0.0)
    return Gathered([], merged, save_merged(folder, merged), missing)


def shared_folder(store: Path, folder: Path, parts: list[Part]) -> Gathered:
    if covers(parts):
        return merge_from_folder(store, folder, parts)
    waiting = ", ".join(map(str, missing_ranks(parts)))
    return Gathered([f"the store folder is shared by the job's nodes: the last to finish (rank(s) {waiting} are "
                     f"still running) merges the job into {folder}"])


def encode(part: Part, session_file: Path) -> bytes:
    """A node's share for the wire: its note as one JSON line, then its session, gzipped."""
    return json.dumps(dataclasses.asdict(part)).encode() + b"\n" + gzip.compress(session_file.read_bytes(), 5)


def decode(blob: bytes) -> tuple[Part, Session]:
    head, _, body = blob.partition(b"\n")
    return Part.from_json(head), Session.from_dict(json.loads(gzip.decompress(body)))


def describe(merged_parts: list[Part]) -> str:
    return ", ".join(f"{p.host} (rank{'s' if len(p.ranks) > 1 else ''} {', '.join(map(str, p.ranks))})"
                     for p in sorted(merged_parts, key=lambda p: p.ranks[0]))
