"""``pack()``: source list -> checked records -> LMDB or shards, resumable, atomic at the end.

Layout while packing: ``OUT.partial/`` holds the growing data, one index part per
checkpoint (``parts/``) and ``state.json`` (what is durable so far). Records are produced in
source order, so after a kill the rerun continues from the last checkpoint and produces the
same records with the same keys. The finished pack is assembled in ``OUT.partial/final`` and
renamed to ``OUT`` in one step: ``OUT`` either does not exist or is complete.
"""

from __future__ import annotations

import collections
import contextlib
import fnmatch
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stallscope.data.crop_fit import CropFit
from stallscope.data.index import (
    FORMATS,
    INDEX_NAME,
    PackIndex,
    Problem,
    Record,
    checksum,
    record_key,
    write_atomic,
)
from stallscope.data.packing.prepare import FATAL_KINDS, Prepared, prepare
from stallscope.data.sources import SourceList, open_source
from stallscope.data.turbo import turbojpeg_library
from stallscope.settings import ENV_PACK_THROTTLE, MAX_WORKERS

if TYPE_CHECKING:
    from stallscope.data.packing.lmdb_writer import LmdbSink
    from stallscope.data.packing.wds_writer import ShardSink

STATE_NAME = "state.json"


class PackError(RuntimeError):
    """The pack cannot proceed (bad options, conflicting output, a bad file under ``strict``)."""


class PackWriteError(RuntimeError):
    """Writing the pack failed part-way (a full disk, the folder removed, an I/O error): what was packed and
    checkpointed so far stays in ``work``, and the same command resumes from it once the cause is fixed."""

    def __init__(self, message: str, work: Path) -> None:
        super().__init__(message)
        self.work = work


def _write_failure(exc: BaseException) -> str | None:
    """What went wrong, where ``exc`` is a failure to write (the file system's, or LMDB's own); None otherwise."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if type(exc).__module__.split(".")[0] == "lmdb":  # lmdb.Error and its kinds (MapFullError, DiskError, ...)
        return str(exc)
    return None


#: Records a pack worker prepares per task it is handed (few enough that progress and Ctrl-C stay prompt).
PREPARE_CHUNK = 16


@dataclass(frozen=True)
class PackOptions:
    format: str = "lmdb"
    max_side: int = 0
    #: ``--max-side auto``: each image sized for the crops its training takes (``data/crop_fit.py``), in place of
    #: ``max_side``
    crop_fit: CropFit | None = None
    quality: int = 90
    workers: int = 0
    strict: bool = False
    shard_size: int = 1000
    commit_every: int = 512

    def validate(self) -> None:
        if self.format not in FORMATS:
            raise PackError(f"unknown format {self.format!r}; choose one of: {', '.join(FORMATS)}")
        if self.max_side < 0:
            raise PackError("--max-side must be positive (0 keeps images as they are)")
        if not 1 <= self.quality <= 100:
            raise PackError("--quality must be between 1 and 100")
        if not 0 <= self.workers <= MAX_WORKERS:
            raise PackError(f"--workers must be between 0 (in-process) and {MAX_WORKERS}")
        if self.shard_size < 1:
            raise PackError("--shard-size must be at least 1")
        if self.commit_every < 1:
            raise PackError("--commit-every must be at least 1")

    def content_options(self) -> dict[str, object]:
        """The options that change the output bytes (workers and strictness do not)."""
        return {"format": self.format,
                "max_side": self.crop_fit.describe() if self.crop_fit is not None else self.max_side,
                "quality": self.quality,
                # what a pack made here does to progressive JPEGs: one made without the library is another pack
                "progressive": "stored sequential" if turbojpeg_library() is not None else "kept",
                "shard_size": self.shard_size if self.format == "wds" else None}


@dataclass
class PackResult:
    out: Path
    format: str
    records: int
    skipped: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    resumed_at: int = 0
    already_complete: bool = False
    digest: str = ""
    #: progressive JPEGs this run stored as sequential ones, losslessly (``prepare.sequential``)
    baseline: int = 0


#: progress(done_sources, total_sources, bytes_read_this_run)
ProgressFn = Callable[[int, int, int], None]


def _fingerprint(sources: SourceList, options: PackOptions) -> str:
    """Same sources (path, label, size, mtime) and same content options -> same fingerprint."""
    h = hashlib.sha256(json.dumps(options.content_options(), sort_keys=True).encode())
    for path, label in sources.samples:
        try:
            st = os.stat(path)
            h.update(f"{path}\t{label}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{path}\t{label}\t-\n".encode())
    return h.hexdigest()


def _name(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _ignore_sigint() -> None:
    """Pool worker initializer: Ctrl-C is the parent's to handle. A worker that dies of KeyboardInterrupt
    prints a traceback, and one that dies holding the task queue's lock deadlocks ``Pool.terminate()``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _sigint_ignored_while_forking() -> Iterator[None]:
    """Ignore SIGINT while the pool forks its workers, so none gets it before its initializer runs
    (signal dispositions are inherited); a Ctrl-C in those milliseconds is lost. Only the main thread may change
    them; elsewhere, nothing to do."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _prepare_chunk(chunk: list[tuple]) -> list[Prepared]:
    """A pool worker's task: PREPARE_CHUNK records."""
    return [prepare(task) for task in chunk]


def _prepared_stream(tasks: list[tuple], workers: int) -> Generator[Prepared, None, None]:
    """Prepared records in source order. With workers, Ctrl-C reaches only this process: leaving (by
    KeyboardInterrupt or by ``close()``) stops the pool, and the caller's resume logic takes over.

    At most two chunks a worker are handed out ahead of the one being read, and leaving takes their results in
    before it terminates the pool: ``Pool.terminate()`` stops the pool's result reader first, so a worker still
    sending a chunk (hundreds of KB, more than a pipe holds) blocked for ever holding the result queue's lock, and
    terminate with it (a pack that filled its disk under load hung so)."""
    if workers <= 0 or len(tasks) < 2:
        yield from map(prepare, tasks)
        return
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    chunks = [tasks[start:start + PREPARE_CHUNK] for start in range(0, len(tasks), PREPARE_CHUNK)]
    size = min(workers, len(chunks))  # a process per chunk of work at most
    with _sigint_ignored_while_forking():
        pool = ctx.Pool(size, initializer=_ignore_sigint)
    ahead: collections.deque[AsyncResult[list[Prepared]]] = collections.deque()
    try:
        for chunk in chunks:
            ahead.append(pool.apply_async(_prepare_chunk, (chunk,)))
            if len(ahead) > 2 * size:
                yield from ahead.popleft().get()
        while ahead:
            yield from ahead.popleft().get()
        pool.close()
    finally:
        try:
            for result in ahead:  # nothing in flight when the pool is terminated
                result.wait()
        except KeyboardInterrupt:  # a second Ctrl-C: stop now
            pass
        pool.terminate()
        pool.join()


class _Checkpointer:
    """Index parts + ``state.json``; the state is written only after the data is durable."""

    def __init__(self, work: Path, fingerprint: str) -> None:
        self.work = work
        self.parts_dir = work / "parts"
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self.fingerprint = fingerprint
        self.state: dict[str, Any] = {"fingerprint": fingerprint, "next_position": 0, "next_key": 0, "parts": 0,
                                      "shards": 0}
        self.records: list[Record] = []
        self.problems: list[Problem] = []

    def load(self) -> bool:
        """Resume from ``state.json`` if it belongs to this pack; drop parts written after it."""
        path = self.work / STATE_NAME
        if not path.is_file():
            return False
        state = json.loads(path.read_text())
        if state.get("fingerprint") != self.fingerprint:
            return False
        self.state = state
        for part in sorted(self.parts_dir.glob("part-*.json")):
            if int(part.stem.split("-")[1]) >= state["parts"]:
                part.unlink()
        return True

    def save(self, sink: LmdbSink | ShardSink, next_position: int, next_key: int) -> None:
        part = {"records": [r.to_row() for r in self.records], "problems": [asdict(p) for p in self.problems]}
        write_atomic(self.parts_dir / f"part-{self.state['parts']:06d}.json", json.dumps(part).encode())
        sink.commit()
        self.state.update(next_position=next_position, next_key=next_key, parts=self.state["parts"] + 1,
                          shards=len(sink.shards))
        write_atomic(self.work / STATE_NAME, json.dumps(self.state).encode())
        self.records, self.problems = [], []

    def all_parts(self) -> tuple[list[Record], list[Problem]]:
        records: list[Record] = []
        problems: list[Problem] = []
        for i in range(self.state["parts"]):
            part = json.loads((self.parts_dir / f"part-{i:06d}.json").read_text())
            records.extend(Record.from_row(row) for row in part["records"])
            problems.extend(Problem(**p) for p in part["problems"])
        return records, problems


#: What ``pack`` writes, and so the only entries ``--force`` may delete: a finished pack holds the index,
#: ``data.mdb`` (LMDB) or tar shards (WebDataset); its ``.partial`` work folder holds these.
_PACK_NAMES = (INDEX_NAME, "data.mdb", "lock.mdb", "shard-*.tar")
_WORK_NAMES = (STATE_NAME, "parts", "db", "final", "shard-*.tar", "shard-*.tar.tmp")


def _check_output_location(src: Path, out: Path) -> None:
    """OUT and SRC must not hold one another: replacing OUT would delete the images being packed, and a
    pack written inside an image folder becomes part of that folder's next listing."""
    src, out = src.resolve(), out.resolve()
    work = out.with_name(out.name + ".partial")
    for target in (out, work):
        if src == target or target in src.parents:
            raise PackError(f"{target} contains the source {src}: choose an OUT outside the source")
    if src.is_dir() and src in out.parents:
        raise PackError(f"{out} is inside the source folder {src}: choose an OUT outside the source")


def _check_replaceable(path: Path, allowed: tuple[str, ...], what: str, src: str | os.PathLike[str]) -> None:
    """``--force`` deletes ``path`` only when it is ``what`` this packer wrote: a folder whose entries are all
    names it writes. Anything else (a file, a folder with other content, a symlink) is refused, never removed."""
    if path.is_symlink() or not path.is_dir():
        raise PackError(f"{path} is not {what} made by stallscope pack; --force only replaces those. "
                        "Move it away or choose another OUT")
    foreign = sorted(entry.name for entry in path.iterdir()
                     if not any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in allowed))
    if foreign or (what == "a finished pack" and not (path / INDEX_NAME).is_file()):
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        reason = f"it holds files stallscope pack did not write ({shown})" if foreign else f"it has no {INDEX_NAME}"
        raise PackError(f"{path} is not {what} made by stallscope pack: {reason}. --force only replaces a pack; "
                        "move it away or choose another OUT")


def _make_sink(options: PackOptions, work: Path, first_shard: int) -> LmdbSink | ShardSink:
    if options.format == "lmdb":
        try:
            from stallscope.data.packing.lmdb_writer import LmdbSink
        except ImportError as exc:  # pragma: no cover
            raise PackError("the lmdb package is missing: pip install 'stallscope[data]'") from exc
        return LmdbSink(work, options.commit_every)
    from stallscope.data.packing.wds_writer import ShardSink

    for stale in work.glob("shard-*.tar*"):  # shards beyond the checkpoint are redone
        if stale.name.endswith(".tmp") or int(stale.name[6:12]) >= first_shard:
            stale.unlink()
    return ShardSink(work, options.shard_size, first_shard)


@contextlib.contextmanager
def _only_writer(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock for the whole pack: two packs into one OUT would interleave their shards and
    checkpoints. The lock is a hidden file beside OUT, removed on release (and re-taken if another
    process removed it between our open and our lock)."""
    import fcntl

    path = out.with_name(f".{out.name}.stallscope-lock")
    while True:
        handle = open(path, "a+")  # noqa: SIM115 - held for the whole pack, closed below
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise PackError(f"another stallscope pack ({holder}) is writing {out}; wait for it to finish, "
                            "or choose another OUT") from None
        try:
            same = os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        handle.close()  # removed by its previous holder as we opened it: take the new one
    try:
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)
        handle.close()


def pack(src: str | os.PathLike[str], out: str | os.PathLike[str], options: PackOptions = PackOptions(),
         progress: ProgressFn | None = None, force: bool = False) -> PackResult:
    """Pack ``src`` (ImageFolder tree or ``path,label`` list) into ``out``; see the module docstring.

    Rerunning the same command after a crash resumes; rerunning it after success returns at
    once with ``already_complete``. ``force`` discards an existing ``out`` or an unfinished
    pack made with other options. A second pack into the same ``out`` while one runs is refused.
    """
    options.validate()
    started = time.perf_counter()
    sources = open_source(src)
    out = Path(out)
    _check_output_location(Path(src), out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with _only_writer(out):
            return _pack_locked(src, sources, out, options, progress, force, started)
    except Exception as exc:
        reason = _write_failure(exc)
        if reason is None or isinstance(exc, PackError):
            raise
        work = out.with_name(out.name + ".partial")
        where = work if work.exists() else out
        raise PackWriteError(f"packing into {where} failed: {reason}", work) from exc


def _pack_locked(src: str | os.PathLike[str], sources: SourceList, out: Path, options: PackOptions,
                 progress: ProgressFn | None, force: bool, started: float) -> PackResult:
    fingerprint = _fingerprint(sources, options)
    work = out.with_name(out.name + ".partial")
    if out.exists():
        existing = out / INDEX_NAME
        if not force and existing.is_file() and json.loads(existing.read_text()).get("options", {}).get(
                "fingerprint") == fingerprint:
            index = PackIndex.from_json(existing.read_text(), str(out))
            return PackResult(out, index.format, len(index.records), already_complete=True, digest=index.digest,
                              skipped=[p for p in index.problems if p.action == "skipped"],
                              warnings=[p for p in index.problems if p.action == "kept"])
        if not force:
            raise PackError(f"{out} already exists and is not this pack (other sources or options); "
                            "choose another OUT or pass --force to replace it")
        _check_replaceable(out, _PACK_NAMES, "a finished pack", src)
        shutil.rmtree(out)

    checkpoint = _Checkpointer(work, fingerprint)
    if work.exists() and not checkpoint.load():
        if not force and (work / STATE_NAME).is_file():
            raise PackError(f"{work} holds an unfinished pack with other sources or options; "
                            "rerun that command, or pass --force to start over")
        _check_replaceable(work, _WORK_NAMES, "an unfinished pack", src)
        shutil.rmtree(work)
        checkpoint = _Checkpointer(work, fingerprint)
    work.mkdir(parents=True, exist_ok=True)
    state = checkpoint.state
    resumed_at = int(state["next_position"])
    sink = _make_sink(options, work, int(state["shards"]))
    throttle = float(os.environ.get(ENV_PACK_THROTTLE, "0") or 0)
    total = len(sources)
    limit = options.crop_fit if options.crop_fit is not None else options.max_side
    tasks = [(i, str(p), _name(p, sources.root), label, limit, options.quality)
             for i, (p, label) in enumerate(sources.samples)][resumed_at:]
    next_key, bytes_in, baseline = int(state["next_key"]), 0, 0
    stream = _prepared_stream(tasks, options.workers)
    try:
        for item in stream:
            if item.problem_kind:
                fatal = item.problem_kind in FATAL_KINDS
                if fatal and options.strict:
                    raise PackError(f"{item.source}: {item.problem_kind}: {item.problem_detail} "
                                    "(--strict stops at the first bad file; without it, bad files are skipped)")
                checkpoint.problems.append(Problem(item.source, item.problem_kind, item.problem_detail,
                                                   "skipped" if fatal else "kept"))
            if item.data is not None:
                key = record_key(next_key)
                shard, offset = sink.add(key, item.data, item.ext, item.label)
                checkpoint.records.append(Record(key, item.label, len(item.data), checksum(item.data), item.ext,
                                                 item.width, item.height, item.source, shard, offset))
                next_key += 1
                bytes_in += len(item.data)
                baseline += item.baseline
            if throttle:
                time.sleep(throttle)
            if sink.should_checkpoint():
                checkpoint.save(sink, item.position + 1, next_key)
            if progress is not None:
                progress(item.position + 1, total, bytes_in)
        checkpoint.save(sink, total, next_key)
        records, problems = checkpoint.all_parts()
        if not records:
            raise PackError(f"{src}: none of the {total} files is a usable image; nothing was packed")
        final = work / "final"
        final.mkdir(exist_ok=True)
        sink.finalize(final)
        index = PackIndex(options.format, list(sources.classes), records, problems,
                          {**options.content_options(), "fingerprint": fingerprint}, sink.shards, str(Path(src)))
        index.write(final)
        os.replace(final, out)
    except BaseException as exc:
        stream.close()  # stop the pool's workers now, not whenever the generator is collected
        try:
            sink.close()
        except Exception:  # noqa: BLE001 - closing after a failed write may fail the same way; the first error counts
            pass
        if isinstance(exc, PackError):  # strict stop or nothing usable: nothing to resume
            shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)
    bytes_out = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    return PackResult(out, options.format, len(records), [p for p in problems if p.action == "skipped"],
                      [p for p in problems if p.action == "kept"], bytes_in, bytes_out,
                      time.perf_counter() - started, resumed_at, False, index.digest, baseline)
