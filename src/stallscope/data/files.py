"""Reading a user's data file by its path: a regular file only, and never more than its size.

A path named like an image can be anything: a device (``/dev/zero`` never ends, so reading it to its end fills
memory), a FIFO nobody writes to (opening it waits for a writer forever), a socket, a folder, a link to any of
these, or a ``/proc`` file whose size says 0 bytes. Every place that reads user data by path (``pack``, the folder
dataset, ``doctor``, the decoder race) goes through here: look before opening (opening some devices does
something), open without waiting, check the opened descriptor is the regular file that was looked at, and read at
most its size plus one byte, the one that shows it grew.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

#: What a file that is not a regular file is, by the type bits of its mode.
_KINDS = ((stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
          (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"))


class NotRegularFileError(OSError):
    """The path is a device, FIFO, socket or folder (or a link to one): not read, not even opened."""

    def __init__(self, path: str | os.PathLike[str], kind: str, target: str | None = None) -> None:
        via = f" (a link to {target})" if target else ""
        super().__init__(errno.EINVAL, f"not a regular file: {kind}{via}", os.fspath(path))
        self.kind = kind


class FileChangedError(OSError):
    """The file's content is not the size it had when opened: being written, or a ``/proc``-like file that
    makes its content up when read (its size says 0)."""

    def __init__(self, path: str | os.PathLike[str], size: int, grew: bool) -> None:
        how = "it held more" if grew else "it held less"
        super().__init__(errno.EAGAIN, f"its size was {size} bytes when opened, and {how} (being written, or "
                                       "not a stored file)", os.fspath(path))


def describe(exc: OSError) -> str:
    """Why a read failed, in one phrase: the refusals above as they are, any other error with its class."""
    if isinstance(exc, (NotRegularFileError, FileChangedError)):
        return str(exc.strerror)
    return f"{exc.__class__.__name__}: {exc.strerror or exc}"


def kind_of(mode: int) -> str:
    """The kind of file a ``st_mode`` says, in words: 'regular file', 'FIFO', 'character device', ..."""
    if stat.S_ISREG(mode):
        return "regular file"
    return next((name for test, name in _KINDS if test(mode)), "special file")


def _refuse(path: str | os.PathLike[str], mode: int) -> NotRegularFileError:
    target = None
    if os.path.islink(path):
        try:
            target = os.path.realpath(path)
        except OSError:
            target = None
    return NotRegularFileError(path, kind_of(mode), target)


def not_regular(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is no regular file to read ('not a regular file: FIFO'), or None. A path that cannot be
    looked at (missing, a link to nothing, a link loop) is None: reading it fails with its own error."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else _refuse(path, mode).strerror


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading, where it is a regular file (links followed); :class:`NotRegularFileError`
    otherwise, with nothing opened. Raises ``OSError`` as ``open`` does for a missing or unreadable path."""
    looked = os.stat(path)
    if not stat.S_ISREG(looked.st_mode):
        raise _refuse(path, looked.st_mode)
    # O_NONBLOCK: if a FIFO took the file's place since the look, the open returns at once instead of waiting
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise _refuse(path, opened.st_mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path``: all of them (at most its size when opened; a file that grew or
    shrank meanwhile raises :class:`FileChangedError`), or its first ``limit`` bytes. Raises
    :class:`NotRegularFileError` for anything but a regular file, ``OSError`` where it cannot be read."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if limit is not None:
            return fh.read(min(limit, size))
        data = fh.read(size + 1)
    if len(data) != size:
        raise FileChangedError(path, size, grew=len(data) > size)
    return data


__all__ = ["FileChangedError", "NotRegularFileError", "describe", "kind_of", "not_regular", "open_regular",
           "read_regular"]
