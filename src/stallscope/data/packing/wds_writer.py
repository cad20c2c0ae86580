"""WebDataset sink: deterministic ustar shards, each renamed into place when full."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

SHARD_PATTERN = "shard-{:06d}.tar"


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    """Fixed metadata (mtime 0, root owner) so the same records always give the same bytes."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class ShardSink:
    """Writes ``<key>.<ext>`` and ``<key>.cls`` members, ``shard_size`` records per shard.

    A shard is written as ``.tar.tmp`` and renamed when complete, so a kill leaves only whole
    shards under their final names; the packer checkpoints at each shard boundary.
    """

    def __init__(self, work: Path, shard_size: int, first_shard: int) -> None:
        if shard_size < 1:
            raise ValueError("shard_size must be at least 1")
        self.work = work
        self.shard_size = shard_size
        self._shard = first_shard
        self._count = 0
        self._tar: tarfile.TarFile | None = None
        self._done: list[str] = [SHARD_PATTERN.format(i) for i in range(first_shard)]

    def _tmp_path(self) -> Path:
        """Where the current shard is written until ``commit`` renames it into place."""
        return self.work / (SHARD_PATTERN.format(self._shard) + ".tmp")

    def _open(self) -> tarfile.TarFile:
        if self._tar is None:
            self._tar = tarfile.open(self._tmp_path(), "w", format=tarfile.USTAR_FORMAT)
        return self._tar

    def add(self, key: str, data: bytes, ext: str, label: int) -> tuple[int, int]:
        tar = self._open()
        offset = tar.offset + tarfile.BLOCKSIZE  # ustar: one header block, then the data
        tar.addfile(_tarinfo(f"{key}.{ext}", len(data)), io.BytesIO(data))
        cls = str(label).encode("ascii")
        tar.addfile(_tarinfo(f"{key}.cls", len(cls)), io.BytesIO(cls))
        self._count += 1
        return self._shard, offset

    def should_checkpoint(self) -> bool:
        return self._count >= self.shard_size

    def commit(self) -> None:
        """Close the current shard and rename it into place (no-op when it is empty)."""
        if self._tar is None:
            return
        tmp = self._tmp_path()
        self._tar.close()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.work / SHARD_PATTERN.format(self._shard))
        self._done.append(SHARD_PATTERN.format(self._shard))
        self._tar = None
        self._shard += 1
        self._count = 0

    @property
    def shards(self) -> list[str]:
        return list(self._done)

    @property
    def next_shard(self) -> int:
        return self._shard

    def finalize(self, final_dir: Path) -> None:
        self.commit()
        for name in self._done:
            src = self.work / name
            if src.exists():
                os.replace(src, final_dir / name)

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._tar = None
