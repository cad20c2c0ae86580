"""How much of a file is in the page cache, asked of the kernel with ``mmap`` + ``mincore`` (Linux only).

Mapping a file does not read it and ``mincore`` only inspects the cache, so asking changes nothing; that is why
residency is measured before the doctor reads any dataset bytes. ``posix_fadvise`` is not used: it can only
evict, never tell.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys


class ResidencyUnavailable(Exception):
    """This platform or this file cannot be asked (not Linux, no libc, mmap refused)."""


_MAP_FAILED = ctypes.c_void_p(-1).value
_PAGE = mmap.PAGESIZE
_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL:
    global _libc
    if _libc is not None:
        return _libc
    if not sys.platform.startswith("linux"):
        raise ResidencyUnavailable(f"page-cache residency needs Linux mincore(2), not {sys.platform}")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError as exc:
        raise ResidencyUnavailable(f"cannot load libc: {exc}") from None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.restype = ctypes.c_int
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    _libc = libc
    return libc


def available() -> str | None:
    """None when residency can be measured here, else the reason it cannot."""
    try:
        _load_libc()
        return None
    except ResidencyUnavailable as exc:
        return str(exc)


def resident_bytes(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(bytes of the file in the page cache, file size). Empty files are (0, 0).

    Residency is counted in whole pages, so the last partial page counts as its real size.
    """
    libc = _load_libc()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise ResidencyUnavailable(f"mmap failed: {os.strerror(err)}")
        try:
            pages = (size + _PAGE - 1) // _PAGE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                err = ctypes.get_errno()
                raise ResidencyUnavailable(f"mincore failed: {os.strerror(err)}")
            resident_pages = sum(1 for b in vec if b & 1)
            last_resident = vec[pages - 1] & 1
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    tail = size - (pages - 1) * _PAGE
    resident = (resident_pages - last_resident) * _PAGE + (tail if last_resident else 0)
    return resident, size
