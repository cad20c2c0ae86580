"""Argument checks the verbs share: number types and output paths, light enough for every verb to import
(no rich, no torch)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from stallscope import paths


def at_least(minimum: float, kind: type = int, most: float | None = None) -> Callable[[str], float]:
    """An argparse ``type`` for a number of ``kind`` no lower than ``minimum`` (and finite): ``--limit -1`` or
    ``--batch-size 0`` are refused with a usage error instead of being run; and no higher than ``most`` where
    given (a number past any real use is a typo, and may not fit where it goes, as SQLite's 64-bit integers)."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a{'n integer' if kind is int else ' number'}: {text!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, not {text}")
        if most is not None and value > most:
            shown = f"{int(most):d}" if kind is int else f"{most:g}"
            raise argparse.ArgumentTypeError(f"must be at most {shown}, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def folder(text: str) -> str:
    """An argparse ``type`` for ``--store DIR``: an empty name (``--store ""``, ``--store "$UNSET"``) is refused
    rather than taken for no option at all, which would read or write ``./.stallscope`` without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError("needs a folder's name, not an empty one")
    return text


def output_error(outputs: list[str | None], store: str | None, source: Path | None = None,
                 dash_is_stdout: bool = False) -> str | None:
    """Why one of the ``outputs`` paths must not be written, if one must not: it would overwrite a store's own
    files or the session file ``source`` a report is made from, or it cannot be written at all. ``-`` is standard
    output where the verb prints there (``dash_is_stdout``), and refused elsewhere rather than made a file."""
    for out in outputs:
        if not out:
            continue
        if out == "-":
            if not dash_is_stdout:
                return "'-' (standard output) is not taken here: give a file name (or /dev/stdout)"
            continue
        if paths.held_descriptor(out) is not None:  # /dev/stdout and the like: written where they point
            continue
        try:
            paths.refuse_store_file(out, paths.store_dir(store))
        except ValueError as exc:
            return str(exc)
        if source is not None and os.path.realpath(out) == os.path.realpath(source):
            return f"{out} is the session this report is made from: write it elsewhere"
        if problem := _unwritable(Path(out)):
            return f"cannot write {out}: {problem}"
    return None


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written, where that shows before anything runs (a run can take hours)."""
    real = Path(os.path.realpath(path))
    if real.is_dir():
        return "it is a folder"
    if real.exists() and not real.is_file():  # a device or a FIFO, written in place
        return None if os.access(real, os.W_OK) else "no permission to write it"
    folder = real.parent
    while not folder.exists() and folder != folder.parent:  # write_file makes the missing ones
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"no permission to write in {folder}"
    try:  # what permissions do not tell: /proc, a read-only mount, root's access() that says yes to all
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".stallscope-write-check-")
    except OSError as exc:
        return f"nothing can be written in {folder}: {exc.strerror or exc}"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None
