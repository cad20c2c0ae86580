"""An OSError in words, with the file it concerns. Python's ``[Errno 2] No such file or directory`` names none where
the call had no path (``os.getcwd`` in a folder that was deleted, a write on a full disk), and ``strerror`` alone
never does: a message that leaves the user to guess which file is half a message."""

from __future__ import annotations

import errno
import os


def reason(exc: OSError) -> str:
    """The system's reason, as the middle of a sentence: ``no such file or directory``."""
    text = exc.strerror or str(exc) or type(exc).__name__
    return text[:1].lower() + text[1:]


def deleted_cwd() -> str | None:
    """The current folder's path where it was deleted (or moved away) under this process, else None: Linux keeps
    its old name in ``/proc/self/cwd`` as ``PATH (deleted)``."""
    try:
        os.getcwd()
        return None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        return os.readlink("/proc/self/cwd").removesuffix(" (deleted)")
    except OSError:
        return os.environ.get("PWD") or "(its name is unknown)"


def os_error_words(exc: OSError, path: str | os.PathLike[str] | None = None) -> str:
    """``FILE: reason``: the file the error names (``A -> B`` for a rename), else the current folder where that
    is what went missing, else ``path``, the file the caller was working on; the reason alone only where none
    is known."""
    if exc.filename is not None:
        where = os.fsdecode(exc.filename) if isinstance(exc.filename, (str, bytes, os.PathLike)) else str(exc.filename)
        if exc.filename2 is not None:
            where += f" -> {os.fsdecode(exc.filename2)}"
        return f"{where}: {reason(exc)}"
    if exc.errno == errno.ENOENT and (cwd := deleted_cwd()) is not None:
        return f"the current folder {cwd} no longer exists (it was deleted or moved)"
    if path is not None:
        return f"{os.fspath(path)}: {reason(exc)}"
    return reason(exc)
