"""The index of a packed dataset: one entry per record, each with its checksum.

A pack directory holds the data (``data.mdb`` for LMDB, ``shard-NNNNNN.tar`` for WebDataset)
and ``stallscope-index.json``, written last. The index is what makes a pack trustworthy: the
reader takes labels and byte ranges from it, ``verify`` recomputes every checksum against
it, and its ``digest`` (a hash over all keys, labels and checksums, in order) is equal for
two packs with the same content however many times either was interrupted and resumed.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

INDEX_NAME = "stallscope-index.json"
SCHEMA = "stallscope.pack/1"
FORMATS = ("lmdb", "wds")


class PackFormatError(ValueError):
    """The path is not a complete stallscope pack (missing, partial, or another schema)."""


def checksum(data: bytes) -> str:
    """BLAKE2b-128 of a record's stored bytes: any flipped bit changes it."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def record_key(number: int) -> str:
    """Record keys sort in pack order and contain no dot (WebDataset splits names at the first dot)."""
    return f"s{number:09d}"


@dataclass(frozen=True)
class Record:
    """One stored image. ``shard``/``offset`` locate the bytes inside a tar shard (WebDataset only)."""

    key: str
    label: int
    size: int
    checksum: str
    ext: str
    width: int
    height: int
    source: str
    shard: int = -1
    offset: int = -1

    def to_row(self) -> list[Any]:
        return [self.key, self.label, self.size, self.checksum, self.ext, self.width, self.height,
                self.source, self.shard, self.offset]

    @classmethod
    def from_row(cls, row: list[Any]) -> Record:
        return cls(*row)


ROW_FIELDS = ["key", "label", "size", "checksum", "ext", "width", "height", "source", "shard", "offset"]


@dataclass(frozen=True)
class Problem:
    """A source file that was skipped (``action="skipped"``) or kept with a warning (``"kept"``)."""

    source: str
    kind: str
    detail: str
    action: str

    def line(self) -> str:
        return f"{self.action:7s} {self.kind:18s} {self.source}: {self.detail}"


def content_digest(records: list[Record]) -> str:
    h = hashlib.sha256()
    for r in records:
        h.update(f"{r.key}\t{r.label}\t{r.size}\t{r.checksum}\n".encode())
    return h.hexdigest()


@dataclass
class PackIndex:
    format: str
    classes: list[str]
    records: list[Record]
    problems: list[Problem] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    shards: list[str] = field(default_factory=list)
    source: str = ""

    @property
    def digest(self) -> str:
        return content_digest(self.records)

    def to_json(self) -> str:
        doc = {
            "schema": SCHEMA,
            "format": self.format,
            "count": len(self.records),
            "digest": self.digest,
            "classes": self.classes,
            "shards": self.shards,
            "source": self.source,
            "options": self.options,
            "problems": [asdict(p) for p in self.problems],
            "record_fields": ROW_FIELDS,
            "records": [r.to_row() for r in self.records],
        }
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, where: str = "index") -> PackIndex:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise PackFormatError(f"{where}: unreadable index ({exc})") from exc
        if doc.get("schema") != SCHEMA:
            raise PackFormatError(f"{where}: schema {doc.get('schema')!r}, expected {SCHEMA!r}")
        if doc.get("format") not in FORMATS:
            raise PackFormatError(f"{where}: unknown format {doc.get('format')!r}")
        records = [Record.from_row(row) for row in doc["records"]]
        index = cls(doc["format"], list(doc["classes"]), records,
                    [Problem(**p) for p in doc.get("problems", [])], dict(doc.get("options", {})),
                    list(doc.get("shards", [])), doc.get("source", ""))
        if doc.get("count") != len(records) or doc.get("digest") != index.digest:
            raise PackFormatError(f"{where}: the index does not match its own count/digest (edited or damaged)")
        return index

    def write(self, directory: Path) -> None:
        write_atomic(directory / INDEX_NAME, self.to_json().encode())


def load_index(path: str | os.PathLike[str]) -> PackIndex:
    """The index of the pack at ``path``; :class:`PackFormatError` if it is not a finished pack."""
    path = Path(path)
    if not path.exists():
        partial = path.with_name(path.name + ".partial")
        hint = (f" (an unfinished pack is in {partial}: rerun the same pack command to finish it)" if partial.exists()
                else "")
        raise PackFormatError(f"{path}: no such pack{hint}")
    if not (path / INDEX_NAME).is_file():
        raise PackFormatError(f"{path}: not a stallscope pack (no {INDEX_NAME}; an interrupted pack never has one)")
    return PackIndex.from_json((path / INDEX_NAME).read_text(), str(path))


def write_atomic(path: Path, data: bytes) -> None:
    """Write then rename, with an fsync, so a kill leaves either the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
