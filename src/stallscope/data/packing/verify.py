"""``verify()``: recompute every record's checksum against the index, and check labels and counts."""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from stallscope.data._lmdb import lmdb_env
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
    for rec in index.records:
        by_shard.setdefault(rec.shard, []).append(rec)
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
                    data = tar.extractfile(member).read()
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
