"""Read-only LMDB environments, one per process and database file."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

from stallscope.data.files import open_regular

_ENVS: dict[tuple[int, str], tuple[int, Any]] = {}  # (pid, folder) -> (inode, lmdb.Environment)

_LMDB_MAGIC = 0xBEEFC0DE
#: In a meta page (64-bit builds): page header 16 bytes, then magic, version, address, map size, the free
#: and main databases (48 bytes each; the free database's first 4 bytes hold the page size), last page, txn.
_META = struct.Struct("<16xII8xQ I44x 48x QQ")


def lmdb_structure_problem(data_mdb: Path) -> str | None:
    """What makes ``data_mdb`` unsafe to map, read with plain file reads: no valid meta page, or a file
    shorter than the pages its newest meta page says it holds (reading those pages would fault)."""
    metas = []
    with open_regular(data_mdb) as f:  # a FIFO or a device in its place is refused, not waited on or mapped
        size = os.fstat(f.fileno()).st_size
        head = f.read(_META.size)
        if len(head) < _META.size:
            return f"data.mdb is {size} bytes: too short for an LMDB file"
        page_size = _META.unpack(head)[3] or 4096
        for page in (0, 1):
            f.seek(page * page_size)
            raw = f.read(_META.size)
            if len(raw) == _META.size:
                magic, version, mapsize, psize, last_page, txnid = _META.unpack(raw)
                if magic == _LMDB_MAGIC and psize == page_size:
                    metas.append((txnid, last_page))
    if not metas:
        return "data.mdb has no valid LMDB meta page (its header is damaged)"
    _, last_page = max(metas)
    needed = (last_page + 1) * page_size
    if size < needed:
        return f"data.mdb is truncated: {size} bytes, its meta page says {needed} ({last_page + 1} pages)"
    return None


def lmdb_env(path: Path) -> Any:
    """The process's read-only environment for the pack at ``path``.

    LMDB forbids opening one file twice in a process, so datasets and ``verify`` share it.
    Environments inherited through a fork are closed, never used (their mmap and file
    descriptor belong to the parent). A pack rebuilt at the same path (new inode) is reopened.
    """
    import lmdb

    pid, where = os.getpid(), str(Path(path).resolve())
    inode = os.stat(os.path.join(where, "data.mdb")).st_ino
    for stale in [k for k in _ENVS if k[0] != pid]:
        # Inherited through fork: close the child's copy (unmaps only here; lock=False means no
        # shared reader slot). lmdb refuses to reopen a file it still counts as open.
        try:
            _ENVS.pop(stale)[1].close()
        except Exception:  # noqa: BLE001 - a broken inherited handle must not stop the worker
            pass
    cached = _ENVS.get((pid, where))
    if cached is not None:
        if cached[0] == inode:
            return cached[1]
        cached[1].close()
    problem = lmdb_structure_problem(Path(where) / "data.mdb")
    if problem:  # mapping it would fault (SIGBUS) on the first page past its end
        from stallscope.data.index import PackFormatError

        raise PackFormatError(f"{where}: {problem}; check it with: stallscope pack --verify {where}")
    # lock=False: a finished pack is never written, so no reader table and no lock contention.
    env = lmdb.open(where, subdir=True, readonly=True, lock=False, readahead=False, meminit=False, max_readers=1)
    _ENVS[(pid, where)] = (inode, env)
    return env
