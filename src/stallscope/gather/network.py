"""A job's node sessions over torch.distributed's own TCPStore, for nodes that share no folder (see ``gather``).

The address is the job's own (``MASTER_ADDR:MASTER_PORT``): every node reached it during the job, and the node that
owns it can bind it again once torchrun there has let it go. Until then a node that connects may reach torchrun's
store instead; it hands its session over only after the host's own key is there, so nothing is left in a store
about to close.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from stallscope.gather.parts import (
    Gathered,
    Part,
    belongs,
    covers,
    decode,
    encode,
    merge_parts,
    missing_ranks,
    peers_in_folder,
    save_merged,
    shared_folder,
)
from stallscope.session import Session

#: How often the wait says how far it is.
PROGRESS_EVERY_S = 15.0
#: How long the host stays up after it said where the job's report is, for the nodes that sent to read it.
GOODBYE_S = 5.0


def _tcpstore() -> Any:
    # c10d logs every failed connection attempt at warning level in C++; the wait says what matters itself
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from torch.distributed import TCPStore

    return TCPStore


def owns_address(host: str) -> bool:
    """Whether ``host`` names this machine (binding to it succeeds), so that it may host the job's store."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False


def _reachable(host: str, port: int) -> bool:
    """Something listens there: a refused connection fails at once, where a store client would retry for seconds."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def exchange(part: Part, session_path: Path, store: Path, folder: Path, *, wait_s: float,
             say: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> Gathered:
    """Host the exchange where this node owns the job's address, else hand this node's session to the host; for
    ``wait_s`` from when torch's store is ready here (importing torch takes seconds on a loaded machine), with one
    try at least."""
    assert part.address is not None
    host, _, port_text = part.address.rpartition(":")
    port, prefix = int(port_text), f"stallscope/gather/{part.job}/"
    tcpstore, local = _tcpstore(), owns_address(host)
    blob = encode(part, session_path)
    client: Any = None
    sent, last_said, started = False, clock(), clock()
    deadline, tries = started + wait_s, 0
    while clock() < deadline or not tries:
        tries += 1
        if peers := peers_in_folder(folder, part):  # the folder was shared after all
            return shared_folder(store, folder, [part, *peers])
        if clock() - last_said >= PROGRESS_EVERY_S:
            last_said = clock()
            say(f"waiting for the job's host at {part.address} ({clock() - started:.0f} s of "
                f"{deadline - started:.0f}; Ctrl-C stops waiting)")
        if not sent and local:
            try:
                server = tcpstore(host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
            except RuntimeError:  # the port is still torchrun's, or another local launcher hosts
                server = None
            if server is not None:
                return _host(server, prefix, part, Session.load(session_path), store, folder, deadline, say, clock)
        if not sent:
            if not _reachable(host, port):
                time.sleep(1.0)
                continue
            try:
                client = tcpstore(host, port, is_master=False, timeout=timedelta(seconds=5))
                client.wait([prefix + "host"], timedelta(seconds=3))
                index = client.add(prefix + "n", 1)
                client.set(f"{prefix}part/{index}", blob)
            except RuntimeError:  # not our host yet (torchrun's store), or it went away: try again
                client = None
                time.sleep(1.0)
                continue
            sent = True
            say(f"sent this node's session to the job's host at {part.address}")
            continue
        try:
            client.wait([prefix + "done"], timedelta(seconds=max(1.0, min(5.0, deadline - clock()))))
            done = json.loads(client.get(prefix + "done"))
            client.add(prefix + "read", 1)
        except RuntimeError as exc:
            if type(exc).__name__ == "DistNetworkError":
                return Gathered([f"sent this node's session to {part.address}, which went away before it said where "
                                 "it saved the job's report"])
            continue
        return Gathered([f"the job's report was merged on {done['host']}: {done['path']} (stallscope report "
                         f"{done['path']} there)"])
    if sent:
        return Gathered([f"sent this node's session to {part.address}, which had not merged the job when the wait "
                         "ended; its report is on that node"])
    return Gathered([f"no node of the job hosted the gathering at {part.address} within {deadline - started:.0f} s: "
                     "merge the nodes' sessions with stallscope merge"])


def _host(server: Any, prefix: str, part: Part, session: Session, store: Path, folder: Path, deadline: float,
          say: Callable[[str], None], clock: Callable[[], float]) -> Gathered:
    """Take the others' sessions until every rank is in or the wait ends, merge, and say where the report is. A
    store folder found shared meanwhile (another node's note in it: a node that finished late) is left to merge
    there, once."""
    server.set(prefix + "host", part.run_id)
    received: dict[str, tuple[Part, Session]] = {part.run_id: (part, session)}
    seen, started, last_said = 0, clock(), clock()
    stopped = False
    try:
        while clock() < deadline and not covers([p for p, _ in received.values()]):
            count = int(server.add(prefix + "n", 0))
            while seen < count and server.check([f"{prefix}part/{seen + 1}"]):
                seen += 1
                other, theirs = decode(server.get(f"{prefix}part/{seen}"))
                if belongs(part, other):
                    received[other.run_id] = (other, theirs)
            if peers := peers_in_folder(folder, part):
                return shared_folder(store, folder, [part, *peers])
            if clock() - last_said >= PROGRESS_EVERY_S:
                last_said = clock()
                waiting = missing_ranks([p for p, _ in received.values()])
                say(f"hosting the job's gathering at {part.address}: rank(s) {', '.join(map(str, waiting))} not in "
                    f"yet ({clock() - started:.0f} s of {deadline - started:.0f}; Ctrl-C merges what came)")
            time.sleep(0.3)
    except KeyboardInterrupt:
        stopped = True
    parts = sorted((p for p, _ in received.values()), key=lambda p: p.ranks[0])
    merged, missing = merge_parts([s for _, s in sorted(received.values(), key=lambda ps: ps[0].ranks[0])], parts,
                                  clock() - started)
    path = save_merged(folder, merged)
    server.set(prefix + "done", json.dumps({"host": socket.gethostname(), "path": str(path)}))
    senders, until = len(parts) - 1, clock() + GOODBYE_S
    while not stopped and senders and clock() < until and int(server.add(prefix + "read", 0)) < senders:
        time.sleep(0.2)
    lines = ["stopped waiting (Ctrl-C): merged what had come"] if stopped else []
    return Gathered(lines, merged, path, missing)
