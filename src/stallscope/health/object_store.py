"""``stallscope doctor s3://bucket/prefix``: what an object store gives one client, and how many requests must be in
flight for a training job's rate.

It lists the objects under the prefix, GETs some one at a time (time to the first byte, time to the last, their
size), then GETs them from 1, 2, 4, ... threads of this process, each level for its share of the time budget, with
as many connections as threads. A level that no longer gains over the one before (under ``LEVEL_GAIN``) ends the
sweep: past it the store, the link or this process's own CPU (boto3 signing and parsing, one thread at a time)
decides. The connections a rate needs follow from Little's law on the measured time per request; where one process's
sweep tops out below it, more processes (DataLoader workers) are needed, each with its own client.

Which of those holds the rate is then told apart by the same best level run from 2 and 4 processes at once, each
with its own client: where they read more together, one process's client was the limit (more workers raise it);
where they read no more while this machine's CPUs had room, the store or the link was (more workers or connections
do not); where they took the CPUs, this machine's cores were.

The endpoint and credentials come from boto3's usual sources (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, the config
files). boto3 is the ``s3`` extra.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from stallscope.health.checks import PASS, UNKNOWN, WARN, Check, fmt_bytes

#: The connection counts swept, in order.
LEVELS = (1, 2, 4, 8, 16, 32)
#: A level must beat the one before by this factor in objects/s to go on to the next.
LEVEL_GAIN = 1.15
#: Objects fetched one at a time for the latency figures.
LATENCY_SAMPLES = 20
#: Objects listed at most (the GETs cycle through them).
MAX_LISTED = 1000
#: The processes the best level is run from at once, to tell a client's limit from the store's.
PROCESS_LEVELS = (2, 4)
#: Seconds a process of that sweep may take to start (its imports, its client) before the level is given up.
PROCESS_START_S = 60.0
#: Processes that used at least this share of the machine's usable CPUs had the cores as their limit.
CPU_BOUND_SHARE = 0.85
#: A first byte slower than this is a store far from the machine (another region, a gateway): worth the warning,
#: since each worker then needs many requests in flight.
SLOW_FIRST_BYTE_S = 0.05


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket/prefix``; ValueError for anything else."""
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise ValueError(f"{url!r} is not an s3://bucket/prefix address")
    bucket, _, prefix = url[5:].partition("/")
    return bucket, prefix


@dataclass(frozen=True)
class Level:
    connections: int
    objects: int
    seconds: float
    nbytes: int
    failed: int
    rate: float | None = None  # objects/s as a saved probe said it (``StoreProbe.from_doctor``)
    processes: int = 1  # processes reading at once, ``connections`` each
    cpu_s: float = 0.0  # the processes' CPU seconds, together

    @property
    def objects_per_s(self) -> float:
        if self.rate is not None:
            return self.rate
        return self.objects / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class StoreProbe:
    url: str
    endpoint: str
    objects_listed: int
    first_byte_s: list[float]
    whole_s: list[float]
    sizes: list[int]
    levels: list[Level] = field(default_factory=list)
    process_levels: list[Level] = field(default_factory=list)  # the best level from several processes at once
    cpus: float = 0.0  # this machine's usable CPUs when it was probed
    said_limit: str | None = None  # the limit as a saved probe said it (``from_doctor``)

    @property
    def first_byte_median_s(self) -> float:
        return statistics.median(self.first_byte_s)

    @property
    def request_median_s(self) -> float:
        return statistics.median(self.whole_s)

    @property
    def best(self) -> Level | None:
        return max(self.levels, key=lambda lv: lv.objects_per_s) if self.levels else None

    @property
    def highest(self) -> Level | None:
        """The most any measurement read: one process's best level, or several processes together."""
        every = [*self.levels, *self.process_levels]
        return max(every, key=lambda lv: lv.objects_per_s) if every else None

    @property
    def limit(self) -> str | None:
        """What holds the store's rate for this machine: ``client`` (one process's client: more processes read
        more), ``cpus`` (this machine's cores, taken by the processes), ``store`` (the store or the link: more
        processes read no more with cores to spare); None where no process level was measured."""
        if self.said_limit is not None or not self.process_levels or self.best is None:
            return self.said_limit
        top = max(self.process_levels, key=lambda lv: lv.objects_per_s)
        if top.objects_per_s >= LEVEL_GAIN * self.best.objects_per_s:
            return "client"
        busy = top.cpu_s / top.seconds / self.cpus if top.seconds > 0 and self.cpus > 0 else 0.0
        return "cpus" if busy >= CPU_BOUND_SHARE else "store"

    def connections_for(self, objects_per_s: float) -> tuple[int, bool]:
        """Connections (requests in flight) to read ``objects_per_s``, and whether one process reached that rate in
        the sweep: the fewest measured connections that did, or else Little's law on the median request time."""
        for level in self.levels:
            if level.objects_per_s >= objects_per_s:
                return level.connections, True
        return max(1, math.ceil(objects_per_s * self.request_median_s)), False

    @classmethod
    def from_doctor(cls, document: dict[str, Any]) -> StoreProbe:
        """The probe again from ``doctor s3://... --json``'s document (its medians and levels); raises ValueError
        where the document holds no store probe."""
        if not isinstance(document, dict) or not isinstance(document.get("checks"), list):
            raise ValueError("not a doctor report: write one with `stallscope doctor s3://BUCKET/PREFIX --json PATH`")
        checks = {c.get("id"): c.get("data") or {} for c in document["checks"] if isinstance(c, dict)}
        found = checks.get("store-latency") or {}
        if "request_ms_median" not in found:
            raise ValueError("no object-store probe in it: write one with `stallscope doctor s3://BUCKET/PREFIX "
                             "--json PATH`")
        try:
            levels = [Level(int(lv["connections"]), 0, 1.0, int(1e6 * float(lv.get("mb_per_s") or 0.0)),
                            int(lv.get("failed") or 0), float(lv["objects_per_s"]))
                      for lv in found.get("levels", [])]
            limit = checks.get("store-limit") or {}
            processes = [Level(int(lv["connections"]), 0, 1.0, int(1e6 * float(lv.get("mb_per_s") or 0.0)),
                               int(lv.get("failed") or 0), float(lv["objects_per_s"]), int(lv["processes"]))
                         for lv in limit.get("process_levels", [])]
            return cls(str(found.get("url") or "?"), str(found.get("endpoint") or "?"),
                       int(found.get("objects_listed") or 0), [float(found["first_byte_ms_median"]) / 1e3],
                       [float(found["request_ms_median"]) / 1e3], [int(found.get("object_bytes_median") or 0)],
                       levels, processes, float(limit.get("cpus") or 0.0), limit.get("limit"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"its store probe is malformed ({type(exc).__name__}: {exc})") from None

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "endpoint": self.endpoint, "objects_listed": self.objects_listed,
                "first_byte_ms_median": round(1e3 * self.first_byte_median_s, 3),
                "request_ms_median": round(1e3 * self.request_median_s, 3),
                "object_bytes_median": int(statistics.median(self.sizes)),
                "levels": [{"connections": lv.connections, "objects_per_s": round(lv.objects_per_s, 1),
                            "mb_per_s": round(lv.bytes_per_s / 1e6, 2), "failed": lv.failed} for lv in self.levels]}


def probe_store(url: str, seconds: float = 6.0, client_factory: Callable[[int], Any] | None = None,
                clock: Callable[[], float] = time.perf_counter, cpus: float | None = None) -> StoreProbe:
    """Measure the store at ``url``; ``client_factory(connections)`` makes a boto3 S3 client (tests pass their own
    endpoint through it; the processes sweep is left out with one, since its processes make their own). ``cpus``:
    this machine's usable CPUs. Raises ValueError for a bad address or an empty prefix, ImportError without boto3
    and botocore's errors for a store that cannot be reached."""
    bucket, prefix = parse_s3_url(url)
    make = client_factory or _boto3_client
    client = make(1)
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", []) if o.get("Size", 0) > 0]
        if len(keys) >= MAX_LISTED:
            break
    if not keys:
        raise ValueError(f"no objects under {url}")
    first_byte, whole, sizes = [], [], []
    for i in range(min(LATENCY_SAMPLES, len(keys))):
        t0 = clock()
        body = client.get_object(Bucket=bucket, Key=keys[i])["Body"]
        t1 = clock()
        sizes.append(len(body.read()))
        first_byte.append(t1 - t0)
        whole.append(clock() - t0)
    probe = StoreProbe(url, str(client.meta.endpoint_url), len(keys), first_byte, whole, sizes,
                       cpus=cpus if cpus is not None else float(len(os.sched_getaffinity(0))))
    per_level = max(0.5, seconds / 4)
    for connections in LEVELS:
        level = _sweep_level(make(connections), bucket, keys, connections, per_level, clock)
        probe.levels.append(level)
        if len(probe.levels) > 1 and level.objects_per_s < LEVEL_GAIN * probe.levels[-2].objects_per_s:
            break
    best = probe.best
    if client_factory is None and best is not None:
        for processes in PROCESS_LEVELS:
            together = _sweep_processes(bucket, keys, best.connections, processes, per_level)
            if together is not None:
                probe.process_levels.append(together)
    return probe


def _sweep_processes(bucket: str, keys: list[str], connections: int, processes: int,
                     seconds: float) -> Level | None:
    """``connections`` threads in each of ``processes`` spawned processes, each with its own client, reading for
    ``seconds`` from the same moment (a barrier after their imports); their CPU summed. Spawned: nothing of this
    process (its clients, their sockets) is shared. None where a process failed."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(processes), context.Queue()
    children = [context.Process(target=_one_process, args=(bucket, keys, connections, seconds, barrier, results),
                                daemon=True) for _ in range(processes)]
    for child in children:
        child.start()
    try:
        parts = [results.get(timeout=seconds + PROCESS_START_S) for _ in children]
    except queue.Empty:
        parts = [None]
    finally:
        for child in children:
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
    if not all(isinstance(p, tuple) for p in parts):
        return None
    return Level(connections * processes, sum(p[0] for p in parts), max(p[1] for p in parts),
                 sum(p[2] for p in parts), sum(p[3] for p in parts), processes=processes,
                 cpu_s=sum(p[4] for p in parts))


def _one_process(bucket: str, keys: list[str], connections: int, seconds: float, barrier: Any, results: Any) -> None:
    """One process of a processes level: puts (objects, seconds, bytes, failed, CPU seconds), or why it failed."""
    try:
        client = _boto3_client(connections)
        barrier.wait(timeout=PROCESS_START_S)
        cpu = time.process_time()
        level = _sweep_level(client, bucket, keys, connections, seconds, time.perf_counter)
        results.put((level.objects, level.seconds, level.nbytes, level.failed, time.process_time() - cpu))
    except Exception as exc:  # noqa: BLE001 - said to the parent, which leaves the level out
        results.put(f"{type(exc).__name__}: {exc}")


def _boto3_client(connections: int) -> Any:
    import boto3
    import botocore.config

    return boto3.client("s3", config=botocore.config.Config(max_pool_connections=max(10, connections)))


def _sweep_level(client: Any, bucket: str, keys: list[str], connections: int, seconds: float,
                 clock: Callable[[], float]) -> Level:
    """GET objects from ``connections`` threads for ``seconds``."""
    lock = threading.Lock()
    counts = {"objects": 0, "bytes": 0, "failed": 0, "next": 0}
    start = clock()
    deadline = start + seconds

    def worker() -> None:
        while clock() < deadline:
            with lock:
                key = keys[counts["next"] % len(keys)]
                counts["next"] += 1
            try:
                n = len(client.get_object(Bucket=bucket, Key=key)["Body"].read())
            except Exception:  # noqa: BLE001 (a failed GET is counted, the sweep goes on)
                with lock:
                    counts["failed"] += 1
                continue
            with lock:
                counts["objects"] += 1
                counts["bytes"] += n

    with ThreadPoolExecutor(connections) as pool:
        for _ in range(connections):
            pool.submit(worker)
    return Level(connections, counts["objects"], clock() - start, counts["bytes"], counts["failed"])


def store_checks(probe: StoreProbe, objects_per_s: float | None) -> list[Check]:
    """The probe as doctor checks: latency, the connection sweep, and the connections a rate needs."""
    fb = probe.first_byte_median_s
    size = int(statistics.median(probe.sizes))
    checks = [Check(
        "store-latency", "object store: time to first byte", WARN if fb > SLOW_FIRST_BYTE_S else PASS,
        f"{1e3 * fb:.1f} ms to the first byte, {1e3 * probe.request_median_s:.1f} ms a whole GET of {fmt_bytes(size)} "
        f"(median of {len(probe.first_byte_s)}, one at a time)",
        f"first byte under {1e3 * SLOW_FIRST_BYTE_S:.0f} ms",
        "one request at a time, a worker reads at most one object per request time; the latency is hidden only by "
        "more requests in flight",
        "fetch a batch's objects on threads (the dataset's __getitems__) and use more workers" if fb > SLOW_FIRST_BYTE_S
        else "", probe.to_dict())]
    best = probe.best
    if best is not None:
        sweep = ", ".join(f"{lv.connections}: {lv.objects_per_s:.0f}/s" for lv in probe.levels)
        checks.append(Check(
            "store-throughput", "object store: objects/s by connections", PASS,
            f"{best.objects_per_s:.0f} objects/s ({best.bytes_per_s / 1e6:.1f} MB/s) at {best.connections} "
            f"connections from one process; by connections: {sweep}",
            "", "one process's client: past its best level the store, the link or this process's CPU (boto3 "
            "signs and parses on one thread at a time) holds it; each DataLoader worker is such a process", "",
            {"levels": probe.to_dict()["levels"]}))
    limit = _limit_check(probe)
    if limit is not None:
        checks.append(limit)
    if objects_per_s:
        needed, reached = probe.connections_for(objects_per_s)
        processes = math.ceil(objects_per_s / best.objects_per_s) if best and best.objects_per_s > 0 else None
        if reached:
            value = f"{needed} connections in flight read {objects_per_s:.0f} objects/s (measured)"
            status, fix = PASS, f"keep at least {needed} requests in flight: workers x threads per worker >= {needed}"
        else:
            value = (f"about {needed} requests in flight for {objects_per_s:.0f} objects/s (Little's law on the "
                     f"{1e3 * probe.request_median_s:.1f} ms median request); one process reached at most "
                     f"{best.objects_per_s if best else 0:.0f}/s")
            status = WARN
            fix = (f"spread them over at least {processes} processes (DataLoader workers), each with "
                   f"{math.ceil(needed / processes)} threads" if processes else "")
        checks.append(Check("store-connections", f"object store: requests in flight for {objects_per_s:.0f} "
                            "objects/s", status, value, "", "", fix,
                            {"objects_per_s": objects_per_s, "connections": needed, "reached": reached,
                             "processes": processes}))
    return checks


def _limit_check(probe: StoreProbe) -> Check | None:
    """Whose limit the best level met: one process's client, this machine's CPUs, or the store and the link."""
    best, limit = probe.best, probe.limit
    if best is None or limit is None or not probe.process_levels:
        return None
    top = max(probe.process_levels, key=lambda lv: lv.objects_per_s)
    together = ", ".join(f"{lv.processes} x {lv.connections // lv.processes}: {lv.objects_per_s:.0f}/s "
                         f"({lv.bytes_per_s / 1e6:.1f} MB/s, {lv.cpu_s / lv.seconds:.1f} CPUs)"
                         for lv in probe.process_levels if lv.seconds > 0)
    value = (f"one process: {best.objects_per_s:.0f} objects/s ({best.bytes_per_s / 1e6:.1f} MB/s) at "
             f"{best.connections} connections; processes x connections each: {together}")
    means, fix = {
        "client": ("one process's client is the limit: processes with clients of their own read "
                   f"{top.objects_per_s / max(best.objects_per_s, 1e-9):.1f}x as much together (its CPU signs, "
                   "parses and copies on one interpreter)",
                   "spread the requests over DataLoader workers, each with its own client, rather than more "
                   "threads in one process"),
        "cpus": ("this machine's CPUs are the limit: the processes took "
                 f"{top.cpu_s / top.seconds:.1f} of its {probe.cpus:.0f} usable CPUs and read no more together",
                 "more cores for the loading processes, or a client that costs less CPU a request (larger objects)"),
        "store": ("the store or the link is the limit: processes with clients of their own read no more together "
                  f"({top.objects_per_s:.0f}/s against {best.objects_per_s:.0f}/s) while this machine's CPUs had "
                  "room; more workers or connections will not raise it",
                  "read fewer bytes (smaller images: `stallscope pack SRC OUT --max-side auto`), a store closer to "
                  "the machine, or the data on local disk"),
    }[limit]
    return Check("store-limit", "object store: whose limit", PASS if limit == "client" else WARN, value, "",
                 means, fix, {"limit": limit, "cpus": probe.cpus,
                              "process_levels": [{"processes": lv.processes, "connections": lv.connections,
                                                  "objects_per_s": round(lv.objects_per_s, 1),
                                                  "mb_per_s": round(lv.bytes_per_s / 1e6, 2), "failed": lv.failed,
                                                  "cpus_used": round(lv.cpu_s / lv.seconds, 2) if lv.seconds else 0}
                                                 for lv in probe.process_levels]})


def store_unreachable(url: str, exc: BaseException) -> Check:
    return Check("store-latency", "object store", UNKNOWN, f"{url}: {type(exc).__name__}: {exc}", "",
                 "the store could not be measured", "check the endpoint (AWS_ENDPOINT_URL) and credentials")
