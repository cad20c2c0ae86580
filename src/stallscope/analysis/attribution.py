"""The verdict, and the split of step time over the seven nodes.

Step time is data wait + host-to-device transfer + compute. The data wait is charged to the
input nodes in the proportions the loader's own work shows: for ``num_workers=0`` that work
happened inside the wait itself; with workers it is the workers' per-node busy time. Starting
an iterator (spawning workers) inside a step is ``loader`` time.
"""

from __future__ import annotations

from stallscope.analysis.findings import LoaderSummary, StepStats
from stallscope.constants import INPUT_NODES, NODE_IDS

INPUT_BOUND_AT = 0.30
COMPUTE_BOUND_BELOW = 0.10


def verdict_for(stats: StepStats) -> str:
    if not stats.steady or stats.wall_s <= 0:
        return "unknown"
    fraction = stats.data_wait_fraction
    if fraction >= INPUT_BOUND_AT:
        return "input-bound"
    if fraction < COMPUTE_BOUND_BELOW:
        return "compute-bound"
    return "balanced"


def node_seconds(stats: StepStats, train: LoaderSummary | None, iter_start_in_steady_s: float) -> dict[str, float]:
    seconds = {node: 0.0 for node in NODE_IDS}
    seconds["compute"] = stats.compute_s
    seconds["transfer"] = stats.transfer_s
    # Blocked in a next() that never returned: workers that stopped delivering, whatever their stage was.
    seconds["loader"] += stats.stalled_s
    wait = stats.wait_s - stats.stalled_s
    startup = min(wait, iter_start_in_steady_s)
    seconds["loader"] += startup
    wait -= startup
    # Rebuilding batches from workers is loader machinery, but only its CPU part: the rest of it was spent
    # waiting for the sending worker (file descriptors), which is the workers' own work showing through.
    receiving = min(wait, stats.unpickle_cpu_s)
    seconds["loader"] += receiving
    wait -= receiving
    pipeline = train.pipeline if train else None
    if pipeline is not None and pipeline.busy_s > 0:
        shares = dict(pipeline.node_s)
        if pipeline.num_workers == 0:
            # The wait is the fetch plus sampler, pinning and bookkeeping around it: that overhead is loader time.
            overhead = max(0.0, train.wait_s - pipeline.busy_s) if train else 0.0
            shares["loader"] = shares.get("loader", 0.0) + overhead
        else:
            shares["loader"] = shares.get("loader", 0.0) + pipeline.pin_s
        total = sum(shares.values())
        for node, value in shares.items():
            if node in seconds and total > 0:
                seconds[node] += wait * value / total
    else:
        seconds["loader"] += wait
    return seconds


def bottleneck(verdict: str, seconds: dict[str, float]) -> tuple[str | None, float]:
    total = sum(seconds.values())
    if verdict == "unknown" or total <= 0:
        return None, 0.0
    candidates = INPUT_NODES if verdict == "input-bound" else NODE_IDS
    node = max(candidates, key=lambda n: seconds.get(n, 0.0))
    if verdict == "compute-bound":
        node = max(("compute", "sync", "transfer"), key=lambda n: seconds.get(n, 0.0))
    return node, seconds[node] / total
