"""Requests made through obstore, the Rust object-store client (LitData's chunk downloads go through it).

obstore's requests never reach ``http.client``: its HTTP runs in Rust. They are timed at its Python functions
instead, into the same per-batch tally as every other request (``recorder/http_requests.py``):

- ``get`` returns once the answer's headers are in: its time is the wait for the first byte; the body is read
  later through the result's ``stream()``, ``bytes()`` or iteration, timed as the body with its bytes;
- ``get_range`` and ``get_ranges`` return the bytes whole: their time is counted as the wait for the first byte
  (a range read is mostly that), their bytes as the body's, one request a call (obstore may split or merge ranges);
- an exception is a failed request (obstore raises for 4xx and 5xx answers and for refused connections).

The connections obstore opens, and the CPU of its Rust threads, are not seen.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from stallscope.recorder.http_requests import BODIES, BODY_BYTES, BODY_NS, FAILED, FIRST_BYTE_NS, REQUESTS, tally_here

_perf = time.perf_counter_ns


class _TimedBody:
    """A ``GetResult`` whose body reads are timed; everything else is the result's own."""

    __slots__ = ("_result", "_tally")

    def __init__(self, result: Any, tally: list[int]) -> None:
        self._result = result
        self._tally = tally
        tally[BODIES] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)

    def bytes(self) -> Any:
        t0 = _perf()
        data = self._result.bytes()
        self._count(_perf() - t0, data)
        return data

    async def bytes_async(self) -> Any:
        t0 = _perf()
        data = await self._result.bytes_async()
        self._count(_perf() - t0, data)
        return data

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        return _TimedStream(self._result.stream(*args, **kwargs), self)

    def __iter__(self) -> Iterator[Any]:
        return _TimedStream(iter(self._result), self)

    def __aiter__(self) -> AsyncIterator[Any]:
        return _TimedStream(self._result.__aiter__(), self)

    def _count(self, took_ns: int, data: Any) -> None:
        self._tally[BODY_NS] += took_ns
        self._tally[BODY_BYTES] += _length(data)


class _TimedStream:
    """A body stream (sync or async) whose chunks are timed as the body's."""

    __slots__ = ("_stream", "_body")

    def __init__(self, stream: Any, body: _TimedBody) -> None:
        self._stream, self._body = stream, body

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __iter__(self) -> _TimedStream:
        return self

    def __next__(self) -> Any:
        t0 = _perf()
        chunk = next(self._stream)  # StopIteration passes through: the end of the body
        self._body._count(_perf() - t0, chunk)
        return chunk

    def __aiter__(self) -> _TimedStream:
        return self

    async def __anext__(self) -> Any:
        t0 = _perf()
        chunk = await self._stream.__anext__()
        self._body._count(_perf() - t0, chunk)
        return chunk


def _length(data: Any) -> int:
    try:
        return len(data)
    except TypeError:
        return 0


def _count_call(tally: list[int], took_ns: int, failed: bool, data: Any = None) -> None:
    tally[REQUESTS] += 1
    tally[FIRST_BYTE_NS] += took_ns
    tally[FAILED] += failed
    if data is not None:
        tally[BODIES] += 1
        tally[BODY_BYTES] += sum(_length(part) for part in data) if isinstance(data, list) else _length(data)


def _wrap_sync(original: Callable[..., Any], whole: bool) -> Callable[..., Any]:
    """``get`` (``whole`` False: its body comes later) or ``get_range(s)`` (``whole``: the bytes come with it)."""
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        tally = tally_here()
        if tally is None:
            return original(*args, **kwargs)
        t0 = _perf()
        try:
            result = original(*args, **kwargs)
        except BaseException:
            _count_call(tally, _perf() - t0, True)
            raise
        _count_call(tally, _perf() - t0, False, result if whole else None)
        return result if whole else _TimedBody(result, tally)
    call.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return call


def _wrap_async(original: Callable[..., Any], whole: bool) -> Callable[..., Any]:
    """The ``_async`` forms: timed from the call to its answer, on the thread whose event loop awaits it."""
    @functools.wraps(original)
    async def call(*args: Any, **kwargs: Any) -> Any:
        tally = tally_here()
        if tally is None:
            return await original(*args, **kwargs)
        t0 = _perf()
        try:
            result = await original(*args, **kwargs)
        except BaseException:
            _count_call(tally, _perf() - t0, True)
            raise
        _count_call(tally, _perf() - t0, False, result if whole else None)
        return result if whole else _TimedBody(result, tally)
    call.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return call


#: obstore's reading functions: name -> whether its answer carries the whole body.
_READS = {"get": False, "get_range": True, "get_ranges": True}


def patch_obstore(module: Any) -> None:
    """Time obstore's reads at the module's functions (``obstore.get``, ``obstore.get_range_async``, ...), which is
    where its users call them."""
    for name, whole in _READS.items():
        for form, wrap in ((name, _wrap_sync), (f"{name}_async", _wrap_async)):
            original = getattr(module, form, None)
            if original is not None and not getattr(original, "__stallscope_wrapped__", False):
                setattr(module, form, wrap(original, whole))


OBSTORE_PATCHES: dict[str, Any] = {"obstore": patch_obstore}
