"""A /dev/shm too small for the batches in flight, read from how the run failed.

A DataLoader worker collates each batch into a fresh shared-memory segment (in /dev/shm, whichever sharing
strategy). Where /dev/shm has no room for the batches in flight (Docker's default is 64 MiB), torch says so in
one of a few ways: the worker's allocation of the segment fails (``unable to allocate shared memory(shm) for file
</torch_...>: No space left on device (28)``, or ``unable to write to file </torch_...>`` on older releases), or a
process touching a page that has no room is killed by SIGBUS (``DataLoader worker (pid N) is killed by signal:
Bus error. It is possible that dataloader's workers are out of shared memory...`` in the training process, which
torch chains under ``DataLoader worker (pid(s) N) exited unexpectedly``). The failure alone is then said, not its
cause: this names it.
"""

from __future__ import annotations

import re
import signal
from typing import Any

from stallscope.session import Session

#: torch's own words for a batch that found no room in /dev/shm (the segment it names is /dev/shm/torch_...).
_SIGNS = re.compile(r"unable to allocate shared memory|unable to write to file </torch_[^>]*>: No space left"
                    r"|out of shared memory|insufficient shared memory"
                    r"|</torch_[^>]*>[^\n]*No space left on device", re.IGNORECASE)
#: A shell's exit code for a process killed by SIGBUS: the training process itself reading a segment that had no
#: room behind it.
BUS_EXIT_CODES = (128 + signal.SIGBUS, -signal.SIGBUS)


def _said(text: str) -> str | None:
    """The line of ``text`` that says /dev/shm ran out, if one does."""
    for line in text.splitlines():
        if _SIGNS.search(line):
            return line.strip()[:300]
    return None


def shm_exhaustion(session: Session) -> dict[str, Any] | None:
    """What shows that the batches found no room in /dev/shm (``said``: torch's line, ``where``: ``worker`` or
    ``main``, ``loader_id`` and ``worker`` where a worker's record says), with the size /dev/shm had at the start;
    None where the run shows nothing of the kind."""
    found: dict[str, Any] | None = None
    for error in sorted(session.errors, key=lambda e: e.where != "worker"):  # the worker's own record first
        if said := _said(f"{error.message}\n{error.traceback or ''}"):
            found = {"said": said, "where": error.where, "loader_id": error.loader_id, "worker": error.worker}
            break
    if found is None:
        for stall in session.stalls:
            if stall.message and (said := _said(stall.message)):
                found = {"said": said, "where": "main", "loader_id": stall.loader_id, "worker": None}
                break
    if found is None and session.exit_code in BUS_EXIT_CODES and any(
            int(ld.config.get("num_workers") or 0) > 0 for ld in session.loaders if ld.pid == session.main_pid):
        found = {"said": f"the training process was killed by SIGBUS (exit code {session.exit_code})",
                 "where": "main", "loader_id": None, "worker": None}
    if found is None:
        return None
    check = next((c for c in session.checks if c.get("id") == "shm"), None)
    data = (check or {}).get("data") or {}
    return {**found, "shm_size_bytes": data.get("size_bytes"), "shm_free_bytes": data.get("free_bytes")}
