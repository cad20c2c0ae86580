"""``verify()``: recompute every record's checksum against the index, and check labels and counts.

A damaged LMDB file must be reported, never crash the checker: LMDB maps the file and trusts its
structure, so a truncated ``data.mdb`` faults (SIGBUS) on the first page past its end and a damaged
page can point anywhere. So the meta pages and the file's size are checked with plain reads first,
and the records are read in a child process whose crash is itself the finding.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from stallscope.data._lmdb import lmdb_env, lmdb_structure_problem
from stallscope.data.index import PackFormatError, PackIndex, checksum, load_index


@dataclass
class VerifyResult:
    path: Path
    format: str
    checked: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _verify_lmdb(path: Path, index: PackIndex, result: VerifyResult) -> None:
    """Check the file's structure, then read and checksum every record in a child process."""
    problem = lmdb_structure_problem(path / "data.mdb")
    if problem:
        result.errors.append(problem)
        return
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = package_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    done = subprocess.run([sys.executable, "-c", "from stallscope.data.packing.verify import _lmdb_child; "
                           "_lmdb_child()", str(path)], capture_output=True, text=True, env=env)
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        result.errors.append(f"data.mdb is damaged: reading it crashed ({name})")
        return
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        result.errors.append(f"data.mdb could not be checked: {tail}")
        return
    result.checked += found["checked"]
    result.errors.extend(found["errors"])


def _lmdb_child() -> None:
    """In the child: every record's checksum, printed as one JSON line; LMDB's own errors are findings."""
    import lmdb

    path = Path(sys.argv[1])
    result = VerifyResult(path, "lmdb")
    try:
        _read_lmdb(path, load_index(path), result)
    except lmdb.Error as exc:
        result.errors.append(f"data.mdb is damaged: {type(exc).__name__}: {exc}")
    print(json.dumps({"checked": result.checked, "errors": result.errors}))


def _read_lmdb(path: Path, index: PackIndex, result: VerifyResult) -> None:
    env = lmdb_env(path)
    with env.begin(buffers=False) as txn:
        stored = env.stat()["entries"]
        if stored != len(index.records):
            result.errors.append(f"data.mdb holds {stored} records, the index lists {len(index.records)}")
        for rec in index.records:
            data = txn.get(rec.key.encode("ascii"))
            result.checked += 1
            if data is None:
                result.errors.append(f"{rec.key} ({rec.source}): missing from data.mdb")
            elif len(data) != rec.size or checksum(data) != rec.checksum:
                result.errors.append(f"{rec.key} ({rec.source}): checksum mismatch (stored bytes differ)")


def _verify_shards(path: Path, index: PackIndex, result: VerifyResult) -> None:
    by_shard: dict[int, list] = {}
    for record in index.records:
        by_shard.setdefault(record.shard, []).append(record)
    for shard_no, name in enumerate(index.shards):
        expected = {rec.key: rec for rec in by_shard.get(shard_no, [])}
        seen: set[str] = set()
        shard_path = path / name
        if not shard_path.is_file():
            result.errors.append(f"{name}: missing shard")
            continue
        try:
            with tarfile.open(shard_path, "r:") as tar:
                for member in tar:
                    key, _, ext = member.name.partition(".")
                    rec = expected.get(key)
                    if rec is None:
                        result.errors.append(f"{name}: unexpected member {member.name}")
                        continue
                    member_file = tar.extractfile(member)
                    if member_file is None:  # a directory or link where a record's bytes should be
                        result.errors.append(f"{name}: member {member.name} is not a regular file")
                        continue
                    data = member_file.read()
                    if ext == "cls":
                        if data.strip() != str(rec.label).encode():
                            result.errors.append(f"{rec.key} ({rec.source}): label {data!r} != index {rec.label}")
                        continue
                    seen.add(key)
                    result.checked += 1
                    if len(data) != rec.size or checksum(data) != rec.checksum:
                        result.errors.append(f"{rec.key} ({rec.source}): checksum mismatch (stored bytes differ)")
                    elif member.offset_data != rec.offset:
                        result.errors.append(f"{rec.key}: at byte {member.offset_data}, index says {rec.offset}")
        except (tarfile.TarError, OSError) as exc:
            result.errors.append(f"{name}: unreadable tar ({exc})")
        for key in sorted(set(expected) - seen):
            result.errors.append(f"{key} ({expected[key].source}): missing from {name}")


def verify(path: str | os.PathLike[str]) -> VerifyResult:
    """Check a finished pack end to end; ``result.errors`` names every bad record.

    Raises :class:`PackFormatError` when ``path`` is not a finished pack at all.
    """
    path = Path(path)
    index = load_index(path)
    result = VerifyResult(path, index.format)
    if index.format == "lmdb":
        if not (path / "data.mdb").is_file():
            raise PackFormatError(f"{path}: data.mdb is missing")
        _verify_lmdb(path, index, result)
    else:
        _verify_shards(path, index, result)
    return result
