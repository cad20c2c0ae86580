"""LMDB sink: one write transaction per checkpoint, a compact copy at the end."""

from __future__ import annotations

import shutil
from pathlib import Path

#: Virtual size of the memory map; the file itself only grows as records arrive.
MAP_SIZE = 1 << 40


class LmdbSink:
    """Writes records under their keys into ``work/db``; re-putting a key after a resume is harmless.

    Keys are put in increasing order, so pages fill sequentially. The finished database is a
    compact copy (``mdb_env_copy2`` with compaction): no free pages, no lock file, and the
    content is independent of how many times the pack was interrupted.
    """

    def __init__(self, work: Path, commit_every: int = 512) -> None:
        import lmdb

        self._db_dir = work / "db"
        self._db_dir.mkdir(parents=True, exist_ok=True)
        self._env = lmdb.open(str(self._db_dir), map_size=MAP_SIZE, subdir=True, meminit=False,
                              readahead=False, max_dbs=0)
        self._txn = self._env.begin(write=True)
        self._pending = 0
        self.commit_every = commit_every

    def add(self, key: str, data: bytes, ext: str, label: int) -> tuple[int, int]:
        self._txn.put(key.encode("ascii"), data)
        self._pending += 1
        return -1, -1

    def should_checkpoint(self) -> bool:
        return self._pending >= self.commit_every

    def commit(self) -> None:
        """Make everything added so far durable (the transaction commits with an fsync)."""
        self._txn.commit()
        self._txn = self._env.begin(write=True)
        self._pending = 0

    @property
    def shards(self) -> list[str]:
        return []

    def finalize(self, final_dir: Path) -> None:
        """Write the compact copy ``final_dir/data.mdb``; idempotent if interrupted and rerun."""
        self.commit()
        self._txn.abort()
        target = final_dir / "data.mdb"
        if target.exists():
            target.unlink()
        self._env.copy(str(final_dir), compact=True)
        self._env.close()

    def close(self) -> None:
        try:
            self._txn.abort()
        finally:
            self._env.close()


def remove_work_db(work: Path) -> None:
    shutil.rmtree(work / "db", ignore_errors=True)
