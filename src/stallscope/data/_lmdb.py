"""Read-only LMDB environments, one per process and database file."""

from __future__ import annotations

import os
from pathlib import Path

_ENVS: dict[tuple[int, str], tuple[int, object]] = {}


def lmdb_env(path: Path):
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
    # lock=False: a finished pack is never written, so no reader table and no lock contention.
    env = lmdb.open(where, subdir=True, readonly=True, lock=False, readahead=False, meminit=False, max_readers=1)
    _ENVS[(pid, where)] = (inode, env)
    return env
