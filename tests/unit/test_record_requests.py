"""HTTP requests made inside a fetch, counted from inside http.client against a real local server: requests,
bytes, connections, failures; and what the analysis makes of a loader's tallies."""

from __future__ import annotations

import dataclasses
import http.client
import socket
import threading
import urllib.error
import urllib.request

import pytest

from stallscope.analysis.store_requests import RequestStats, request_stats
from stallscope.constants import DOWNLOAD_LIBRARIES
from stallscope.recorder import calls, http_requests
from stallscope.recorder.http_requests import BACKGROUND, BODIES, BODY_BYTES, CONNECTS, FAILED, LIBRARY, REQUESTS
from stallscope.render.words.evidence import requests_line
from stallscope.session import FetchRecord
from tests.local_http import PAYLOAD, serving


@pytest.fixture(scope="module")
def server():
    with serving() as address:
        yield address


@pytest.fixture
def patched(monkeypatch):
    """http.client and urllib.request as the recorder patches them, put back after the test."""
    for cls, name, wrap in ((http.client.HTTPConnection, "connect", http_requests._wrap_connect),
                            (http.client.HTTPConnection, "getresponse", http_requests._wrap_getresponse),
                            (http.client.HTTPResponse, "read", http_requests._wrap_body_read),
                            (http.client.HTTPResponse, "readinto", http_requests._wrap_body_read),
                            (http.client.HTTPResponse, "read1", http_requests._wrap_body_read)):
        monkeypatch.setattr(cls, name, wrap(cls.__dict__[name]))
    opener = urllib.request.OpenerDirector.__dict__["open"]
    monkeypatch.setattr(urllib.request.OpenerDirector, "open",
                        calls.timed_call(opener, "storage", "urllib.request.urlopen"))
    yield
    calls.end_fetch()
    http_requests.end_batch()


def test_each_request_is_counted_with_its_bytes_and_connection(server, patched):
    account = calls.begin_fetch()
    http_requests.begin_batch()
    for _ in range(3):
        with urllib.request.urlopen(f"http://{server}/sample", timeout=10) as answer:
            assert answer.read() == PAYLOAD
    calls.end_fetch()
    tally = http_requests.end_batch()
    assert tally is not None
    assert tally[REQUESTS] == 3
    assert tally[CONNECTS] == 3  # urllib opens a connection per request
    assert tally[BODIES] == 3
    assert tally[BODY_BYTES] == 3 * len(PAYLOAD)
    assert tally[FAILED] == 0
    assert account.by_name["urllib.request.urlopen"][2] == 3
    assert account.by_name["urllib.request.urlopen"][3] == "storage"


def test_a_kept_alive_connection_is_opened_once_and_chunked_reads_count_once(server, patched):
    http_requests.begin_batch()  # a batch whose calls are not timed still counts its requests
    connection = http.client.HTTPConnection(server, timeout=10)
    for _ in range(2):
        connection.request("GET", "/sample")
        answer = connection.getresponse()
        received = b""
        while chunk := answer.read(1000):  # read(amt) may call readinto inside: counted once
            received += chunk
        assert received == PAYLOAD
    connection.request("HEAD", "/sample")  # a HEAD's answer has headers only, as a download's first request
    assert connection.getresponse().read() == b""
    connection.close()
    tally = http_requests.end_batch()
    assert tally is not None
    assert (tally[REQUESTS], tally[CONNECTS], tally[BODIES]) == (3, 1, 2)
    assert tally[BODY_BYTES] == 2 * len(PAYLOAD)


def test_failed_requests_are_counted_errors_and_refusals_alike(server, patched):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]  # nothing listens there once the socket closes
    http_requests.begin_batch()
    for path in ("/missing", "/busy"):
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://{server}{path}", timeout=10)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{closed_port}/sample", timeout=10)
    tally = http_requests.end_batch()
    assert tally is not None
    assert tally[REQUESTS] == 3
    assert tally[FAILED] == 3


def test_requests_outside_a_fetch_are_not_counted_and_a_batch_without_any_has_no_tally(server, patched):
    with urllib.request.urlopen(f"http://{server}/sample", timeout=10) as answer:
        assert answer.read() == PAYLOAD
    http_requests.begin_batch()
    assert http_requests.end_batch() is None


def _fetch(start_ms: float, end_ms: float, requests: list[int] | None, timed: bool = True,
           storage_cpu_ns: int = 0) -> FetchRecord:
    by_node = {"storage": [0, storage_cpu_ns, 1]} if storage_cpu_ns else {}
    return FetchRecord(0, 0, 0, 0, int(start_ms * 1e6), int(end_ms * 1e6), 0, -1, 4, by_node, {}, None, 1,
                       timed=timed, requests=requests)


def test_a_loaders_requests_are_summed_and_split_by_what_limits_them():
    # three batches of 4 requests (20 ms to the first byte each, 1 ms of body, 4 KB); the third's calls not timed
    tally = [4, 80_000_000, 4_000_000, 16_000, 0, 1, 2_000_000]
    fetches = [_fetch(0, 90, tally, storage_cpu_ns=3_000_000), _fetch(90, 180, tally, storage_cpu_ns=3_000_000),
               _fetch(180, 270, tally, timed=False)]
    stats = request_stats(fetches, samples=12, storage_s=0.26)
    assert stats is not None
    assert stats.requests == 12
    assert stats.client_cpu_s == pytest.approx(9e-3)  # the timed batches' 6 ms, scaled to all three
    assert stats.per_sample == pytest.approx(1.0)
    assert stats.latency_s == pytest.approx((80e-3 + 2e-3) / 4)  # the first byte and the connect, per request
    assert stats.body_bytes_per_s == pytest.approx(16_000 / 4e-3)
    assert stats.bound == "latency"
    assert stats.in_flight == pytest.approx(3 * 86e-3 / 0.27)  # one at a time, most of the loading span
    assert stats.needed_in_flight(100.0) == pytest.approx(100 * 1.0 * 86e-3 / 4)


def test_a_loader_that_made_no_request_has_no_request_stats():
    assert request_stats([_fetch(0, 10, None)], samples=4, storage_s=0.0) is None


def test_bodies_that_take_longer_than_the_answers_are_bandwidth_bound():
    stats = RequestStats(requests=10, samples=10, batches=1, first_byte_s=0.01, body_s=0.5, connect_s=0.0,
                         body_bytes=50e6, failed=0, connections=1, client_cpu_s=0.02, storage_s=0.55, loading_s=1.0)
    assert stats.bound == "bandwidth"
    assert stats.network_share == pytest.approx(0.53 / 0.55)
    line = requests_line(stats, None)
    assert "(bandwidth-bound)" in line and "`stallscope doctor s3://BUCKET/PREFIX` tells them apart" in line
    latency = dataclasses.replace(stats, first_byte_s=0.6)
    assert latency.bound == "latency" and "doctor" not in requests_line(latency, None)


@pytest.fixture
def loader_threads(patched, monkeypatch):
    """Thread starts watched as the recorder watches them; the registry of background tallies emptied after."""
    monkeypatch.setattr(threading.Thread, "start", threading.Thread.__dict__["start"])
    http_requests.watch_thread_starts(threading)
    yield
    http_requests._background.clear()
    http_requests._retired[:] = [0] * len(http_requests._retired)
    http_requests._in_loader_worker[0] = False
    http_requests._thread_clocks.clear()
    http_requests._ended_cpu[0] = 0


def _library_code(package: str) -> dict:
    """Functions whose frames say they are ``package``'s code, as a streaming library's are."""
    namespace: dict = {"__name__": f"{package}.base.download", "threading": threading, "urllib": urllib}
    exec(  # noqa: S102 (code compiled under another module's name, to be seen as that library's frames)
        "def download(url, times):\n"
        "    for _ in range(times):\n"
        "        with urllib.request.urlopen(url, timeout=10) as answer:\n"
        "            answer.read()\n"
        "def start_downloads(url, times):\n"
        "    thread = threading.Thread(target=download, args=(url, times))\n"
        "    thread.start()\n"
        "    return thread\n", namespace)
    return namespace


def test_a_thread_a_library_starts_inside_a_batch_counts_its_requests_as_that_librarys(server, loader_threads):
    streaming = _library_code("streaming")
    http_requests.begin_batch()
    streaming["start_downloads"](f"http://{server}/sample", 3).join()
    with urllib.request.urlopen(f"http://{server}/sample", timeout=10) as answer:  # and one of the batch's own
        answer.read()
    tally = http_requests.end_batch()
    assert tally is not None
    assert tally[REQUESTS] == 4
    assert tally[BODY_BYTES] == 4 * len(PAYLOAD)
    assert tally[BACKGROUND] == 3
    assert DOWNLOAD_LIBRARIES[tally[LIBRARY]] == "streaming"


def test_a_workers_threads_count_in_the_batches_their_requests_overlap_and_no_other(server, loader_threads):
    http_requests.in_loader_worker()
    gate, done = threading.Event(), threading.Event()

    def downloads():  # started before any batch, as a library's prefetch thread is at its dataset's __iter__
        gate.wait(10)
        for _ in range(2):
            with urllib.request.urlopen(f"http://{server}/sample", timeout=10) as answer:
                answer.read()
        done.set()

    thread = threading.Thread(target=downloads)
    thread.start()
    http_requests.begin_batch()
    assert http_requests.end_batch() is None  # nothing requested yet
    http_requests.begin_batch()
    gate.set()
    assert done.wait(10)
    tally = http_requests.end_batch()
    thread.join()
    assert tally is not None
    assert (tally[REQUESTS], tally[BACKGROUND], tally[LIBRARY]) == (2, 2, 0)  # started by the test: no library
    http_requests.begin_batch()
    assert http_requests.end_batch() is None


def test_a_thread_started_outside_the_loader_is_not_counted(server, loader_threads):
    thread = threading.Thread(target=lambda: urllib.request.urlopen(f"http://{server}/sample", timeout=10).read())
    thread.start()  # not in a batch, not in a worker: a logger's or a tracker's thread
    http_requests.begin_batch()
    thread.join()
    assert http_requests.end_batch() is None


def test_a_thread_started_by_a_librarys_thread_inherits_its_library(server, loader_threads):
    litdata = _library_code("litdata")
    outer_done: list[threading.Thread] = []
    http_requests.begin_batch()

    def outer():  # a library thread that hands its downloads to a pool of its own threads
        outer_done.append(threading.Thread(target=litdata["download"], args=(f"http://{server}/sample", 2)))
        outer_done[0].start()
        outer_done[0].join()

    with_library = {"__name__": "litdata.streaming.reader", "threading": threading, "outer": outer}
    exec("def start():\n    t = threading.Thread(target=outer)\n    t.start()\n    return t\n",  # noqa: S102
         with_library)
    with_library["start"]().join()
    tally = http_requests.end_batch()
    assert tally is not None
    assert (tally[REQUESTS], tally[BACKGROUND]) == (2, 2)
    assert DOWNLOAD_LIBRARIES[tally[LIBRARY]] == "litdata"


def test_requests_made_on_a_librarys_threads_are_summed_with_that_library():
    streaming = DOWNLOAD_LIBRARIES.index("streaming")
    # a HEAD and a GET each download; one GET of the fetch's own, in a session recorded before bodies were counted
    fetches = [_fetch(0, 90, [2, 40_000_000, 1_000_000, 300_000, 0, 1, 1_000_000, 1, 2, streaming]),
               _fetch(90, 180, [1, 20_000_000, 500_000, 150_000, 0, 0, 0]),
               _fetch(180, 270, [2, 40_000_000, 1_000_000, 300_000, 0, 0, 0, 1, 1, streaming])]
    stats = request_stats(fetches, samples=48, storage_s=0.25)
    assert stats is not None
    assert (stats.requests, stats.background, stats.library) == (5, 3, "streaming")
    assert stats.background_share == pytest.approx(0.6)
    assert stats.bodies == 3 and stats.bytes_per_body == pytest.approx(250_000)
    assert stats.to_dict()["library"] == "streaming"


def test_a_latency_bound_librarys_downloads_are_advised_larger_shards_and_a_bandwidth_bound_ones_are_not():
    from stallscope.analysis.recommend import MAX_SHARD_FACTOR, _larger_shards, network_fix

    # 100 downloads of 100 KB: 20 ms to the first byte, 0.1 ms of body each (1 GB/s): latency is nearly all of it
    waiting = RequestStats(requests=100, samples=800, batches=50, first_byte_s=2.0, body_s=0.01, connect_s=0.0,
                           body_bytes=100 * 100_000, failed=0, connections=1, client_cpu_s=0.05, storage_s=2.1,
                           loading_s=3.0, background=90, library="streaming", bodies=100)
    advice = _larger_shards(waiting, None, 1, share=0.6)
    assert advice is not None and advice.id == "larger-shards"
    assert advice.facts["factor"] == MAX_SHARD_FACTOR  # a body 4x the latency would need 800x: capped
    assert advice.facts["target_bytes"] == pytest.approx(MAX_SHARD_FACTOR * 100_000)
    assert advice.predicted_speedup == pytest.approx(round(1 / (1 - 0.6 * (1 - 1 / MAX_SHARD_FACTOR)), 2))
    # the same downloads, 10 MB each at 100 MB/s: the body is the time, and larger shards would not shorten it
    reading = RequestStats(requests=100, samples=800, batches=50, first_byte_s=2.0, body_s=10.0, connect_s=0.0,
                           body_bytes=100 * 10e6, failed=0, connections=1, client_cpu_s=0.05, storage_s=12.0,
                           loading_s=13.0, background=90, library="streaming", bodies=100)
    assert _larger_shards(reading, None, 1, share=0.6) is None
    assert network_fix(waiting, None, 1, share=0.6).id == "larger-shards"
    # the same requests from threads the dataset started itself (a pool in __getitems__): no library's shards
    own_pool = dataclasses.replace(waiting, library="")
    assert network_fix(own_pool, None, 1, share=0.6).id == "requests-in-flight"


def test_an_fsspec_batch_is_read_at_once_as_its_pool_allows_and_a_threads_client_on_at_most_eight_threads():
    from stallscope.analysis.recommend import FSSPEC_CONNECTIONS, MAX_REQUEST_THREADS, network_fix
    from stallscope.render.words.recommendations import recommendation

    # batches of 16 objects, a HEAD and a GET each (s3fs): 32 requests a batch, 16 of them with a body
    fsspec = RequestStats(requests=320, samples=160, batches=10, first_byte_s=7.0, body_s=0.01, connect_s=0.0,
                          body_bytes=160 * 30_000, failed=0, connections=1, client_cpu_s=0.5, storage_s=7.5,
                          loading_s=8.0, client="fsspec", bodies=160)
    batched = network_fix(fsspec, None, 1, share=0.8)
    assert batched is not None and batched.id == "requests-in-flight"
    assert batched.facts["threads"] == FSSPEC_CONNECTIONS  # 16 objects at once, 10 connections
    said = recommendation(batched)
    assert "fs.cat([paths])" in said.change and "ThreadPoolExecutor" not in said.change and "fs.cat" in said.title
    threads = network_fix(dataclasses.replace(fsspec, client="boto3"), None, 1, share=0.8)
    assert threads is not None and threads.facts["threads"] == MAX_REQUEST_THREADS
    assert "ThreadPoolExecutor(8)" in recommendation(threads).change


def test_ended_download_threads_are_folded_and_their_requests_still_count_once(server, loader_threads):
    streaming = _library_code("streaming")
    http_requests.begin_batch()
    for _ in range(3):  # a thread an epoch, each ended before the next starts
        streaming["start_downloads"](f"http://{server}/sample", 1).join()
    tally = http_requests.end_batch()
    assert tally is not None and (tally[REQUESTS], tally[BACKGROUND]) == (3, 3)
    assert len(http_requests._background) == 1  # the two ended before the last registered are folded
    assert http_requests._retired[REQUESTS] == 2
    http_requests.begin_batch()
    assert http_requests.end_batch() is None  # folding moved counts, it did not add any


def test_a_connection_opened_before_a_fork_is_said_once_by_the_process_that_then_uses_it(server, patched,
                                                                                          monkeypatch):
    """A real connection, opened and used in this process, then used by a forked child: the child says so once
    (its opener's pid and the address), however many requests it sends; a connection the child opens is its own."""
    import json
    import os

    readable, writable = os.pipe()
    monkeypatch.setattr(http_requests.events, "emit",
                        lambda *record: os.write(writable, (json.dumps(record) + "\n").encode()))
    host, port = server.split(":")
    inherited = http.client.HTTPConnection(host, int(port), timeout=10)
    inherited.request("GET", "/sample")
    assert inherited.getresponse().read() == PAYLOAD  # its opener's own request: nothing said
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        status = 1
        try:
            for _ in range(3):
                inherited.request("GET", "/sample")
                assert inherited.getresponse().read() == PAYLOAD
            own = http.client.HTTPConnection(host, int(port), timeout=10)
            own.request("GET", "/sample")
            assert own.getresponse().read() == PAYLOAD
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(child, 0)
    os.close(writable)
    with os.fdopen(readable) as said:
        records = [json.loads(line) for line in said.read().splitlines()]
    assert os.waitstatus_to_exitcode(status) == 0
    assert [(r[0], r[1], r[3], r[4]) for r in records] == [("shared_connection", child, parent, server)]


def test_a_workers_download_threads_cpu_is_read_while_they_run_and_kept_once_they_end(server, loader_threads):
    """A worker's download thread (one that made a request): its CPU is read around each batch, and what it had
    used when last read stays counted once it has ended; none such: -1."""
    import time

    assert http_requests.loader_threads_cpu_ns() == -1
    http_requests.in_loader_worker()
    burned, go_on = threading.Event(), threading.Event()

    def downloads():
        with urllib.request.urlopen(f"http://{server}/sample", timeout=10) as answer:
            answer.read()
        end = time.thread_time() + 0.2
        while time.thread_time() < end:  # parsing, hashing, writing a shard: CPU
            pass
        burned.set()
        go_on.wait(10)

    thread = threading.Thread(target=downloads)
    before = time.thread_time_ns()
    thread.start()
    assert burned.wait(10)
    running = http_requests.loader_threads_cpu_ns()
    assert 0.2e9 <= running <= 2e9
    go_on.set()
    thread.join()
    assert http_requests.loader_threads_cpu_ns() >= running  # ended: its last reading stays
    assert time.thread_time_ns() - before < 0.1e9  # none of it was this thread's


def test_a_workers_batch_counts_its_download_threads_cpu_as_storages_cpu_not_as_time_blocked():
    from stallscope.analysis.pipeline import cpu_shares, fetch_parts, split_fetch

    ms = 1_000_000
    # 100 ms: 20 ms of its own CPU (decode), 10 ms waiting for a core, 70 ms off it; its download thread ran 30 ms
    waited = FetchRecord(0, 0, 0, 0, 0, 100 * ms, 20 * ms, 10 * ms, 8, {"decode": [20 * ms, 20 * ms, 8]}, {}, None,
                         501, threads_cpu_ns=30 * ms, requests=[4, 0, 0, 0, 0, 0, 0, 4, 4, 1])
    cpu, runqueue, blocked = fetch_parts(waited)
    assert {k: v for k, v in cpu.items() if v} == {"decode": 20 * ms, "storage": 30 * ms}
    assert (runqueue, blocked) == (10 * ms, 40 * ms)
    assert split_fetch(waited)["storage"] == 70 * ms  # the same storage time: less of it free to overlap
    shares = cpu_shares([waited])  # how the thread's own CPU splits, for untimed batches
    assert shares is not None and shares["decode"] == 1.0 and not shares.get("storage")
    # more download CPU than the batch spent off its CPU: only what it could have waited for
    busy = dataclasses.replace(waited, threads_cpu_ns=90 * ms)
    assert fetch_parts(busy)[0]["storage"] == 70 * ms and fetch_parts(busy)[2] == 0
    stats = request_stats([waited], 8, 0.07)
    assert stats is not None and stats.client_cpu_s == pytest.approx(0.03)
    # the training process's own batch (worker -1): its other threads held the interpreter, as before
    in_process = dataclasses.replace(waited, worker=-1, pid=100)
    cpu, runqueue, blocked = fetch_parts(in_process)
    assert not cpu.get("storage") and (runqueue, blocked) == (10 * ms + 30 * ms, 40 * ms)


def test_a_loaders_blocked_time_leaves_out_the_download_threads_cpu_it_counts_as_storages():
    from stallscope.analysis import analyze
    from tests.unit.test_analysis_pitfalls import base

    ms = 1_000_000
    session = base(workers=1)
    # each 100 ms batch: 20 ms of its own CPU, 10 ms waiting for a core, 70 ms off it, 30 of them its download thread's
    fetches = [FetchRecord(0, 0, 0, k, 100 * ms * k, 100 * ms * (k + 1), 20 * ms, 10 * ms, 4,
                           {"decode": [20 * ms, 20 * ms, 4]}, {}, None, 501, threads_cpu_ns=30 * ms,
                           requests=[1, 0, 0, 0, 0, 0, 0, 1, 1, 1]) for k in range(6)]
    pipeline = analyze(dataclasses.replace(session, fetches=fetches)).loaders[0].pipeline
    assert pipeline.blocked_s == pytest.approx(6 * 0.04)  # not 0.07: the thread's 30 ms are storage's CPU
    assert pipeline.node_cpu_s["storage"] == pytest.approx(6 * 0.03)
    # the batch's parts make its wall time once: its CPU, storage's CPU, the run queue and the time blocked
    assert (pipeline.cpu_s + pipeline.node_cpu_s["storage"] + pipeline.runqueue_s + pipeline.blocked_s
            == pytest.approx(pipeline.busy_s))


def test_larger_shards_take_the_download_threads_cpu_off_the_batches_wait_as_they_take_the_latency():
    from stallscope.analysis.capacity import ThroughputModel
    from stallscope.analysis.recommend import _larger_shards

    # per sample: 2 ms decoding, 2.5 ms waiting on the store, 1 ms of the download thread's CPU waited on
    model = ThroughputModel({"decode": 0.002, "storage": 0.0025, "storage_cpu": 0.001}, 0.0005, 0.0005, 1, 2.0)
    downloads = RequestStats(requests=100, samples=800, batches=50, first_byte_s=2.0, body_s=0.01, connect_s=0.0,
                             body_bytes=100 * 100_000, failed=0, connections=1, client_cpu_s=0.8, storage_s=2.8,
                             loading_s=6.0, background=100, library="streaming", bodies=100, download_cpu_s=0.8)
    ahead = _larger_shards(downloads, model, 1, share=0.5)
    in_the_fetch = _larger_shards(dataclasses.replace(downloads, download_cpu_s=0.0), model, 1, share=0.5)
    assert ahead is not None and in_the_fetch is not None
    # the fetch's own client CPU stays; the download thread's, waited on like the latency, goes with it
    assert ahead.predicted_speedup > in_the_fetch.predicted_speedup


def test_larger_shards_divide_the_per_request_cpu_of_the_client_and_the_local_store_not_the_per_byte_cpu():
    from stallscope.analysis.capacity import ThroughputModel
    from stallscope.analysis.recommend import CPU_S_PER_BODY_BYTE, _larger_shards, _larger_shards_cpu

    # per sample: 2 ms decoding, 2.5 ms waiting on the store, 3 ms of the download thread's CPU; the store on this
    # machine 1 ms; a shard of 160 KB holds 8 samples (20 KB of body each): 2 cores, 1 worker
    model = ThroughputModel({"decode": 0.002, "storage": 0.0025, "storage_cpu": 0.003}, 0.0005, 0.0005, 1, 2.0,
                            helper_cpu_per_sample_s=0.001, server_cpu_per_sample_s=0.001)
    downloads = RequestStats(requests=100, samples=800, batches=50, first_byte_s=3.0, body_s=0.01, connect_s=0.0,
                             body_bytes=100 * 160_000, failed=0, connections=1, client_cpu_s=2.4, storage_s=2.0,
                             loading_s=6.0, background=100, library="streaming", bodies=100, download_cpu_s=2.4)
    per_byte = CPU_S_PER_BODY_BYTE * 20_000
    priced, scale = _larger_shards_cpu(model, downloads, 16, 0.0, {"storage": 0.0, "storage_cpu": 1.0})
    # the client's CPU: its per-byte part stays, the rest a sixteenth; all of it the download thread's, which the
    # worker no longer waits on: out of the worker's time, into the budget beside the servers'
    client_after = per_byte + (0.003 - per_byte) / 16
    assert scale["storage_cpu"] == pytest.approx(0.0)
    assert priced.server_cpu_per_sample_s == pytest.approx(per_byte + (0.001 - per_byte) / 16)
    assert priced.helper_cpu_per_sample_s == pytest.approx(priced.server_cpu_per_sample_s + client_after)
    # the same CPU as a helper of the training process's (not a server of its requests) stays whole
    helper_only = dataclasses.replace(model, server_cpu_per_sample_s=0.0)
    assert _larger_shards_cpu(helper_only, downloads, 16, 0.0, {})[0].helper_cpu_per_sample_s == pytest.approx(
        0.001 + client_after)
    # so the advice gains more where the store's CPU follows the requests
    with_server = _larger_shards(downloads, model, 4, share=0.5)  # 4 workers: the cores are the limit
    without = _larger_shards(downloads, helper_only, 4, share=0.5)
    assert with_server is not None and without is not None
    assert with_server.predicted_speedup > without.predicted_speedup
    # bodies of 32 MB a sample: their CPU is per byte, and larger shards leave it
    heavy = dataclasses.replace(downloads, body_bytes=100 * 256_000_000)
    _, heavy_scale = _larger_shards_cpu(model, heavy, 16, 1.0, {"storage": 1.0, "storage_cpu": 1.0})
    assert heavy_scale["storage_cpu"] == pytest.approx(1.0)


def test_the_overlap_a_pool_already_has_is_read_over_the_whole_wait_its_threads_cpu_included():
    from stallscope.analysis.capacity import ThroughputModel
    from stallscope.analysis.recommend import network_fix

    # a pool of the dataset's own: 800 samples, 100 ms of requests each (80 s), 8 a batch of 8; the fetches waited 40 s
    # for them, 30 s blocked and 10 s while the pool's threads ran (their CPU, storage's): 2 requests at once
    model = ThroughputModel({"decode": 0.002, "storage": 30 / 800, "storage_cpu": 10 / 800}, 0.0005, 0.0005, 1, 2.0)
    pool = RequestStats(requests=800, samples=800, batches=100, first_byte_s=78.0, body_s=2.0, connect_s=0.0,
                        body_bytes=800 * 30_000, failed=0, connections=4, client_cpu_s=10.0, storage_s=40.0,
                        loading_s=45.0, background=800, library="", bodies=800, download_cpu_s=10.0)
    advice = network_fix(pool, model, 1, share=0.8)
    assert advice is not None and advice.id == "requests-in-flight"
    assert advice.facts["concurrent"] == pytest.approx(2.0)  # 80 s over 40 s, not over the 30 s blocked alone
    assert advice.facts["threads"] == 8
