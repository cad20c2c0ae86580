"""Local servers of a job's connections, found on real processes and sockets: a store behind a proxy, both on
loopback; the sampler reads their CPU apart from the job's; the analysis prices it per sample only for a job that
timed requests."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import psutil
import pytest

from stallscope.sample import local_servers, system
from stallscope.sample.local_servers import LocalServerFinder
from stallscope.session import FetchRecord

# A server on a free loopback port that prints its port, answers each connection with a line and keeps it open.
# With an argument (a port), each connection it accepts opens one to that port first: a proxy in front of a store.
SERVER = textwrap.dedent("""
    import socket, sys, threading, time
    upstream = int(sys.argv[1]) if len(sys.argv) > 1 else None
    held = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)
    def serve(conn):
        if upstream is not None:
            up = socket.create_connection(("127.0.0.1", upstream))
            up.recv(16)
            held.append(up)
        conn.sendall(b"hello\\n")
        held.append(conn)
        end = time.time() + 0.3
        while time.time() < end:  # some CPU per connection, for the sampler to read
            pass
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
""")

# The "job": connects to a port, reads the greeting and holds the connection open.
CLIENT = textwrap.dedent("""
    import socket, sys, time
    conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    conn.recv(16)
    print("connected", flush=True)
    time.sleep(60)
""")


def _start(code: str, *args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


@pytest.fixture
def store_behind_proxy():
    """(job, proxy, store) processes: the job holds a connection to the proxy, the proxy one to the store."""
    started = []
    try:
        store, store_port = _start(SERVER)
        started.append(store)
        proxy, proxy_port = _start(SERVER, store_port)
        started.append(proxy)
        job, said = _start(CLIENT, proxy_port)
        started.append(job)
        assert said == "connected"
        yield job, (proxy, int(proxy_port)), (store, int(store_port))
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_finds_the_proxy_and_the_store_behind_it(store_behind_proxy, monkeypatch):
    job, (proxy, proxy_port), (store, store_port) = store_behind_proxy
    now = [0.0]
    finder = LocalServerFinder(clock=lambda: now[0])
    assert finder.update([job.pid]) == {proxy.pid: proxy_port, store.pid: store_port}

    def no_table(inodes):
        raise AssertionError("the socket table read again")

    # no new socket: the table is not read again, and the servers are kept
    monkeypatch.setattr(local_servers, "_established", no_table)
    assert finder.update([job.pid]) == {proxy.pid: proxy_port, store.pid: store_port}


def test_new_sockets_are_looked_at_once_the_table_may_be_read_again(store_behind_proxy):
    job, (proxy, proxy_port), (store, store_port) = store_behind_proxy
    now = [0.0]
    finder = LocalServerFinder(clock=lambda: now[0])
    assert finder.update([]) == {}  # nothing of the job's yet: the table is not read
    other, said = _start(CLIENT, str(proxy_port))  # a client that is not the job's
    try:
        assert said == "connected"
        assert finder.update([other.pid]) == {proxy.pid: proxy_port, store.pid: store_port}
        assert finder.update([other.pid, job.pid]) == {proxy.pid: proxy_port, store.pid: store_port}
    finally:
        other.kill()
        other.wait()


def test_a_look_soon_after_a_table_read_waits_for_the_next_one(store_behind_proxy):
    job, (proxy, proxy_port), (store, store_port) = store_behind_proxy
    now = [100.0]
    finder = LocalServerFinder(clock=lambda: now[0])
    lone, port = _start(SERVER)  # a server the job has not connected to yet
    try:
        assert finder.update([job.pid]) == {proxy.pid: proxy_port, store.pid: store_port}
        later, said = _start(CLIENT, port)  # the job's tree grows a process that connects to it
        assert said == "connected"
        try:
            now[0] += local_servers.TABLE_EVERY_S / 2
            assert lone.pid not in finder.update([job.pid, later.pid])  # too soon after the last read
            now[0] += local_servers.TABLE_EVERY_S
            assert finder.update([job.pid, later.pid])[lone.pid] == int(port)
        finally:
            later.kill()
            later.wait()
    finally:
        lone.kill()
        lone.wait()


def test_a_server_inside_the_job_is_the_jobs_own(store_behind_proxy):
    job, (proxy, _), (store, store_port) = store_behind_proxy
    # the proxy counted as the job's (a process of its tree): only the store is a server of it
    assert LocalServerFinder().update([job.pid, proxy.pid]) == {store.pid: store_port}


def test_reads_the_kernels_addresses():
    assert local_servers._address("0100007F:1F90") == ("127.0.0.1", 8080)
    assert local_servers._address("00000000000000000000000001000000:0050") == ("::1", 80)


def test_which_far_ends_are_this_machine():
    mine = {"10.1.2.3"}
    assert local_servers._local("127.0.0.1", mine)
    assert local_servers._local("127.8.9.1", mine)
    assert local_servers._local("::1", mine)
    assert local_servers._local("::ffff:127.0.0.1", mine)
    assert local_servers._local("10.1.2.3", mine)
    assert not local_servers._local("10.1.2.4", mine)
    assert not local_servers._local("not an address", mine)


def test_the_sampler_reads_the_servers_apart_from_the_job(store_behind_proxy):
    job, (proxy, proxy_port), (store, store_port) = store_behind_proxy
    sampler = system.SystemSampler(job.pid, interval_s=0.05, gpu=False)
    sampler.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(sampler.servers) < 2:
        time.sleep(0.05)
    time.sleep(0.3)
    for server in (proxy, store):  # their work for the job's connection done: idle now
        while psutil.Process(server.pid).num_threads() > 1:
            time.sleep(0.05)
    result = sampler.stop(idle_s=0.5)
    assert set(result["processes"]) == {str(job.pid)}  # the job's tree holds the job only
    assert all(0 <= entry["idle_cores"] < 0.1 for entry in result["servers"].values())
    servers = result["servers"]
    assert {pid: entry["port"] for pid, entry in servers.items()} == {str(proxy.pid): proxy_port,
                                                                      str(store.pid): store_port}
    from stallscope.system_samples import SystemSamples

    samples = SystemSamples.read(result)
    assert set(samples.servers) == {proxy.pid, store.pid}
    assert samples.server_ports == {proxy.pid: proxy_port, store.pid: store_port}
    assert set(samples.processes) == {job.pid}


def _samples(main: int, server_cores: float, other_cores: float, idle_cores: float = 0.1) -> dict:
    """11 ticks of 0.1 s on 2 CPUs: the training process at one core, a local server at ``server_cores`` (of which
    ``idle_cores`` it burns with no requests) and other programs at ``other_cores`` (in the machine's busy total
    only)."""
    def proc(ppid, cores):
        return {"ppid": ppid, "ticks": list(range(11)), "cpu_s": [cores * 0.1 * k for k in range(11)]}

    busy = 100.0 * (1.0 + server_cores + other_cores) / 2
    return {"t_ns": [k * 100_000_000 for k in range(11)], "interval_s": 0.1,
            "system": {"per_core_percent": [[busy, busy]] * 11},
            "processes": {str(main): proc(1, 1.0)},
            "servers": {"900": {**proc(1, server_cores), "port": 8333, "idle_cores": idle_cores}}}


def test_a_local_servers_cpu_counts_per_sample_only_where_the_job_timed_requests():
    from stallscope.analysis.system_metrics import local_server_cpu_between
    from tests.unit.test_analysis_pitfalls import base

    session = base()
    session = replace(session, system_samples=_samples(session.main_pid, 0.4, 0.2))
    assert session.system.server_ports == {900: 8333}
    assert session.system.cpu_between(900, 0, 1_000_000_000) == pytest.approx(0.4)
    # no requests timed: whatever the job reached (a notebook's kernel, a tracker's service) is left as it was
    assert not any(f.requests for f in session.fetches)
    assert local_server_cpu_between(session, 0, 1_000_000_000) == 0.0
    fetch = FetchRecord(0, 0, 0, 0, 0, 50_000_000, 40_000_000, 0, 8, {}, {}, "ok", 200,
                        requests=[8, 30_000_000, 5_000_000, 80_000, 0, 1, 1_000_000, 8])
    with_requests = replace(session, fetches=[fetch])
    # what it burns idle (read once the job ended) stays a fixed load: the rest is the requests'
    assert session.system.server_idle_cores == {900: 0.1}
    assert local_server_cpu_between(with_requests, 0, 1_000_000_000) == pytest.approx(0.3)


def test_the_model_prices_a_local_store_per_sample_and_no_longer_as_other_programs_load():
    from stallscope.analysis import analyze
    from tests.unit.test_analysis_pitfalls import base

    session = base()
    samples = _samples(session.main_pid, 0.4, 0.2)
    session = replace(session, environment={**session.environment, "cpu_count": 2, "cpus_affinity": 2},
                      system_samples=samples)
    steps = analyze(session).steps.steady
    fetches = [FetchRecord(0, 0, k % 2, k, s.start_ns, s.end_ns, 40_000_000, 0, 4, {}, {}, "ok", 200,
                           requests=[4, 30_000_000, 5_000_000, 80_000, 0, 0, 0, 4]) for k, s in enumerate(steps)]
    session = replace(session, fetches=fetches)
    unseen = replace(session, system_samples={k: v for k, v in samples.items() if k != "servers"})
    without, with_store = analyze(unseen), analyze(session)
    assert without.other_cpus == pytest.approx(0.6)  # the store's 0.4 cores a fixed load, like other programs'
    assert with_store.other_cpus == pytest.approx(0.3)  # its 0.1 idle still is
    assert without.capacity.model is not None and with_store.capacity.model is not None
    added = with_store.capacity.model.helper_cpu_per_sample_s - without.capacity.model.helper_cpu_per_sample_s
    window_s = (steps[-1].end_ns - steps[0].start_ns) / 1e9
    assert added == pytest.approx(0.3 * window_s / (4 * len(steps)), rel=0.05)
    assert with_store.capacity.model.server_cpu_per_sample_s == pytest.approx(added)
    assert with_store.local_servers.cpus == pytest.approx(0.3)


def test_the_servers_are_said_under_the_requests():
    from stallscope.analysis.store_requests import LocalServers
    from stallscope.render.words.evidence import local_servers_line

    servers = LocalServers(0.42, ("python", "weed"), 0.0016)
    assert servers.to_dict() == {"cpus": 0.42, "names": ["python", "weed"], "cpu_ms_per_request": 1.6}
    line = local_servers_line(servers)
    assert line.startswith("answered on this machine: python, weed kept 0.42 CPUs busy (1.6 ms a request)")
    assert "(" not in local_servers_line(LocalServers(0.42, ("weed",)))
