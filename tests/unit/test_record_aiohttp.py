"""Requests made through aiohttp (s3fs's client) counted from its coroutines against a real local server: requests,
bytes, connections, failures; and a coroutine a batch submits to an event loop on another thread (as fsspec's
``sync`` does) counts in that batch, while one submitted from outside a batch counts nowhere."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stallscope.recorder import aiohttp_requests, http_requests
from stallscope.recorder.http_requests import BODIES, BODY_BYTES, CONNECTS, FAILED, FIRST_BYTE_NS, REQUESTS
from tests.local_http import PAYLOAD, serving

aiohttp = pytest.importorskip("aiohttp", reason="aiohttp is not installed (s3fs brings it)")


@pytest.fixture(scope="module")
def server():
    with serving() as address:
        yield f"http://{address}"


@pytest.fixture
def patched(monkeypatch):
    """aiohttp's classes as the recorder patches them, put back after the test."""
    import aiohttp.client
    import aiohttp.connector
    import aiohttp.streams

    for cls, name, wrap in ((aiohttp.client.ClientSession, "_request", aiohttp_requests._wrap_request),
                            (aiohttp.connector.TCPConnector, "_create_connection", aiohttp_requests._wrap_connect),
                            (aiohttp.streams.StreamReader, "_wait", aiohttp_requests._wrap_body_wait),
                            (aiohttp.streams.StreamReader, "_read_nowait_chunk", aiohttp_requests._wrap_body_take)):
        monkeypatch.setattr(cls, name, wrap(cls.__dict__[name]))
    yield
    http_requests.end_batch()


async def _get(url: str, paths: list[str]) -> list[bytes]:
    async with aiohttp.ClientSession() as session:
        bodies = []
        for path in paths:
            async with session.get(url + path) as response:
                bodies.append(await response.read())
        return bodies


def test_each_request_is_counted_with_its_body_and_connection(server, patched):
    http_requests.begin_batch()
    bodies = asyncio.run(_get(server, ["/a", "/b"]))
    tally = http_requests.end_batch()
    assert bodies == [PAYLOAD, PAYLOAD]
    assert tally[REQUESTS] == 2 and tally[BODIES] == 2 and tally[FAILED] == 0
    assert tally[BODY_BYTES] == 2 * len(PAYLOAD)
    assert tally[CONNECTS] == 1 and tally[FIRST_BYTE_NS] > 0  # one kept-alive connection for both


def test_an_error_answer_is_a_failed_request(server, patched):
    http_requests.begin_batch()
    assert asyncio.run(_get(server, ["/missing"])) == [b"no"]
    tally = http_requests.end_batch()
    assert tally[REQUESTS] == 1 and tally[FAILED] == 1


def test_a_coroutine_a_batch_hands_to_another_threads_loop_counts_in_that_batch(server, patched):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        http_requests.begin_batch()  # as fsspec's sync() does: submit, then wait for the answer
        assert asyncio.run_coroutine_threadsafe(_get(server, ["/a"]), loop).result(10) == [PAYLOAD]
        tally = http_requests.end_batch()
        assert tally[REQUESTS] == 1 and tally[BODY_BYTES] == len(PAYLOAD)
        assert len(tally) == http_requests.FIELDS  # the batch's own requests, not a background thread's
        # outside a batch: counted nowhere, and the loop's thread is no loader thread
        assert asyncio.run_coroutine_threadsafe(_get(server, ["/a"]), loop).result(10) == [PAYLOAD]
        http_requests.begin_batch()
        assert http_requests.end_batch() is None
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_a_body_read_in_pieces_counts_each_byte_once(server, patched):
    async def pieces() -> bytes:
        async with aiohttp.ClientSession() as session, session.get(server + "/a") as response:
            head = await response.content.readexactly(1000)
            rest = [chunk async for chunk in response.content.iter_chunked(4096)]
            return head + b"".join(rest)
    http_requests.begin_batch()
    assert asyncio.run(pieces()) == PAYLOAD
    tally = http_requests.end_batch()
    assert tally[REQUESTS] == 1 and tally[BODY_BYTES] == len(PAYLOAD)


def test_a_loader_threads_loop_working_for_a_batch_has_its_cpu_read_and_its_requests_stay_the_batchs(server,
                                                                                                     patched):
    """fsspec's event-loop thread, started in a worker, is one of the loader's threads: its CPU (signing, parsing)
    is read around the batches like a download thread's, while the requests it makes for a waiting batch are that
    batch's own."""
    from stallscope.constants import DOWNLOAD_LIBRARIES

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread._stallscope_loader_thread = DOWNLOAD_LIBRARIES.index("fsspec")  # as watch_thread_starts marks it
    thread.start()
    try:
        assert http_requests.loader_threads_cpu_ns() == -1  # no loader thread has worked yet
        http_requests.begin_batch()
        assert asyncio.run_coroutine_threadsafe(_get(server, ["/a"]), loop).result(10) == [PAYLOAD]
        tally = http_requests.end_batch()
        assert len(tally) == http_requests.FIELDS and tally[REQUESTS] == 1  # the batch's, no background count
        assert http_requests.loader_threads_cpu_ns() > 0  # the loop's thread is registered, its CPU read
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
        http_requests._background.clear()
        http_requests._thread_clocks.clear()
        http_requests._ended_cpu[0] = 0
        http_requests._retired[:] = [0] * len(http_requests._retired)
