"""The workers' side of a loader: where their busy time went, how full the queue was, start-up.

Per fetched batch, wall time is split by node. CPU time inside instrumented calls goes to their
node; CPU time outside any (the dataset's own Python) goes to ``transform``; time off the CPU
is split into waiting for a CPU (run-queue, charged to the CPU nodes in proportion, since more
cores would remove it) and blocking (I/O, sleeps, network), charged to ``storage``.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict
from dataclasses import dataclass

from stallscope.analysis.findings import WorkerPipeline
from stallscope.analysis.store_requests import download_threads_cpu_ns, request_stats
from stallscope.analysis.store_requests import waiting_ns as waiting  # interpreter_wait_ns takes a waiting_ns
from stallscope.session import FetchRecord, LoaderRecord, Session


def split_fetch(fetch: FetchRecord, shares: dict[str, float] | None = None) -> dict[str, int]:
    """Nanoseconds of one fetch per node; the values add up to its wall time.

    ``shares``: the loader's CPU split (``loader_cpu_shares``), used for a batch whose calls were not timed.
    """
    return _spread(fetch, fetch_parts(fetch, shares))


def _spread(fetch: FetchRecord, parts: tuple[dict[str, int], int, int]) -> dict[str, int]:
    """``split_fetch`` from the fetch's parts: run-queue wait to the CPU nodes in proportion, the rest to storage."""
    wall = max(0, fetch.end_ns - fetch.start_ns)
    cpu_by_node, runqueue, _ = parts
    cpu = min(max(0, fetch.cpu_ns), wall)  # the fetching thread's own: its wait for a core is its nodes'
    downloads = max(0, sum(cpu_by_node.values()) - cpu)  # its download threads' CPU, counted in storage's
    result: dict[str, int] = defaultdict(int)
    for node, value in cpu_by_node.items():
        own = value - downloads if node == "storage" else value
        share = runqueue * own // cpu if cpu > 0 else 0
        result[node] += value + share
    distributed = sum(result.values())
    result["storage"] += wall - distributed
    return dict(result)


def fetch_parts(fetch: FetchRecord, shares: dict[str, float] | None = None,
                own_thread: bool = False) -> tuple[dict[str, int], int, int]:
    """(CPU ns per node, run-queue wait ns, blocked ns) of one fetch; together they make its wall time.

    A batch whose calls were not timed has its CPU split by ``shares`` (its loader's timed batches);
    without them, all of its CPU counts as ``transform``, as for a dataset with no instrumented calls.
    ``own_thread``: the fetching thread's CPU alone, its loader's download threads' left in the blocked time.
    """
    wall = max(0, fetch.end_ns - fetch.start_ns)
    cpu = min(max(0, fetch.cpu_ns), wall)
    if not fetch.timed and shares:
        estimated = {node: int(cpu * share) for node, share in shares.items()}
        estimated["transform"] = estimated.get("transform", 0) + cpu - sum(estimated.values())  # rounding
        return _with_off_cpu(fetch, estimated, wall, cpu, own_thread)
    cpu_by_node: dict[str, int] = defaultdict(int)
    for node, (_, node_cpu, _) in fetch.by_node.items():
        cpu_by_node[node] += max(0, node_cpu)
    known = sum(cpu_by_node.values())
    if known > cpu:  # clock granularity: scale down rather than exceed the measured total
        cpu_by_node = defaultdict(int, {n: v * cpu // known for n, v in cpu_by_node.items()})
        known = sum(cpu_by_node.values())
    cpu_by_node["transform"] += cpu - known
    return _with_off_cpu(fetch, dict(cpu_by_node), wall, cpu, own_thread)


def _with_off_cpu(fetch: FetchRecord, cpu_by_node: dict[str, int], wall: int, cpu: int,
                  own_thread: bool = False) -> tuple[dict[str, int], int, int]:
    """The fetch's time off its CPU: waiting to run (the run queue; and, for a batch the training process loaded
    itself, the interpreter lock while its other Python threads ran, up to their CPU meanwhile) and blocked (I/O,
    sleeps: storage's). A worker's batch that waited on its loader's download threads has their CPU meanwhile
    counted as storage's CPU, not as blocked (``own_thread``: the fetching thread's CPU alone)."""
    off_cpu = wall - cpu
    runqueue = min(max(0, fetch.runqueue_ns), off_cpu) if fetch.runqueue_ns >= 0 else 0
    runqueue += interpreter_wait_ns(fetch, off_cpu - runqueue)
    downloads = 0 if own_thread else download_threads_cpu_ns(fetch, off_cpu - runqueue)
    if downloads:
        cpu_by_node = {**cpu_by_node, "storage": cpu_by_node.get("storage", 0) + downloads}
    return cpu_by_node, runqueue, off_cpu - runqueue - downloads


def interpreter_wait_ns(fetch: FetchRecord, waiting_ns: int | None = None) -> int:
    """A batch the training process loaded itself: its wait for the interpreter lock, the part of its time off the
    CPU and out of the run queue (``waiting_ns``) up to its other Python threads' CPU meanwhile; 0 elsewhere."""
    if fetch.threads_cpu_ns <= 0 or fetch.worker >= 0:
        return 0
    return min(fetch.threads_cpu_ns, max(0, waiting(fetch) if waiting_ns is None else waiting_ns))


def cpu_shares(fetches: list[FetchRecord]) -> dict[str, float] | None:
    """The fraction of the call-timed batches' CPU that went to each node, over ``fetches`` taken together.

    Batches in between timed ones (see ``record.calls.timing_interval``) get their CPU split by
    these fractions: a ratio estimate over a systematic sample of the loader's batches.
    """
    totals: dict[str, int] = defaultdict(int)
    for f in fetches:
        if f.timed and f.outcome != "StopIteration":
            for node, value in fetch_parts(f, own_thread=True)[0].items():  # the thread's CPU, as it is split
                totals[node] += value
    total = sum(totals.values())
    return {node: value / total for node, value in totals.items()} if total > 0 else None


def loader_cpu_shares(fetches: list[FetchRecord]) -> dict[int, dict[str, float]]:
    """``cpu_shares`` per loader."""
    by_loader: dict[int, list[FetchRecord]] = defaultdict(list)
    for f in fetches:
        by_loader[f.loader_id].append(f)
    return {loader_id: shares for loader_id, group in by_loader.items() if (shares := cpu_shares(group))}


def fetch_stages(fetches: list[FetchRecord]) -> list[dict[str, int]]:
    """``split_fetch`` of every fetch, in order, each loader's untimed batches split like its timed ones."""
    shares = loader_cpu_shares(fetches)
    return [split_fetch(f, shares.get(f.loader_id)) for f in fetches]


@dataclass(frozen=True)
class Foreign:
    """Which records of some loader ids are another process's loaders', not ``owner``'s: loader ids are numbered
    per process, so a spawned worker that runs the script's module code again (no ``__main__`` guard around the
    DataLoader) builds a loader 0 of its own. Such a process's own fetches (in the process: worker -1) are not the
    owner's, nor are those of the workers it started; its fetches as one of the owner's workers are."""
    processes: frozenset[int] = frozenset()  # the other processes that built a loader of these ids
    their_workers: frozenset[int] = frozenset()  # the workers those processes started

    def has(self, pid: int, worker: int | None) -> bool:
        """Whether a record by process ``pid`` (as DataLoader worker ``worker``; -1 or None: in the process) is
        another process's."""
        if worker is None or worker < 0:
            return pid in self.processes
        return pid in self.their_workers


def foreign_records(session: Session, loader_ids: tuple[int, ...], owner: int | None) -> Foreign:
    """The records of ``loader_ids`` that are not ``owner``'s loaders' (see ``Foreign``); none where no other
    process built a loader of these ids."""
    if owner is None:
        return Foreign()
    others = frozenset(ld.pid for ld in session.loaders if ld.pid != owner and ld.loader_id in loader_ids)
    if not others:
        return Foreign()
    return Foreign(others, frozenset(p.pid for p in session.processes if p.ppid in others and p.pid != owner))


def _samples_fetched(session: Session, fetches: list[FetchRecord], ids: tuple[int, ...], owner: int | None,
                     loader: LoaderRecord | None) -> int:
    """The samples the fetches made, as the training steps count them. A DataLoader that batches fetches
    ``batch_size`` items for each batch; one that does not (``batch_size=None``) fetches one item per batch, which is
    a batch already where the dataset batches itself (WebDataset's ``.batched()``, a stream of ready batches): its
    samples are the batches' own, as the steps counted them (the batch's first length). Counted as one item, the
    loader's cost per sample read 8 times the steps' (a batch of 8), and the model's rates an eighth of those
    measured."""
    items = sum(f.items for f in fetches)
    if loader is None or loader.config.get("batch_size") is not None or loader.config.get("batch_sampler"):
        return items
    delivered = [n.batch_size for n in session.nexts
                 if n.loader_id in ids and n.batch_size and (owner is None or n.pid == owner)]
    return round(len(fetches) * statistics.mean(delivered)) if delivered else items


def worker_pipeline(session: Session, loader_ids: int | tuple[int, ...], owner: int | None = None
                    ) -> WorkerPipeline | None:
    """The workers' side of a loader: one DataLoader, or the several a script built at one line (a new one
    every epoch), taken together; ``owner``: the process that built them (other processes' loaders of the same
    ids are left out)."""
    ids = (loader_ids,) if isinstance(loader_ids, int) else tuple(loader_ids)
    loader_id = ids[0]
    foreign = foreign_records(session, ids, owner)
    fetches = [f for f in session.fetches
               if f.loader_id in ids and f.outcome != "StopIteration" and not foreign.has(f.pid, f.worker)]
    if not fetches:
        return None
    loader = next((ld for ld in session.loaders if ld.loader_id == loader_id and ld.pid not in foreign.processes),
                  None)
    num_workers = int(loader.config.get("num_workers", 0)) if loader else 0
    node_ns: dict[str, int] = defaultdict(int)
    node_cpu_ns: dict[str, int] = defaultdict(int)
    direct = cpu = blocked = runqueue = 0
    runqueue_known = True
    shares = cpu_shares(fetches)
    for f in fetches:
        parts = fetch_parts(f, shares)
        for node, value in _spread(f, parts).items():
            node_ns[node] += value
        for node, value in parts[0].items():
            node_cpu_ns[node] += value
        direct += sum(v[0] for v in f.by_node.values())
        wall = f.end_ns - f.start_ns
        cpu += min(f.cpu_ns, wall)
        if f.runqueue_ns < 0:
            runqueue_known = False
        rq = min(max(0, f.runqueue_ns), max(0, wall - f.cpu_ns))
        runqueue += rq
        # off the CPU, less the run queue and the download threads' CPU meanwhile (storage's CPU in ``parts``)
        blocked += parts[2] + parts[1] - rq
    busy = sum(f.end_ns - f.start_ns for f in fetches)
    timed = [f for f in fetches if f.timed]
    timed_busy = sum(f.end_ns - f.start_ns for f in timed)
    if len(timed) < len(fetches) and timed_busy > 0:  # calls timed in some batches: scale to all of them
        direct = int(direct * busy / timed_busy)
    nodes_of_calls = call_nodes(fetches)
    by_call = {name: share * node_ns.get(nodes_of_calls[name], 0) for name, share in
               call_shares(fetches, nodes_of_calls).items()}

    starts = [w for w in session.worker_starts if w.loader_id in ids and w.pid not in foreign.their_workers]
    startup = [(w.ready_ns - w.created_ns) / 1e9 for w in starts]
    busy_fraction = _busy_fraction(fetches, starts) if num_workers > 0 else None
    depth, empty = _queue_state(session, ids, owner, foreign) if num_workers > 0 else (None, None)
    pin = sum(p.end_ns - p.start_ns for p in session.pins if not p.main_thread) / 1e9 \
        if loader and loader.config.get("pin_memory") else 0.0
    errors = sum(1 for e in session.errors
                 if e.where == "worker" and e.loader_id in ids and not foreign.has(e.pid, e.worker))
    samples = _samples_fetched(session, fetches, ids, owner, loader)
    return WorkerPipeline(
        loader_id=loader_id,
        num_workers=num_workers,
        batches=len(fetches),
        call_timed_batches=len(timed),
        busy_s=busy / 1e9,
        node_s={k: v / 1e9 for k, v in sorted(node_ns.items())},
        node_cpu_s={k: v / 1e9 for k, v in sorted(node_cpu_ns.items())},
        samples=samples,
        direct_s=direct / 1e9,
        cpu_s=cpu / 1e9,
        blocked_s=blocked / 1e9,
        runqueue_s=runqueue / 1e9 if runqueue_known else None,
        by_call={k: v / 1e9 for k, v in sorted(by_call.items(), key=lambda kv: -kv[1])},
        call_node={k: nodes_of_calls[k] for k in by_call},
        batch_wall_median_s=statistics.median(f.end_ns - f.start_ns for f in fetches) / 1e9,
        batch_cpu_median_s=statistics.median(f.cpu_ns for f in fetches) / 1e9,
        startup_s=startup,
        busy_fraction=busy_fraction,
        queue_depth_mean=depth,
        empty_queue_fraction=empty,
        pin_s=pin,
        errors=errors,
        fresh_pages=sum(f.minflt for f in fetches) if all(f.minflt >= 0 for f in fetches) else None,
        requests=request_stats(fetches, samples, node_ns.get("storage", 0) / 1e9),
    )


def call_nodes(fetches: list[FetchRecord]) -> dict[str, str]:
    """The node of each timed call name (each name belongs to one). Recorded with its row (``[wall, cpu, calls,
    node]``); in sessions recorded before rows carried it, read from the fetches' totals, which are exact sums of
    their calls' (``_nodes_from_totals``)."""
    found: dict[str, str] = {}
    for f in fetches:
        for name, row in f.by_name.items():
            if len(row) > 3 and name not in found:
                found[name] = row[3]
    unplaced = [f for f in fetches if f.timed and any(name not in found for name in f.by_name)]
    for f in unplaced[:_MAX_FETCHES_TRIED]:
        if any(name not in found for name in f.by_name):
            found.update(_nodes_from_totals(f, found))
    return found


#: A fetch's unplaced calls are matched to its nodes' totals by trying their subsets: at most this many of them
#: (a thousand subsets), in at most this many fetches (a call no fetch places is left out, not guessed).
_MAX_UNPLACED = 10
_MAX_FETCHES_TRIED = 16


def _nodes_from_totals(fetch: FetchRecord, known: dict[str, str]) -> dict[str, str]:
    """The nodes of ``fetch``'s calls not in ``known``: a node's total (wall ns and calls) is the sum of its calls'
    rows, and the one subset of the unplaced calls that makes up what the placed ones leave of a node is that node's.
    Nothing where the subset is not one (ambiguous or absent) or the calls are too many to try."""
    unplaced = [name for name in fetch.by_name if name not in known]
    if not unplaced or len(unplaced) > _MAX_UNPLACED:
        return {}
    placed: dict[str, str] = {}
    for node, total in fetch.by_node.items():
        wall = total[0] - sum(fetch.by_name[n][0] for n in fetch.by_name if known.get(n) == node)
        count = total[2] - sum(fetch.by_name[n][2] for n in fetch.by_name if known.get(n) == node)
        free = [n for n in unplaced if n not in placed]
        matches = [subset for size in range(1, len(free) + 1) for subset in itertools.combinations(free, size)
                   if sum(fetch.by_name[n][0] for n in subset) == wall
                   and sum(fetch.by_name[n][2] for n in subset) == count]
        if len(matches) == 1:
            placed.update(dict.fromkeys(matches[0], node))
    return placed


def call_shares(fetches: list[FetchRecord], nodes: dict[str, str]) -> dict[str, float]:
    """Each timed call's share of its node's time in the batches whose calls were timed, the call's time counted
    as the node's is (``split_fetch``): its CPU (scaled as the node's CPU is where the calls' clocks overshoot the
    fetch's), with the run-queue wait in proportion; its blocked time is storage's, not the call's. A node's calls
    together are never more than the node: each share is at most 1, and so are their sums."""
    call_ns: dict[str, float] = defaultdict(float)
    node_ns: dict[str, int] = defaultdict(int)
    for f in fetches:
        if not f.timed or f.outcome == "StopIteration" or not f.by_name:
            continue
        parts = fetch_parts(f)
        for node, value in _spread(f, parts).items():
            node_ns[node] += value
        cpu_by_node, runqueue, _ = parts
        cpu = sum(cpu_by_node.values())
        known = sum(max(0, v[1]) for v in f.by_node.values())
        fit = min(1.0, min(max(0, f.cpu_ns), max(0, f.end_ns - f.start_ns)) / known) if known > 0 else 1.0
        for name, row in f.by_name.items():
            if name in nodes:
                own = max(0, row[1]) * fit
                call_ns[name] += own + (runqueue * own / cpu if cpu > 0 else 0.0)
    return {name: min(1.0, value / node_ns[nodes[name]]) if node_ns.get(nodes[name]) else 0.0
            for name, value in call_ns.items()}


def calls_in_step_time(pipeline: WorkerPipeline, stage_seconds: dict[str, float]) -> list[tuple[str, str, float]]:
    """(call, its node, seconds of step time) for the loader's calls, costliest first: each call's share of its
    node's worker time applied to the node's seconds of step time (``stage_seconds``), so a call shown beside the
    stages never costs more than its stage (with workers, worker time and step time differ)."""
    found = []
    for name, seconds in pipeline.by_call.items():
        node = pipeline.call_node.get(name)
        if node is None:
            continue
        worker_s = pipeline.node_s.get(node, 0.0)
        share = min(1.0, seconds / worker_s) if worker_s > 0 else 0.0
        found.append((name, node, share * stage_seconds.get(node, 0.0)))
    return sorted(found, key=lambda c: -c[2])


def _busy_fraction(fetches: list[FetchRecord], starts: list) -> float | None:
    """Busy time over each worker's life (ready to its last fetch), summed over workers."""
    by_worker: dict[tuple[int, int], list[FetchRecord]] = defaultdict(list)
    for f in fetches:
        by_worker[(f.iter_id, f.worker)].append(f)
    ready = {(w.iter_id, w.worker): w.ready_ns for w in starts}
    life = busy = 0
    for key, items in by_worker.items():
        begin = ready.get(key, min(f.start_ns for f in items))
        life += max(f.end_ns for f in items) - begin
        busy += sum(f.end_ns - f.start_ns for f in items)
    return busy / life if life > 0 else None


def _queue_state(session: Session, ids: tuple[int, ...], owner: int | None = None,
                 foreign: Foreign | None = None) -> tuple[float | None, float | None]:
    """Mean number of batches ready and waiting when the main process asked for one, and how often none was.

    Worker fetches are matched to batches through the order of index sends: a worker serves its
    queue first-in first-out, so its j-th fetch answers the j-th index sent to it. ``owner``: the process whose
    loaders these are (another's sends and takes of the same ids are left out, as are ``foreign``'s fetches).
    """
    foreign = foreign or Foreign()

    def owned(pid: int) -> bool:
        return owner is None or pid in (owner, -1)  # -1: a record from before sends carried their process

    sends_by_worker: dict[tuple[int, int], list] = defaultdict(list)
    for s in session.sends:
        if s.loader_id in ids and owned(s.pid):
            sends_by_worker[(s.iter_id, s.worker)].append(s)
    fetch_by_worker: dict[tuple[int, int], list[FetchRecord]] = defaultdict(list)
    for f in session.fetches:
        if f.loader_id in ids and f.worker >= 0 and not foreign.has(f.pid, f.worker):
            fetch_by_worker[(f.iter_id, f.worker)].append(f)
    ready_at: dict[tuple[int, int, int], int] = {}
    for key, sends in sends_by_worker.items():
        done = sorted(fetch_by_worker.get(key, []), key=lambda f: f.seq)
        for send, fetch in zip(sorted(sends, key=lambda s: s.t_ns), done):
            ready_at[(send.iter_id, send.epoch, send.send_idx)] = fetch.end_ns
    nexts = [n for n in session.nexts if n.loader_id in ids and owned(n.pid)]
    if not nexts or not ready_at:
        return None, None
    position: dict[tuple[int, int], int] = defaultdict(int)
    ready_times = sorted(ready_at.values())
    consumed_ends = sorted(n.end_ns for n in nexts)
    depths: list[int] = []
    empty = 0
    for n in nexts:
        k = position[(n.iter_id, n.epoch)]
        position[(n.iter_id, n.epoch)] = k + 1
        ready = ready_at.get((n.iter_id, n.epoch, k))
        if ready is None:
            continue
        if ready > n.start_ns:
            empty += 1
        produced = bisect.bisect_right(ready_times, n.start_ns)
        consumed = bisect.bisect_right(consumed_ends, n.start_ns)
        depths.append(max(0, produced - consumed))
    if not depths:
        return None, None
    return statistics.fmean(depths), empty / len(depths)
