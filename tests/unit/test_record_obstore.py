"""Reads through obstore (the Rust object-store client LitData downloads with) counted from its Python functions,
against a real obstore store in memory: requests, the body's bytes, failures, sync and async alike; what the
caller gets back is the store's own data."""

from __future__ import annotations

import asyncio
import importlib
import threading

import pytest

from stallscope.recorder import http_requests
from stallscope.recorder.http_requests import BODIES, BODY_BYTES, FAILED, FIRST_BYTE_NS, REQUESTS
from stallscope.recorder.obstore_requests import patch_obstore

obstore = pytest.importorskip("obstore", reason="obstore is not installed (the test extra has it)")
PAYLOAD = bytes(range(256)) * 1000  # 256,000 bytes


@pytest.fixture
def obs():
    """obstore as the recorder patches it (its functions put back after the test), and a store in memory holding
    one object."""
    module = importlib.import_module("obstore")
    originals = {name: getattr(module, name) for name in dir(module) if name.startswith("get")}
    patch_obstore(module)
    from obstore.store import MemoryStore

    store = MemoryStore()
    module.put(store, "shard-0", PAYLOAD)
    yield module, store
    for name, original in originals.items():
        setattr(module, name, original)


def batch(read):
    http_requests.begin_batch()
    try:
        got = read()
    finally:
        tally = http_requests.end_batch()
    return got, tally


def test_a_get_is_a_request_and_its_streamed_body_counts_its_bytes(obs):
    module, store = obs
    got, tally = batch(lambda: b"".join(bytes(c) for c in module.get(store, "shard-0").stream(min_chunk_size=4096)))
    assert got == PAYLOAD
    assert tally[REQUESTS] == 1 and tally[BODIES] == 1 and tally[FAILED] == 0
    assert tally[BODY_BYTES] == len(PAYLOAD) and tally[FIRST_BYTE_NS] > 0


def test_a_whole_read_and_a_range_read_count_their_bytes(obs):
    module, store = obs
    got, tally = batch(lambda: (bytes(module.get(store, "shard-0").bytes()),
                                bytes(module.get_range(store, "shard-0", start=10, length=100))))
    assert got == (PAYLOAD, PAYLOAD[10:110])
    assert tally[REQUESTS] == 2 and tally[BODY_BYTES] == len(PAYLOAD) + 100
    ranges, tally = batch(lambda: module.get_ranges(store, "shard-0", starts=[0, 1000], lengths=[10, 20]))
    assert [bytes(r) for r in ranges] == [PAYLOAD[:10], PAYLOAD[1000:1020]]
    assert tally[REQUESTS] == 1 and tally[BODY_BYTES] == 30


def test_a_missing_object_is_a_failed_request_and_the_error_reaches_the_caller(obs):
    module, store = obs

    def read():
        with pytest.raises(FileNotFoundError):
            module.get(store, "no-such-shard")
    _, tally = batch(read)
    assert tally[REQUESTS] == 1 and tally[FAILED] == 1


def test_async_reads_are_counted_on_the_thread_that_awaits_them(obs):
    module, store = obs

    async def read():
        result = await module.get_async(store, "shard-0")
        body = b"".join([bytes(chunk) async for chunk in result.stream(min_chunk_size=4096)])
        part = await module.get_range_async(store, "shard-0", start=0, length=5)
        return body, bytes(part)
    got, tally = batch(lambda: asyncio.run(read()))
    assert got == (PAYLOAD, PAYLOAD[:5])
    assert tally[REQUESTS] == 2 and tally[BODY_BYTES] == len(PAYLOAD) + 5


def test_reads_outside_a_batch_and_off_the_loaders_threads_are_not_counted(obs):
    module, store = obs
    assert bytes(module.get(store, "shard-0").bytes()) == PAYLOAD  # the result is the store's own, not wrapped
    assert type(module.get(store, "shard-0")).__name__ == "GetResult"
    seen = []
    http_requests.begin_batch()
    thread = threading.Thread(target=lambda: seen.append(bytes(module.get(store, "shard-0").bytes())))
    thread.start()  # threading's start is not watched here: an ordinary thread, not the loader's
    thread.join()
    assert seen == [PAYLOAD] and http_requests.end_batch() is None


def test_patching_twice_wraps_once(obs):
    module, store = obs
    wrapped = module.get
    patch_obstore(module)
    assert module.get is wrapped
