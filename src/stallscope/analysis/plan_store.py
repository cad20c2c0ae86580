"""The object store a plan reads from: the requests in flight its rate needs, from ``doctor s3://...``'s probe.

Why: a plan's workers overlap their storage waits without limit, but a store serves a rate only with enough
requests in flight, and one process's client tops out (boto3 signs and parses on one thread at a time). The
recorded run gives the requests per sample and how many each worker kept in flight; the probe gives the rate each
number of connections reached; together they say whether the planned workers keep enough in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from stallscope.analysis.store_requests import RequestStats


class ProbedLevel(Protocol):
    @property
    def connections(self) -> int: ...

    @property
    def objects_per_s(self) -> float: ...


class StoreProbeLike(Protocol):
    """What the plan needs of ``health.object_store.StoreProbe`` (analysis does not import the health checks)."""
    @property
    def url(self) -> str: ...

    @property
    def best(self) -> ProbedLevel | None: ...

    @property
    def request_median_s(self) -> float: ...

    @property
    def highest(self) -> ProbedLevel | None: ...

    @property
    def limit(self) -> str | None: ...

    def connections_for(self, objects_per_s: float) -> tuple[int, bool]: ...


@dataclass(frozen=True)
class StoreNeed:
    """The planned rate's requests against what the probe measured."""
    url: str
    samples_per_s: float  # the plan's best rate, all training processes together
    per_sample: float  # requests a sample, as recorded
    objects_per_s: float
    connections: int  # requests in flight that read ``objects_per_s``
    reached: bool  # one process reached that rate in the probe (else Little's law on its median request)
    process_best_objects_per_s: float  # one process's best in the probe
    processes: int  # processes (workers) the rate needs at that best, at least
    workers: int  # the plan's loading processes (its workers, or its training processes without), all together
    in_flight_per_worker: float  # as recorded: requests on the network at once, per worker
    request_ms: float
    limit: str | None = None  # whose limit the probe's processes met: client, cpus, store (``StoreProbe.limit``)
    highest_objects_per_s: float = 0.0  # the most the probe read, one process or several together

    @property
    def store_caps(self) -> bool:
        """The plan's rate needs more than the store gave several processes at once, with cores to spare: the
        store or its link caps it, however many workers."""
        return self.limit == "store" and 0 < self.highest_objects_per_s < self.objects_per_s

    @property
    def capped_samples_per_s(self) -> float | None:
        """The samples/s the store allows (its highest measured rate over the requests a sample), where it caps."""
        return self.highest_objects_per_s / self.per_sample if self.store_caps else None

    @property
    def in_flight_planned(self) -> float:
        return self.workers * self.in_flight_per_worker

    @property
    def enough(self) -> bool:
        return self.in_flight_planned >= self.connections and self.workers >= self.processes

    @property
    def per_worker_needed(self) -> int:
        """Requests each loading process must keep in flight for the rate."""
        return math.ceil(self.connections / max(1, self.workers))

    def to_dict(self) -> dict[str, object]:
        return {"url": self.url, "samples_per_s": round(self.samples_per_s, 2), "per_sample": round(self.per_sample, 3),
                "objects_per_s": round(self.objects_per_s, 1), "connections": self.connections,
                "reached": self.reached, "process_best_objects_per_s": round(self.process_best_objects_per_s, 1),
                "processes": self.processes, "workers": self.workers,
                "in_flight_per_worker": round(self.in_flight_per_worker, 2),
                "in_flight_planned": round(self.in_flight_planned, 1), "enough": self.enough,
                "request_ms": round(self.request_ms, 2), "limit": self.limit,
                "highest_objects_per_s": round(self.highest_objects_per_s, 1),
                "capped_samples_per_s": round(capped, 1) if (capped := self.capped_samples_per_s) else None}


def store_need(probe: StoreProbeLike, requests: RequestStats | None, samples_per_s: float, workers: int,
               recorded_workers: int) -> StoreNeed | None:
    """The store's side of a plan whose best row reads ``samples_per_s`` with ``workers`` workers in all; None where
    the recorded run made no requests (its data was not on the network)."""
    if requests is None or requests.per_sample <= 0:
        return None
    objects_per_s = samples_per_s * requests.per_sample
    connections, reached = probe.connections_for(objects_per_s)
    best = probe.best.objects_per_s if probe.best is not None else 0.0
    processes = max(1, math.ceil(objects_per_s / best)) if best > 0 else 1
    per_worker = requests.in_flight / max(1, recorded_workers)  # a run without workers loads in one process
    highest = probe.highest.objects_per_s if probe.highest is not None else 0.0
    return StoreNeed(probe.url, samples_per_s, requests.per_sample, objects_per_s, connections, reached, best,
                     processes, workers, per_worker, 1e3 * probe.request_median_s, probe.limit, highest)
