"""Where sessions live (``./.stallscope`` unless ``--store`` or ``STALLSCOPE_HOME`` says otherwise), and how files
the user names are written (``write_file``) without harming the store (``refuse_store_file``)."""

from __future__ import annotations

import errno
import json
import os
import secrets
import shlex
import stat
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from stallscope.constants import DEFAULT_STORE_DIRNAME
from stallscope.settings import ENV_HOME


def store_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The store directory, resolved in order: explicit argument, environment, working directory."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get(ENV_HOME)
    if env:
        return Path(env).expanduser().resolve()
    return (Path.cwd() / DEFAULT_STORE_DIRNAME).resolve()


def store_is_a_file(store: Path) -> str | None:
    """What to say where ``--store`` (or ``$STALLSCOPE_HOME``) names a file: read as a store, it holds no run."""
    if store.exists() and not store.is_dir():
        return (f"the store {store} is a file, not a folder: give --store (or $STALLSCOPE_HOME) the folder the runs "
                "were recorded into")
    return None


def runs_dir(store: Path) -> Path:
    return store / "runs"


class OutsideStoreError(ValueError):
    """A file or folder of the store would be reached through a symbolic link that leads out of it: writing there
    would put stallscope's files (or SQLite's tables) into something that is not the store's, so it is refused."""


def store_path(store: str | os.PathLike[str], *parts: str) -> Path:
    """``store/parts``, checked to be the store's own: no link on the way from the store down to it may lead out
    of the store (a planted ``history.sqlite3 -> ~/app.sqlite`` or ``runs -> /elsewhere``). The store itself may be
    a link (a store moved to a bigger disk), and links that stay inside it are fine. Raises
    :class:`OutsideStoreError`, in one line naming the link and where it leads."""
    root = Path(os.path.realpath(store))
    path = Path(store).joinpath(*parts)
    here = Path(store)
    for part in parts:
        here = here / part
        real = Path(os.path.realpath(here))
        if real != root and root not in real.parents:
            link = _first_link(Path(store), here)
            raise OutsideStoreError(f"{link} is a symbolic link to {os.readlink(link) if link.is_symlink() else real}, "
                                    f"outside the store {store}: stallscope writes only its own files; remove the "
                                    f"link (rm {shlex.quote(str(link))}) or choose another store with --store DIR")
    return path


def _first_link(store: Path, path: Path) -> Path:
    """The first symbolic link on the way from ``store`` down to ``path`` (``path`` itself where none is found)."""
    here = store
    for part in path.relative_to(store).parts:
        here = here / part
        if here.is_symlink():
            return here
    return path


def store_folder(store: str | os.PathLike[str], *parts: str) -> Path:
    """``store_path`` made as a folder (with its parents), checked again once made."""
    folder = store_path(store, *parts)
    folder.mkdir(parents=True, exist_ok=True)
    return store_path(store, *parts)


def report_command(session_file: str | os.PathLike[str], run_id: str) -> str:
    """``stallscope report RUN_ID`` for a run saved in the store a plain ``stallscope report`` finds from here
    (``./.stallscope`` or ``$STALLSCOPE_HOME``); with ``--store STORE`` for a run saved anywhere else, so that the
    line works when pasted."""
    saved = Path(session_file).resolve()
    store = saved.parent.parent.parent if saved.parent.parent.name == "runs" else None
    if store is None:
        return f"stallscope report {shlex.quote(str(saved))}"
    try:
        default = store_dir()
    except OSError:  # the working directory is gone
        default = None
    if default is not None and _same(store, default):
        return f"stallscope report {run_id}"
    return f"stallscope report --store {shlex.quote(str(store))} {run_id}"


def new_run_id(now: float | None = None, label: str | None = None) -> str:
    """Sortable by time and unique across concurrent runs writing the same store; ``label`` (a job and node, see
    ``job_names.run_label``) tells the nodes' runs of one job apart at a glance."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    return f"{stamp}-{label}-{secrets.token_hex(3)}" if label else f"{stamp}-{secrets.token_hex(3)}"


def resolve_run(ref: str, store: Path) -> Path:
    """Find a saved run from a path, a run id, a unique id prefix, ``last`` or ``last~N`` (N saved runs before it).

    A run whose session was never saved (its launcher was killed, or the disk was full) resolves to its
    run directory, for ``collect.recover_session``; ``last`` is the last saved session.
    Raises ``FileNotFoundError`` with the places it looked, so the CLI can say them.
    """
    if not ref.strip():
        raise FileNotFoundError("no run named: give a run id (or a unique start of one), last, last~N, a run "
                                "directory or a session file")
    candidate = Path(ref).expanduser()
    if candidate.is_file():
        return candidate
    if candidate.is_dir() and (candidate / "session.json").is_file():
        return candidate / "session.json"
    if candidate.is_dir() and (candidate / "run.json").is_file():
        return candidate
    base = runs_dir(store)
    if problem := store_is_a_file(store):
        raise FileNotFoundError(problem)
    if not store.exists():
        raise FileNotFoundError(f"no run {ref!r}: there is no store at {store} (nothing was recorded there); "
                                f"stallscope run records into ./{DEFAULT_STORE_DIRNAME} where it runs, or where "
                                "--store or $STALLSCOPE_HOME says")
    if base.is_dir():
        try:
            os.listdir(base)  # glob() takes a folder it cannot list for an empty one
        except OSError as exc:
            raise FileNotFoundError(f"cannot read {base}: {exc.strerror}") from exc
    runs = sorted(p for p in base.glob("*") if (p / "session.json").is_file()) if base.is_dir() else []
    unsaved = sorted(p for p in base.glob("*") if (p / "run.json").is_file() and not (p / "session.json").is_file()
                     ) if base.is_dir() else []
    if ref == "last" or (ref.startswith("last~") and ref[5:].isascii() and ref[5:].isdigit()):
        back = int(ref[5:]) if ref != "last" else 0
        if len(runs) <= back:
            never = (f"; {len(unsaved)} more never saved their session (a full disk, a killed launcher): name one "
                     f"by its id to rebuild it, the newest is {unsaved[-1].name}") if unsaved else ""
            raise FileNotFoundError(f"no saved run {ref!r} under {base}: it holds {len(runs)}{never}")
        return runs[-1 - back] / "session.json"
    matches = [p for p in runs + unsaved if p.name.startswith(ref)]
    if len(matches) == 1:
        return matches[0] / "session.json" if matches[0] in runs else matches[0]
    if len(matches) > 1:
        names = ", ".join(p.name for p in matches[:5]) + (f" and {len(matches) - 5} more" if len(matches) > 5 else "")
        raise FileNotFoundError(f"run id {ref!r} is ambiguous under {base}: {len(matches)} run ids start with it "
                                f"({names}); give more of it")
    raise FileNotFoundError(f"no run {ref!r}: not a session file, run directory, or run id under {base}")


#: Less free space than this on a file system counts as full: SQLite grows its files a page (and its -shm index
#: 32 KiB) at a time, so a disk with a few KiB left fails as surely as one with none.
LOW_SPACE_BYTES = 1 << 20


def disk_full(path: str | os.PathLike[str]) -> bool:
    """Whether the file system holding ``path`` (or the nearest folder above it that exists) has no room left for
    this user. Used to name the cause where a failure does not: SQLite's "disk I/O error", an empty file, a child
    process whose output went to the same full disk. False where it cannot be told."""
    where = Path(path)
    while not os.path.exists(where) and where != where.parent:  # never raises (Path.exists does for EACCES)
        where = where.parent
    try:
        fs = os.statvfs(where)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < LOW_SPACE_BYTES


def write_file(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to a file the user named (``write_parts`` with one part)."""
    return write_parts(path, [data.encode("utf-8") if isinstance(data, str) else data])


def write_parts(path: str | os.PathLike[str], parts: Iterable[bytes]) -> Path:
    """Write a file the user named, part after part (a large file is never held whole in memory), so that a crash
    or a full disk never leaves half of it, nor destroys what the name pointed at.

    A regular file (or a new one) is written to a uniquely named temporary file beside it and renamed over it
    in one step; on any failure the temporary file is removed and the old file stays as it was. A symbolic
    link is written through: its target is replaced and the link kept (renaming over the link would replace
    the link itself). ``/dev/stdout``, ``/dev/stderr`` and ``/dev/fd/N`` are written to the descriptor this
    process already holds (reopening one would truncate the file a shell appends to, or fail on a pipe). A FIFO,
    a device or any other special file is written to directly, since renaming over it would put a regular file
    in its place; a FIFO that no program reads is an error, not a wait without end. A missing parent folder is
    made.
    """
    path = Path(path)
    fd = held_descriptor(path)
    if fd is not None:
        for part in parts:
            _write_descriptor(fd, part)
        return path
    real = Path(os.path.realpath(path))
    try:
        mode = os.stat(real).st_mode
    except (FileNotFoundError, NotADirectoryError):  # a new file (or a file in the way, said below)
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        _write_special(real, parts, fifo=stat.S_ISFIFO(mode))
        return path
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(errno.ENOTDIR, "a folder on its path is a file", str(path)) from None
    # a name of up to 255 bytes (NAME_MAX) must leave room for the temporary one's prefix and suffix
    tmp = real.with_name(f".{real.name[:200]}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any new file
        with os.fdopen(fd, "wb") as fh:
            for part in parts:
                fh.write(part)
        if mode is not None:
            os.chmod(tmp, stat.S_IMODE(mode))  # a replaced file keeps its permissions
        os.replace(tmp, real)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def held_descriptor(path: str | os.PathLike[str]) -> int | None:
    """The descriptor ``path`` names when it is one this process holds (``/dev/stdout``, ``/dev/stderr``,
    ``/dev/stdin``, ``/dev/fd/N``, ``/proc/self/fd/N``); None for any other path."""
    text = os.path.normpath(os.path.abspath(os.fspath(path)))
    named = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
    if text in named:
        return named[text]
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        if text.startswith(prefix) and text[len(prefix):].isascii() and text[len(prefix):].isdigit():
            return int(text[len(prefix):])
    return None


def _write_descriptor(fd: int, raw: bytes) -> None:
    if fd in (1, 2):  # what Python printed before must come out first
        (sys.stdout if fd == 1 else sys.stderr).flush()
    view = memoryview(raw)
    while view:
        view = view[os.write(fd, view):]


def _write_special(real: Path, parts: Iterable[bytes], fifo: bool) -> None:
    """Write a FIFO or a device in place. A FIFO is opened without blocking first: with no reader that fails at
    once (ENXIO) instead of waiting for one that never comes."""
    flags = os.O_WRONLY | (os.O_NONBLOCK if fifo else 0)
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        if fifo and exc.errno == errno.ENXIO:
            raise OSError(errno.ENXIO, "no program is reading from this FIFO", str(real)) from None
        raise
    try:
        if fifo:
            os.set_blocking(fd, True)
        for part in parts:
            _write_descriptor(fd, part)
    finally:
        os.close(fd)


def refuse_store_file(path: str | os.PathLike[str], store: Path) -> None:
    """Raise ``ValueError`` where an output ``path`` would overwrite a file of a store (a saved session, a run's
    record, the history database): writing a report over the session it was made from loses the measurements
    for good. ``store`` is the one the verb uses; the run folders and history of any other store are recognised
    by their shape (``runs/RUN_ID/run.json``), so a user's own folder holding a ``session.json`` or a
    ``run.json`` of theirs is not one."""
    real = Path(os.path.realpath(path))
    root = Path(os.path.realpath(store))
    if _owned_by_store(real, root):
        raise ValueError(f"{path} is inside the store {store} (its sessions and history): write it elsewhere")
    folder = real.parent
    run_folder = folder if _is_run_folder(folder) else folder.parent if (
        folder.name == "events" and _is_run_folder(folder.parent)) else None
    if run_folder is not None and (real.exists() or folder != run_folder):
        raise ValueError(f"{path} is a file of the stallscope run {run_folder}: write it elsewhere")
    if real.name == "history.sqlite3" and (folder / "runs").is_dir():
        raise ValueError(f"{path} is the run history of the store {folder}: write it elsewhere")


def _owned_by_store(real: Path, root: Path) -> bool:
    """True where ``real`` is the store, its runs folder or anything in it, its history database (with SQLite's
    -wal/-shm/-journal and the copies ``--rebuild`` keeps), or an existing file in one of its other folders (a
    tuner's or bench's record). A file of the user's own at the store's top is theirs, even when an earlier run
    wrote it. Existing folders are compared by identity, so a case-insensitive file system's ``RUNS`` or
    ``History.sqlite3`` is the store's too."""
    existing = [p for p in (real, *real.parents) if p.exists()]
    if (real.exists() and _same(real, root)) or any(_same(p, runs_dir(root)) for p in existing):
        return True
    top = _same(real.parent, root) if real.parent.exists() else False
    if top:
        return real.name.lower().startswith("history.sqlite3") or (
            real.exists() and _same(real, root / "history.sqlite3"))
    inside = any(_same(p, root) for p in existing)
    return inside and real.exists()


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _is_run_folder(folder: Path) -> bool:
    """A store's run folder: ``runs/RUN_ID`` holding the ``run.json`` a launcher wrote."""
    if folder.parent.name != "runs":
        return False
    try:
        meta = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("run_id") == folder.name
