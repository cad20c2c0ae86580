"""Requests made through aiohttp: s3fs and gcsfs (fsspec's object stores, through aiobotocore), and async clients.

aiohttp never reaches ``http.client``, so its requests are timed at its own coroutines, into the same per-batch
tally as every other request (``recorder/http_requests.py``): ``ClientSession._request`` from the call to the
answer's headers (the wait for the first byte, a new connection's set-up left out), ``TCPConnector``'s connection
set-up, and the answer's body in ``StreamReader``, at the two places every read of it passes: its waits for the
network (the body's time) and its taking bytes from the buffer (the body's bytes, each once).

fsspec runs these coroutines on its own event-loop thread while the fetch that asked waits in ``fsspec.asyn.sync``;
asyncio hands a coroutine the context of the thread that submitted it, so the batch's tally travels with it
(``http_requests.batch_context``) and the requests count as the batch's own, not as a download thread's. The wait in
``sync`` is timed as ``storage`` (``fsspec``), as boto3's calls are.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from stallscope.recorder.calls import timed_call
from stallscope.recorder.http_requests import (
    BODIES,
    BODY_BYTES,
    BODY_NS,
    CONNECT_NS,
    CONNECTS,
    FAILED,
    FAILED_STATUS,
    FIRST_BYTE_NS,
    REQUESTS,
    tally_here,
)

_perf = time.perf_counter_ns


def _wrap_request(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def request(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        tally = tally_here()
        if tally is None:
            return await original(self, method, *args, **kwargs)
        t0, connecting = _perf(), tally[CONNECT_NS]
        failed = True
        try:
            response = await original(self, method, *args, **kwargs)
            failed = getattr(response, "status", 0) >= FAILED_STATUS
            if str(method).upper() != "HEAD" and getattr(response, "content_length", 1) != 0:
                tally[BODIES] += 1
            return response
        finally:
            tally[REQUESTS] += 1
            tally[FIRST_BYTE_NS] += max(0, _perf() - t0 - (tally[CONNECT_NS] - connecting))
            tally[FAILED] += failed
    request.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return request


def _wrap_connect(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def create_connection(self: Any, *args: Any, **kwargs: Any) -> Any:
        tally = tally_here()
        if tally is None:
            return await original(self, *args, **kwargs)
        t0 = _perf()
        try:
            return await original(self, *args, **kwargs)
        finally:
            tally[CONNECTS] += 1
            tally[CONNECT_NS] += _perf() - t0
    create_connection.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return create_connection


def _wrap_body_wait(original: Callable[..., Any]) -> Callable[..., Any]:
    """``StreamReader._wait``: where a body read waits for the network (every public read ends there)."""
    @functools.wraps(original)
    async def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        tally = tally_here()
        if tally is None:
            return await original(self, *args, **kwargs)
        t0 = _perf()
        try:
            return await original(self, *args, **kwargs)
        finally:
            tally[BODY_NS] += _perf() - t0
    wait.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return wait


def _wrap_body_take(original: Callable[..., Any]) -> Callable[..., Any]:
    """``StreamReader._read_nowait_chunk``: where a body read takes its bytes from the buffer (each byte once)."""
    @functools.wraps(original)
    def take(self: Any, *args: Any, **kwargs: Any) -> Any:
        data = original(self, *args, **kwargs)
        tally = tally_here()
        if tally is not None:
            tally[BODY_BYTES] += len(data)
        return data
    take.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return take


def _patch(cls: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    original = cls.__dict__.get(name) if cls is not None else None
    if original is not None and not getattr(original, "__stallscope_wrapped__", False):
        setattr(cls, name, wrap(original))


def patch_aiohttp_client(module: Any) -> None:
    _patch(getattr(module, "ClientSession", None), "_request", _wrap_request)


def patch_aiohttp_connector(module: Any) -> None:
    _patch(getattr(module, "TCPConnector", None), "_create_connection", _wrap_connect)


def patch_aiohttp_streams(module: Any) -> None:
    reader = getattr(module, "StreamReader", None)
    _patch(reader, "_wait", _wrap_body_wait)
    _patch(reader, "_read_nowait_chunk", _wrap_body_take)


def patch_fsspec_sync(module: Any) -> None:
    """fsspec's bridge from a blocking call (``fs.cat``, ``open(...).read()``) to its event loop: the wait is the
    store's, as a boto3 call's is."""
    original = getattr(module, "sync", None)
    if original is not None and not getattr(original, "__stallscope_wrapped__", False):
        module.sync = timed_call(original, "storage", "fsspec sync")


AIOHTTP_PATCHES: dict[str, Any] = {
    "aiohttp.client": patch_aiohttp_client,
    "aiohttp.connector": patch_aiohttp_connector,
    "aiohttp.streams": patch_aiohttp_streams,
    "fsspec.asyn": patch_fsspec_sync,
}
