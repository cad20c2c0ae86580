"""What a loader's HTTP requests (an object store, a web server) cost its batches, and what limits them.

The recorder tallies each batch's requests (``recorder/http_requests.py``); here they are summed over the batches
whose calls were timed and scaled to all of them, and ``storage`` is split into what more requests in flight would
hide (the wait for the first byte, connecting: latency), what a faster link would (reading bodies: bandwidth) and
what more cores would (the client's own CPU in storage's calls).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from stallscope.constants import DOWNLOAD_LIBRARIES
from stallscope.session import FetchRecord

#: A loader whose requests hold at least this share of its storage time has its data on the network: the advice is
#: about requests in flight, not about files on a disk.
NETWORK_SHARE = 0.5
#: Requests made at least this much on the loader's own threads are a streaming library's downloads: its shards and
#: its workers are the knobs, not threads in the dataset.
BACKGROUND_SHARE = 0.5


@dataclass(frozen=True)
class RequestStats:
    """One loader's requests, over all of its batches."""
    requests: float
    samples: int
    batches: int
    first_byte_s: float  # the requests sent to their answers' headers: the store's latency and the network's
    body_s: float  # reading the answers' bodies
    connect_s: float  # opening connections
    body_bytes: float
    failed: float
    connections: float
    client_cpu_s: float  # CPU in storage's timed calls (signing, parsing, checksums) and in download threads
    storage_s: float  # the workers' storage seconds these are part of
    loading_s: float  # the span the loader's workers fetched in (first fetch's start to last fetch's end)
    client: str = "http"  # the library that made them, from its timed calls: "boto3", "requests", "urllib", "http"
    background: float = 0.0  # those the loader's own threads made (a streaming library's downloads)
    bodies: float = 0.0  # those answered with a body (a GET's object, not a HEAD's headers); 0: not counted
    library: str = ""  # the library that started those threads (``constants.DOWNLOAD_LIBRARIES``), "" if unknown
    download_cpu_s: float = 0.0  # the part of ``client_cpu_s`` the download threads used while the batches waited

    @property
    def bytes_per_body(self) -> float:
        """An answer's body, on average over the answers that had one: an object's or a shard's size."""
        answered = self.bodies or self.requests
        return self.body_bytes / answered if answered else 0.0

    @property
    def background_share(self) -> float:
        """The share of the requests made on the loader's own threads rather than in the fetches' calls."""
        return min(1.0, self.background / self.requests) if self.requests else 0.0

    @property
    def per_sample(self) -> float:
        return self.requests / self.samples if self.samples else 0.0

    @property
    def latency_s(self) -> float:
        """Per request: connecting and waiting for the first byte."""
        return (self.first_byte_s + self.connect_s) / self.requests if self.requests else 0.0

    @property
    def request_s(self) -> float:
        """Per request: its whole time on the network (latency and body)."""
        return (self.first_byte_s + self.connect_s + self.body_s) / self.requests if self.requests else 0.0

    @property
    def in_flight(self) -> float:
        """Requests on the network at once, on average over the loading span."""
        return (self.first_byte_s + self.connect_s + self.body_s) / self.loading_s if self.loading_s > 0 else 0.0

    @property
    def body_bytes_per_s(self) -> float | None:
        return self.body_bytes / self.body_s if self.body_s > 0 else None

    @property
    def parts(self) -> dict[str, float]:
        """Storage's seconds by what would shrink them: latency, bandwidth, client CPU."""
        return {"latency": self.first_byte_s + self.connect_s, "bandwidth": self.body_s,
                "client-cpu": self.client_cpu_s}

    @property
    def bound(self) -> str:
        """The largest of ``parts``: latency-bound, bandwidth-bound or client-CPU-bound."""
        parts = self.parts
        return max(parts, key=lambda k: parts[k])

    @property
    def network_share(self) -> float:
        """The share of the loader's storage seconds spent in requests."""
        return min(1.0, sum(self.parts.values()) / self.storage_s) if self.storage_s > 0 else 0.0

    def needed_in_flight(self, samples_per_s: float) -> float:
        """Requests that must be in flight at once to feed ``samples_per_s`` (Little's law: arrival rate times the
        time each spends on the network)."""
        return samples_per_s * self.per_sample * self.request_s

    def to_dict(self, target_samples_per_s: float | None = None) -> dict[str, object]:
        """The summary's ``nodes.storage.requests``; ``target_samples_per_s``: the rate the compute could take,
        for the requests it would need in flight."""
        rate = self.body_bytes_per_s
        needed = self.needed_in_flight(target_samples_per_s) if target_samples_per_s else None
        return {
            "requests": round(self.requests), "per_sample": round(self.per_sample, 3),
            "latency_ms": round(1e3 * self.latency_s, 3), "request_ms": round(1e3 * self.request_s, 3),
            "bytes_per_request": round(self.body_bytes / self.requests) if self.requests else None,
            "bytes_per_body": round(self.bytes_per_body) if self.requests else None,
            "body_mb_per_s": round(rate / 1e6, 2) if rate is not None else None,
            "in_flight": round(self.in_flight, 2), "needed_in_flight": round(needed, 1) if needed else None,
            "connections_opened": round(self.connections), "failed": round(self.failed),
            "seconds": {k: round(v, 4) for k, v in self.parts.items()}, "bound": self.bound,
            "share_of_storage": round(self.network_share, 4),
            "background_share": round(self.background_share, 4), "library": self.library or None,
        }


@dataclass(frozen=True)
class LocalServers:
    """The servers on this machine that the job's requests reached (a local object store, a proxy in front of one),
    over the steady steps: their CPU grows with the request rate and shares the job's cores."""
    cpus: float  # the CPUs they kept busy, on average
    names: tuple[str, ...]  # their process names
    cpu_per_request_s: float | None = None  # their CPU for each of the training loader's requests

    def to_dict(self) -> dict[str, object]:
        """The summary's ``nodes.storage.requests.local_servers``."""
        return {"cpus": round(self.cpus, 3), "names": list(self.names),
                "cpu_ms_per_request": round(1e3 * self.cpu_per_request_s, 3)
                if self.cpu_per_request_s is not None else None}


def request_stats(fetches: list[FetchRecord], samples: int, storage_s: float) -> RequestStats | None:
    """The loader's requests from its batches (``fetches``, StopIterations left out by the caller), None where none
    made any. ``samples``: the batches' samples; ``storage_s``: the pipeline's storage seconds. Every batch counts
    its requests; the client's CPU is in the timed calls, so it is scaled from the batches whose calls were timed."""
    with_requests = [f for f in fetches if f.requests]
    if not with_requests:
        return None
    totals = [0] * 8
    background = 0
    libraries: Counter[int] = Counter()
    for f in with_requests:
        assert f.requests is not None
        for i, value in enumerate(f.requests[:8]):
            totals[i] += int(value)
        if len(f.requests) < 8:  # recorded before answers with a body were told apart: take them all as such
            totals[7] += int(f.requests[0])
        if len(f.requests) > 9:
            background += int(f.requests[8])
            libraries[int(f.requests[9])] += int(f.requests[8])
    timed = [f for f in fetches if f.timed]
    scale = len(fetches) / len(timed) if timed else 0.0
    client_cpu = sum(max(0, int((f.by_node.get("storage") or [0, 0])[1])) for f in timed) * scale
    downloads = sum(download_threads_cpu_ns(f, waiting_ns(f)) for f in fetches)  # measured for every batch
    client_cpu += downloads
    requests, first_byte, body, nbytes, failed, connects, connect, bodies = totals
    names = {name for f in timed for name in f.by_name}
    loading = max(f.end_ns for f in fetches) - min(f.start_ns for f in fetches)
    return RequestStats(
        requests=requests, samples=samples, batches=len(fetches), first_byte_s=first_byte / 1e9, body_s=body / 1e9,
        connect_s=connect / 1e9, body_bytes=nbytes, failed=failed, connections=connects, client_cpu_s=client_cpu / 1e9,
        storage_s=storage_s, loading_s=loading / 1e9, client=client_of(names), background=background,
        bodies=bodies, library=_library_name(libraries), download_cpu_s=downloads / 1e9)


def download_threads_cpu_ns(fetch: FetchRecord, off_cpu_ns: int) -> int:
    """A worker's batch: the CPU its loader's own download threads took meanwhile, up to ``off_cpu_ns`` (the batch's
    time off its own CPU and out of the run queue, which it spent waiting on them or on the network); 0 for a batch
    the training process loaded itself (its other threads' CPU is their hold on the interpreter there)."""
    if fetch.worker < 0 or fetch.threads_cpu_ns <= 0:
        return 0
    return min(fetch.threads_cpu_ns, max(0, off_cpu_ns))


def _library_name(requests_by_library: Counter[int]) -> str:
    """The library whose threads made most of the background requests, by name; "" where none is known."""
    named = [(count, index) for index, count in requests_by_library.items()
             if 0 < index < len(DOWNLOAD_LIBRARIES) and count > 0]
    return DOWNLOAD_LIBRARIES[max(named)[1]] if named else ""


def waiting_ns(fetch: FetchRecord) -> int:
    """The batch's time off its own CPU and out of the run queue: what it waited on (I/O, other threads, sleeps)."""
    wall = max(0, fetch.end_ns - fetch.start_ns)
    off_cpu = wall - min(max(0, fetch.cpu_ns), wall)
    return off_cpu - (min(max(0, fetch.runqueue_ns), off_cpu) if fetch.runqueue_ns >= 0 else 0)


def client_of(call_names: set[str]) -> str:
    """The HTTP client a loader's timed calls name (``recorder/http_requests.py``'s labels)."""
    if any(name.startswith("S3 ") for name in call_names):
        return "boto3"
    if "requests.Session.request" in call_names:
        return "requests"
    if "urllib.request.urlopen" in call_names:
        return "urllib"
    if "fsspec sync" in call_names:
        return "fsspec"
    return "http"
