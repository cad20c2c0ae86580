"""The HTTP requests a fetch makes, seen from inside: object stores (boto3), ``requests``, ``urllib``.

Every synchronous Python HTTP client ends in ``http.client`` (urllib3, and so botocore and ``requests``, subclass
its connection), so its connect, ``getresponse`` and body reads are where a request is timed, whatever library
made it: per fetch, the requests, their wait for the first byte (the request sent to the response's headers: the
store's latency and the network's), the time reading bodies, the bytes read, the connections opened and the
requests that failed. The client libraries' own calls are timed as ``storage`` too (``S3 GetObject``), so their
CPU (signing, parsing, checksums) is the store's, not the dataset's.

Every batch counts its requests, whether or not its calls are timed (a failed request is rare and must not fall
in a batch whose calls went untimed). Outside a fetch each wrapper is one attribute read and a call.

Streaming libraries download from their own threads (MosaicML Streaming's shard downloads, LitData's chunk
prefetch, boto3's ``download_file``): a thread started inside a fetch, by such a thread, or in a DataLoader worker
is the loader's, and its requests count in whichever batches they overlap, as made in the background, with the
library that started it.

A connection opened in one process and used in another was inherited through ``fork``: the training process
opened it (a client built in the dataset's ``__init__``) and its DataLoader workers send requests over the same
socket, so their answers can cross (a shard that arrives garbled, a response read by the wrong worker). Each
process says once per connection's opener and address that it did (``shared_connection``).
"""

from __future__ import annotations

import contextvars
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from stallscope.constants import DOWNLOAD_LIBRARIES
from stallscope.recorder import events
from stallscope.recorder.calls import current_account, timed_call

_perf = time.perf_counter_ns

#: Positions in a fetch's request tally (``FetchAccount.requests``, the ``fetch`` event's ``requests`` field).
REQUESTS, FIRST_BYTE_NS, BODY_NS, BODY_BYTES, FAILED, CONNECTS, CONNECT_NS, BODIES = range(8)
FIELDS = 8
#: Then, where the loader's own threads made some of them in the background: how many, and which library started
#: those threads (an index into ``DOWNLOAD_LIBRARIES``).
BACKGROUND, LIBRARY = 8, 9
#: Modules a thread's start passes through that do not say who started it.
_PLUMBING = ("threading", "concurrent", "stallscope", "multiprocessing", "queue", "asyncio")
#: An HTTP status at or above this is a failed request (throttling and server errors among them).
FAILED_STATUS = 400


class _BatchLocal(threading.local):
    """Per thread: the tally of the batch being fetched (None outside a fetch), and whether a body read or a connect
    is in progress (one nested in another is the outer one's). Class defaults make a thread that never fetched read
    None without a miss."""
    tally: list[int] | None = None
    reading = False
    connecting = False
    background: list[int] | None = None  # a loader's own thread: what it has requested so far
    resolved = False  # whether this thread has been looked at for being the loader's
    base: list[int] | None = None  # the background threads' totals when this thread's batch began


_local = _BatchLocal()
#: Every live background thread with its tally (summed at a batch's ends); a thread that has ended is folded into
#: ``_retired`` when the next one registers, so a run that starts a thread an epoch keeps a short list.
_background: list[tuple[threading.Thread, list[int]]] = []
_retired = [0] * (FIELDS + 2)
_registry_lock = threading.Lock()  # a fold moves counts from a thread's tally to _retired: never seen half done


_pid = [os.getpid()]  # this process's id, kept current at fork (getresponse compares it with a connection's opener)
_inherited_said: set[tuple[int, str]] = set()  # (opener's pid, address) this process has said it used


#: The loader's own threads' CPU clocks (registered by each thread itself, so read while it lived) and what each
#: read last; ``_ended_cpu`` holds the last reading of those that have ended.
_thread_clocks: dict[int, int] = {}
_ended_cpu = [0]


def _new_lock_after_fork() -> None:
    """A worker forked while a loader thread held the lock gets one of its own, not one no thread will release."""
    global _registry_lock
    _registry_lock = threading.Lock()
    _pid[0] = os.getpid()
    _inherited_said.clear()
    _thread_clocks.clear()  # no thread survives a fork
    _ended_cpu[0] = 0


def loader_threads_cpu_ns() -> int:
    """The CPU the loader's own threads that made requests (a streaming library's downloads) have used so far,
    summed; -1 where there are none. Read around each of a worker's batches: a download thread's CPU (signing,
    parsing, checksums, writing the shard) takes a core as the batch's own work does."""
    if not _thread_clocks and not _ended_cpu[0]:
        return -1
    with _registry_lock:
        for clock in list(_thread_clocks):
            try:
                _thread_clocks[clock] = time.clock_gettime_ns(clock)
            except OSError:  # the thread ended: its last reading stays counted
                _ended_cpu[0] += _thread_clocks.pop(clock)
        return _ended_cpu[0] + sum(_thread_clocks.values())


def _note_inherited(connection: Any) -> None:
    """Say (once per opener and address in this process) that a request went over a connection another process
    opened: one this process inherited when it was forked."""
    opener = getattr(connection, "_stallscope_pid", None)
    if opener is None or opener == _pid[0]:
        return
    address = f"{getattr(connection, 'host', '?')}:{getattr(connection, 'port', '?')}"
    if (opener, address) in _inherited_said:
        return
    _inherited_said.add((opener, address))
    events.emit("shared_connection", _pid[0], _perf(), opener, address)


os.register_at_fork(after_in_child=_new_lock_after_fork)
_in_loader_worker = [False]


#: The batch's tally in the fetching thread's context: asyncio hands a coroutine submitted from there (fsspec's
#: ``sync``, ``asyncio.run``) a copy of that context, so requests it makes on an event loop's thread count as the
#: batch's own (``recorder/aiohttp_requests.py``). Threads start with an empty context: a download thread's requests
#: stay its own.
batch_context: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("stallscope_batch", default=None)


def begin_batch() -> None:
    """A fetch starts: its requests are counted from here (``recorder/workers.py``)."""
    _local.tally = tally = [0] * FIELDS
    _local.base = _background_totals() if _background else None
    batch_context.set(tally)


def end_batch() -> list[int] | None:
    """A fetch ends: its tally, None where it made no request and read nothing from one (a stream opened in an earlier
    batch, a WebDataset shard, is read over many). The loader's own threads' requests meanwhile are added in, their
    count and library after the tally's own fields."""
    tally, _local.tally = _local.tally, None
    batch_context.set(None)
    if tally is not None and _background:
        base, now = _local.base or [0] * (FIELDS + 2), _background_totals()
        made = [now[i] - base[i] for i in range(FIELDS)]
        if any(made):
            tally = [tally[i] + made[i] for i in range(FIELDS)] + [made[REQUESTS], now[LIBRARY]]
    return tally if tally and any(tally) else None


def _background_totals() -> list[int]:
    """The background threads' fields summed, then their library (the first one named)."""
    with _registry_lock:
        totals = list(_retired)
        for _, counts in _background:
            for i in range(FIELDS):
                totals[i] += counts[i]
            totals[LIBRARY] = totals[LIBRARY] or counts[LIBRARY]
    return totals


def _this_thread_tally() -> list[int] | None:
    """Outside a batch: this thread's background tally where it is one of the loader's threads, else None.
    Looked up once a thread."""
    local = _local
    if local.background is not None or local.resolved:
        return local.background
    local.resolved = True
    library = getattr(threading.current_thread(), "_stallscope_loader_thread", None)
    if library is not None:
        local.background = [0] * FIELDS + [0, library]
        _register(local.background)
    return local.background


def tally_here() -> list[int] | None:
    """The tally a request made on this thread now counts in: the batch's inside a fetch (or in a coroutine a fetch
    submitted to an event loop), else this thread's where it is one of the loader's own, else None (a request
    nobody waits on in a batch)."""
    tally = _local.tally
    if tally is not None:
        return tally
    tally = batch_context.get()
    if tally is None:
        return _this_thread_tally()
    if not _local.resolved:  # a loader's own thread (fsspec's event loop) working for the batch: its CPU is read
        _this_thread_tally()  # around the batches, as a download thread's is
    return tally


def _register(tally: list[int]) -> None:
    """Add this thread's tally to the registry, folding those of threads that have ended into ``_retired`` (an
    ended thread's tally no longer changes)."""
    with _registry_lock:
        for entry in [entry for entry in _background if not entry[0].is_alive()]:
            for i in range(FIELDS):
                _retired[i] += entry[1][i]
            _retired[LIBRARY] = _retired[LIBRARY] or entry[1][LIBRARY]
            _background.remove(entry)
        _background.append((threading.current_thread(), tally))
        if hasattr(time, "pthread_getcpuclockid"):  # this thread's own clock, taken while it surely lives
            _thread_clocks[time.pthread_getcpuclockid(threading.get_ident())] = time.thread_time_ns()


def in_loader_worker() -> None:
    """This process is a DataLoader worker: every thread it starts from now on is the loader's."""
    _in_loader_worker[0] = True


def _starting_library() -> int:
    """The library whose code starts a thread (its index in ``DOWNLOAD_LIBRARIES``), from the caller's frames."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(24):
        if frame is None:
            break
        top = str(frame.f_globals.get("__name__", "")).partition(".")[0]
        if top not in _PLUMBING:
            return DOWNLOAD_LIBRARIES.index(top) if top in DOWNLOAD_LIBRARIES else 0
        frame = frame.f_back
    return 0


def watch_thread_starts(module: Any) -> None:
    """Mark the threads the loader starts (inside a fetch, from one of its threads, in a worker) so that their
    requests count as its background requests. A thread start is rare: a frame walk each is nothing."""
    cls = module.Thread
    original = cls.__dict__.get("start")
    if original is None or getattr(original, "__stallscope_wrapped__", False):
        return

    @functools.wraps(original)
    def start(self: Any) -> Any:
        own = _this_thread_tally()
        parent = own[LIBRARY] if own is not None else None
        if parent == 0 or (parent is None and (_local.tally is not None or _in_loader_worker[0])):
            parent = _starting_library()  # started by the loader: whose code (a known library's, or 0)
        if parent is not None:
            self._stallscope_loader_thread = parent
        return original(self)

    start.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    cls.start = start


def _wrap_getresponse(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def getresponse(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_stallscope_pid", _pid[0]) != _pid[0]:
            _note_inherited(self)
        tally = _local.tally
        if tally is None:
            tally = _this_thread_tally()
            if tally is None:
                return original(self, *args, **kwargs)
        t0 = _perf()
        failed = True
        try:
            response = original(self, *args, **kwargs)
            failed = getattr(response, "status", 0) >= FAILED_STATUS
            return response
        finally:
            tally[REQUESTS] += 1
            tally[FIRST_BYTE_NS] += _perf() - t0
            tally[FAILED] += failed
    getresponse.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return getresponse


def _wrap_connect(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def connect(self: Any, *args: Any, **kwargs: Any) -> Any:
        tally = _local.tally
        if tally is None:
            tally = _this_thread_tally()
        if tally is None or _local.connecting:
            result = original(self, *args, **kwargs)
            self._stallscope_pid = _pid[0]  # who opened it: a request from another process shares its socket
            return result
        _local.connecting = True
        t0 = _perf()
        failed = True
        try:
            result = original(self, *args, **kwargs)
            failed = False
            self._stallscope_pid = _pid[0]
            return result
        finally:
            _local.connecting = False
            tally[CONNECTS] += 1
            tally[CONNECT_NS] += _perf() - t0
            if failed:  # refused, unreachable, timed out: a request that never got as far as being sent
                tally[REQUESTS] += 1
                tally[FAILED] += 1
    connect.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return connect


def _wrap_body_read(original: Callable[..., Any]) -> Callable[..., Any]:
    """A body read: its bytes (``read``'s length or ``readinto``'s count) and wall time; one read made inside
    another (a buffered ``read`` calling ``readinto``) is the outer one's."""
    @functools.wraps(original)
    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        tally = _local.tally
        if tally is None:
            tally = _this_thread_tally()
        if tally is None or _local.reading:
            return original(self, *args, **kwargs)
        _local.reading = True
        t0 = _perf()
        result = None
        try:
            result = original(self, *args, **kwargs)
            return result
        finally:
            _local.reading = False
            tally[BODY_NS] += _perf() - t0
            got = 0
            if isinstance(result, int):
                got = result
            elif result is not None:
                try:
                    got = len(result)
                except TypeError:
                    pass
            tally[BODY_BYTES] += got
            if got and not getattr(self, "_stallscope_bodied", False):  # an answer with a body (not a HEAD's)
                self._stallscope_bodied = True
                tally[BODIES] += 1
    read.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return read


def _patch(cls: type, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = cls.__dict__.get(name)
    if original is not None and callable(original) and not getattr(original, "__stallscope_wrapped__", False):
        setattr(cls, name, wrap(original))


def patch_http_client(module: Any) -> None:
    _patch(module.HTTPConnection, "connect", _wrap_connect)
    _patch(module.HTTPConnection, "getresponse", _wrap_getresponse)
    for name in ("read", "readinto", "read1"):
        _patch(module.HTTPResponse, name, _wrap_body_read)


def patch_urllib3_connection(module: Any) -> None:
    """urllib3's connections open their socket themselves, not through http.client's ``connect``."""
    for cls_name in ("HTTPConnection", "HTTPSConnection"):
        cls = getattr(module, cls_name, None)
        if cls is not None:
            _patch(cls, "connect", _wrap_connect)


def patch_botocore_client(module: Any) -> None:
    """A boto3/botocore call (``get_object``): its whole time, the client's CPU included, is storage's, labelled by
    its service and operation (``S3 GetObject``)."""
    cls = module.BaseClient
    original = cls.__dict__.get("_make_api_call")
    if original is None or getattr(original, "__stallscope_wrapped__", False):
        return
    labels: dict[tuple[str, str], Callable[..., Any]] = {}

    @functools.wraps(original)
    def make_api_call(self: Any, operation_name: str, api_params: Any) -> Any:
        if current_account() is None:
            return original(self, operation_name, api_params)
        try:
            service = self.meta.service_model.service_id.upper() if hasattr(self.meta, "service_model") else "AWS"
        except Exception:  # noqa: BLE001 (a label is not worth failing the user's call)
            service = "AWS"
        key = (service, str(operation_name))
        timed = labels.get(key)
        if timed is None:
            timed = labels[key] = timed_call(original, "storage", f"{service} {operation_name}")
        return timed(self, operation_name, api_params)

    make_api_call.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    cls._make_api_call = make_api_call


def patch_botocore_response(module: Any) -> None:
    cls = module.StreamingBody
    for name in ("read", "readinto"):
        original = cls.__dict__.get(name)
        if original is not None and not getattr(original, "__stallscope_wrapped__", False):
            setattr(cls, name, timed_call(original, "storage", f"S3 body {name}"))


def patch_requests_sessions(module: Any) -> None:
    original = module.Session.__dict__.get("request")
    if original is not None:
        module.Session.request = timed_call(original, "storage", "requests.Session.request")


def patch_urllib_request(module: Any) -> None:
    original = module.OpenerDirector.__dict__.get("open")
    if original is not None:
        module.OpenerDirector.open = timed_call(original, "storage", "urllib.request.urlopen")


def patch_webdataset_gopen(module: Any) -> None:
    """WebDataset opens a shard by URL through a child process (``curl`` for http(s), the command of a ``pipe:``
    URL, ``gsutil``, ...) and reads its output: each open is a request, the wait for its first read the time to the
    first byte, the reads its body, a child that exits with an error a failed request. The child's own CPU is not
    the worker's."""
    pipe = module.Pipe
    init, read, check = pipe.__dict__.get("__init__"), pipe.__dict__.get("read"), pipe.__dict__.get("check_status")
    if init is None or read is None or getattr(read, "__stallscope_wrapped__", False):
        return

    @functools.wraps(init)
    def opened(self: Any, *args: Any, **kwargs: Any) -> None:
        tally = _local.tally
        t0 = _perf()
        try:
            init(self, *args, **kwargs)
        finally:
            self._stallscope_unread = True
            if tally is not None:
                tally[REQUESTS] += 1
                tally[BODIES] += 1
                tally[CONNECTS] += 1
                tally[CONNECT_NS] += _perf() - t0

    @functools.wraps(read)
    def read_output(self: Any, *args: Any, **kwargs: Any) -> Any:
        tally = _local.tally
        if tally is None:
            return read(self, *args, **kwargs)
        t0 = _perf()
        data = read(self, *args, **kwargs)
        took = _perf() - t0
        if getattr(self, "_stallscope_unread", False):  # the first read waits for the source to answer
            self._stallscope_unread = False
            tally[FIRST_BYTE_NS] += took
        else:
            tally[BODY_NS] += took
        tally[BODY_BYTES] += len(data) if data else 0
        return data

    pipe.__init__ = opened
    pipe.read = read_output
    read_output.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    if check is not None:
        @functools.wraps(check)
        def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return check(self, *args, **kwargs)
            except BaseException:
                tally = _local.tally
                if tally is not None:
                    tally[FAILED] += 1
                raise
        pipe.check_status = checked


#: module name -> patch, applied right after that module is imported (``recorder/libraries.py`` holds the rest).
REQUEST_PATCHES: dict[str, Any] = {
    "http.client": patch_http_client,
    "urllib3.connection": patch_urllib3_connection,
    "botocore.client": patch_botocore_client,
    "botocore.response": patch_botocore_response,
    "requests.sessions": patch_requests_sessions,
    "urllib.request": patch_urllib_request,
    "webdataset.gopen": patch_webdataset_gopen,
}
