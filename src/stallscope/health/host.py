"""The machine as the doctor sees it: files under a root path, the environment, and a few system calls.

Every machine check reads through a ``Host`` so tests can hand it a fake ``/proc``, ``/sys`` and cgroup tree
built in ``tmp_path``, a fake environment, and an opener that raises ``PermissionError``. Only a live host
(root ``/``) may fall back to ``os`` calls about this process, because those describe the real machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


class SourceError(Exception):
    """A source the doctor needed could not be read; ``reason`` is short enough for a table cell."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _default_opener(path: Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


@dataclass(frozen=True)
class Host:
    """Where to read machine facts from.

    ``opener`` reads one file and may raise any ``OSError``; ``statvfs`` answers for a path under the root.
    """

    root: Path = Path("/")
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    opener: Callable[[Path], str] = _default_opener
    statvfs: Callable[[str], os.statvfs_result] | None = None

    @property
    def live(self) -> bool:
        """True when the root is the real ``/``: only then do ``os`` calls describe the same machine."""
        return self.root.resolve() == Path("/")

    def path(self, absolute: str) -> Path:
        """Map an absolute path of the inspected machine (``/proc/meminfo``) to the file under the root."""
        return self.root / absolute.lstrip("/")

    def read(self, absolute: str) -> str:
        """Read a text file of the inspected machine, turning every failure into a ``SourceError``."""
        try:
            return self.opener(self.path(absolute))
        except FileNotFoundError:
            raise SourceError(absolute, f"{absolute} does not exist") from None
        except PermissionError:
            raise SourceError(absolute, f"{absolute}: permission denied") from None
        except IsADirectoryError:
            raise SourceError(absolute, f"{absolute} is a directory, not a file") from None
        except NotADirectoryError:
            raise SourceError(absolute, f"{absolute}: a parent is not a directory") from None
        except OSError as exc:
            raise SourceError(absolute, f"{absolute}: {exc.strerror or exc}") from None

    def read_or_none(self, absolute: str) -> str | None:
        try:
            return self.read(absolute)
        except SourceError:
            return None

    def exists(self, absolute: str) -> bool:
        return self.path(absolute).exists()

    def is_dir(self, absolute: str) -> bool:
        return self.path(absolute).is_dir()

    def listdir(self, absolute: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(absolute)))
        except OSError:
            return []

    def fs_stat(self, absolute: str) -> os.statvfs_result:
        """``statvfs`` of a path of the inspected machine; raises ``SourceError`` when it cannot be asked."""
        try:
            if self.statvfs is not None:
                return self.statvfs(absolute)
            return os.statvfs(self.path(absolute))
        except OSError as exc:
            raise SourceError(absolute, f"statvfs({absolute}): {exc.strerror or exc}") from None


def parse_cpulist(text: str) -> set[int]:
    """``0-3,8,10-11`` -> {0,1,2,3,8,10,11}. Raises ``ValueError`` on anything else, so bad input is not guessed."""
    cpus: set[int] = set()
    text = text.strip()
    if not text:
        return cpus
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            start, stop = int(lo), int(hi)
            if stop < start:
                raise ValueError(f"bad CPU range {part!r}")
            cpus.update(range(start, stop + 1))
        else:
            cpus.add(int(part))
    return cpus


def parse_kv(text: str, sep: str = ":") -> dict[str, str]:
    """``Key: value`` lines (``/proc/meminfo``, ``/proc/self/status``) into a dict of stripped strings."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if sep in line:
            key, value = line.split(sep, 1)
            out[key.strip()] = value.strip()
    return out


def meminfo_bytes(text: str, key: str) -> int | None:
    """A ``/proc/meminfo`` field in bytes (the file says kB and means KiB)."""
    raw = parse_kv(text).get(key)
    if raw is None:
        return None
    parts = raw.split()
    try:
        value = int(parts[0])
    except (IndexError, ValueError):
        return None
    return value * 1024 if len(parts) > 1 and parts[1].lower() == "kb" else value


def unescape_mount_field(field_text: str) -> str:
    r"""``/proc/mounts`` escapes space, tab, newline and backslash as octal (``\040``)."""
    out, i = [], 0
    while i < len(field_text):
        if field_text[i] == "\\" and i + 3 < len(field_text) and field_text[i + 1:i + 4].isdigit():
            out.append(chr(int(field_text[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field_text[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Mount:
    device: str
    mount_point: str
    fs_type: str
    options: tuple[str, ...]


def parse_mounts(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mounts.append(Mount(unescape_mount_field(parts[0]), unescape_mount_field(parts[1]), parts[2],
                            tuple(parts[3].split(","))))
    return mounts


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount a path lives on: the longest mount point that is a prefix of it (later mounts shadow earlier)."""
    best: Mount | None = None
    for mount in mounts:
        mp = mount.mount_point.rstrip("/") or "/"
        if path == mp or path.startswith(mp + "/") or mp == "/":
            if best is None or len(mp) >= len(best.mount_point.rstrip("/") or "/"):
                best = mount
    return best
