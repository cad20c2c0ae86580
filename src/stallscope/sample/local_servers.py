"""The processes on this machine that serve the job's TCP connections: a local object store, a proxy, a cache.

Their CPU shares the job's cores and grows with its request rate, so the throughput model prices it per sample, as
it does a helper process's (``analysis/job.py``), rather than as a fixed load from other programs. They are found
from the job's established connections whose far end is an address of this machine: the process listening on that
port, and, for a server that is itself a client of another local server (a proxy in front of a store), that one too.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Callable, Iterable

import psutil

#: The socket table is read at most this often, and only when a process of the job holds a socket not seen before:
#: reading it costs milliseconds on some kernels, where listing a process's descriptors, done at every look, costs
#: tens of microseconds (calibration: sampler-local-servers).
TABLE_EVERY_S = 5.0
#: Servers followed from a server that is itself a client of another local server (proxy -> store -> ...)
#: (calibration: sampler-local-servers).
MAX_HOPS = 3
_ESTABLISHED = "01"  # the state column of /proc/net/tcp (include/net/tcp_states.h)


def _this_machines_addresses() -> set[str]:
    """Every address of this machine's interfaces (loopback included)."""
    addresses = set()
    try:
        for entries in psutil.net_if_addrs().values():
            for entry in entries:
                addresses.add(entry.address.split("%")[0])
    except (OSError, psutil.Error):
        pass
    return addresses


def _local(address: str, mine: set[str]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified or str(ip) in mine


def _socket_inodes(pid: int) -> set[int] | None:
    """The inodes of ``pid``'s sockets from its descriptors; None where /proc cannot say (not Linux)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return set() if os.path.isdir("/proc/self/fd") else None
    except OSError:
        return set()
    inodes = set()
    for name in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    return inodes


def _address(hex_address: str) -> tuple[str, int]:
    """``0100007F:1F90`` (/proc/net/tcp: the address in the kernel's byte order, in 32-bit words) -> (ip, port)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw), int(port, 16)


def _established(inodes: set[int]) -> list[tuple[str, int]]:
    """The far ends (ip, port) of the established TCP connections among ``inodes``, from /proc/net/tcp and tcp6."""
    far = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _ESTABLISHED and int(fields[9]) in inodes:
                far.append(_address(fields[2]))
    return far


class LocalServerFinder:
    """Finds, and remembers, the local servers of a job's connections (``update``, at every look at the job's
    processes).

    A port looked up once is not looked up again: finding its listener scans every process's sockets, which on a busy
    machine costs tens of milliseconds, so it is done once per new port, not once per look.
    """

    def __init__(self, exclude: Iterable[int] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self.servers: dict[int, int] = {}  # pid -> the port it serves the job on
        self._exclude = {os.getpid(), *exclude}
        self._clock = clock
        self._inodes_seen: set[int] = set()
        self._table_read_at: float | None = None
        self._ports_looked_up: set[int] = set()
        self._mine = _this_machines_addresses()

    def update(self, job_pids: Iterable[int]) -> dict[int, int]:
        """The servers so far, after a look at ``job_pids``' connections."""
        job = set(job_pids)
        inodes = self._inodes_of(job)
        if inodes is not None:
            if inodes <= self._inodes_seen:
                return dict(self.servers)
            now = self._clock()
            if self._table_read_at is not None and now - self._table_read_at < TABLE_EVERY_S:
                return dict(self.servers)  # the new sockets are looked at once the table may be read again
            self._table_read_at = now
            self._inodes_seen |= inodes
        ports = self._far_local_ports(job, inodes)
        for _hop in range(MAX_HOPS):
            new = ports - self._ports_looked_up
            if not new:
                break
            self._ports_looked_up |= new
            found = {pid: port for pid, port in self._listeners(new).items()
                     if pid not in job and pid not in self._exclude and pid not in self.servers}
            self.servers.update(found)
            ports = self._far_local_ports(set(found), self._inodes_of(set(found)))
        return dict(self.servers)

    @staticmethod
    def _inodes_of(pids: set[int]) -> set[int] | None:
        inodes: set[int] = set()
        for pid in pids:
            found = _socket_inodes(pid)
            if found is None:
                return None
            inodes |= found
        return inodes

    def _far_local_ports(self, pids: set[int], inodes: set[int] | None) -> set[int]:
        """Ports on this machine that ``pids`` (whose sockets are ``inodes``, None: not known) hold established TCP
        connections to."""
        if inodes is not None:
            return {port for ip, port in _established(inodes) if _local(ip, self._mine)}
        ports = set()  # not Linux: psutil reads each process's connections
        for pid in pids:
            try:
                connections = psutil.Process(pid).net_connections(kind="tcp")
            except (psutil.Error, OSError):
                continue
            ports |= {conn.raddr.port for conn in connections
                      if conn.status == psutil.CONN_ESTABLISHED and conn.raddr and _local(conn.raddr.ip, self._mine)}
        return ports

    @staticmethod
    def _listeners(ports: set[int]) -> dict[int, int]:
        """pid -> port of the processes listening on ``ports`` that this user may read (others have no pid here)."""
        try:
            connections = psutil.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return {}
        return {conn.pid: conn.laddr.port for conn in connections
                if conn.status == psutil.CONN_LISTEN and conn.pid is not None and conn.laddr
                and conn.laddr.port in ports}
