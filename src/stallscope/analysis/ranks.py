"""Across the ranks of a distributed job: per-rank findings, skew per step, and the straggler.

A synchronous data-parallel job is as fast as its slowest rank, and a rank that is slow to produce
its batch shows up on every other rank as time in the gradient all-reduce. Each rank process is
analysed on its own (a view of the session holding that process and its DataLoader workers); the
ranks are then compared step by step on their *own* time, the step minus the wait for the others.
The rank with the most own time, when it exceeds the fastest rank's by ``STRAGGLER_AT`` of a step
while the others wait in collectives, is the straggler. Its cause is the stage in which its own time per step
differs most from the other ranks' (the input stages counted together against transfer and compute), not its
largest stage: a straggler that waits 26% of its step for data where the others wait 5% is slow for its data,
however large its compute.

The job's top-level findings are those of the straggler when there is one (it sets the pace), and of
the lowest rank otherwise.
"""

from __future__ import annotations

import dataclasses
import heapq
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stallscope.analysis.findings import Analysis, Recommendation
from stallscope.analysis.fixes import advise
from stallscope.session import PER_PROCESS, RankRecord, Session

STRAGGLER_AT = 0.15  # own-time gap between the slowest and the fastest rank, as a share of the median step
STRAGGLER_MIN_S = 0.002
WAITING_AT = 0.10  # the other ranks must spend at least this share of their steps in collectives
#: A straggler whose node gives it at most this share of the CPUs the other ranks' nodes give them is short of CPUs:
#: all its CPU work is slower, whichever stage shows it most.
FEWER_CPUS_AT = 0.8
#: The slowest rank "moves" where no rank is the slowest in this share of the steps or more (two ranks that take
#: turns at random come out near one half each) and the ranks reach a step far enough apart to matter
#: (``STRAGGLER_AT`` of the step at the median).
SLOWEST_MOVES_BELOW = 0.6
MOVES_MIN_STEPS = 8
SYNC_BOUND_AT = 0.30
INPUT_STAGES = ("storage", "decode", "transform", "loader")


@dataclass(frozen=True)
class RankSummary:
    rank: int
    local_rank: int
    node_rank: int
    host: str
    pid: int
    world_size: int
    verdict: str  # input-bound | compute-bound | balanced | sync-bound | unknown
    bottleneck_node: str | None
    bottleneck_share: float
    data_wait_fraction: float
    sync_fraction: float
    steps: int
    steps_per_s: float
    samples_per_s: float | None
    median_step_s: float | None
    own_step_s: float | None  # median step minus the wait for other ranks
    node_seconds: dict[str, float]
    num_workers: int | None
    sampler: str | None
    batches_per_epoch: float | None
    failed: str | None  # the exception that ended this rank, if any
    steady_steps: int = 0
    parts_s: dict[str, float] | None = None  # compute split over the steady steps (forward, backward, ...)
    node_cpus: float | None = None  # CPU time per second its node allowed the job (affinity, cgroup quota)


@dataclass(frozen=True)
class DistributedFindings:
    world_size: int
    hosts: list[str]
    primary_rank: int | None  # whose analysis the job's top-level findings are
    straggler_rank: int | None
    straggler_stage: str | None  # the stage in which the straggler's own time differs most from the others'
    straggler_verdict: str | None
    straggler_extra_s: float  # median own time per step beyond the fastest rank's
    waiting: dict[int, float]  # rank -> share of its step time spent in collectives
    skew_median_s: float | None
    skew_p90_s: float | None
    step_skew_s: list[float] = field(default_factory=list)  # per aligned steady step: max - min own time
    straggler_part: str | None = None  # where the cause is compute: the part of the step that differs most
    straggler_limit: str | None = None  # the straggler's own largest stage
    # seconds per step the straggler spends beyond the other ranks' median, per stage and per compute part
    straggler_differs_s: dict[str, float] = field(default_factory=dict)
    #: where the straggler's node gives it fewer CPUs than the others' nodes: {"rank": its, "others": their median}
    straggler_cpus: dict[str, float] | None = None
    #: rank -> share of the aligned steady steps in which it did the most of its own work
    slowest_share: dict[int, float] = field(default_factory=dict)
    #: no rank is the slowest in most steps, yet the ranks wait for each other: uneven work per sample (a data
    #: problem), not a slow node
    slowest_moves: bool = False
    #: one row per node (a merged job's node sessions; one node otherwise): ``node_rows``
    nodes: list[dict[str, Any]] = field(default_factory=list)


def job_of(session: Session) -> dict[str, Any] | None:
    """The job a session of ranks belongs to: its launcher's words, its size, the ranks here; for a merged session
    (``stallscope merge``, or gathered at the end of ``run``) also its nodes and the ranks that sent nothing."""
    if not session.ranks:
        return None
    world = max(r.world_size for r in session.ranks)
    here = sorted({r.rank for r in session.ranks})
    job: dict[str, Any] = {"id": next((r.job for r in session.ranks if r.job), None), "world_size": world,
                           "ranks_here": here}
    if session.clock_alignment:
        job["nodes"] = [{"host": a.get("host"), "run_id": a.get("run_id"), "ranks": a.get("ranks")}
                        for a in session.clock_alignment]
        job["missing_ranks"] = [r for r in range(world) if r not in set(here)]
    return job


def rank_processes(session: Session) -> list[RankRecord]:
    """One record per rank process (the last one seen for a pid), in rank order."""
    by_pid = {r.pid: r for r in session.ranks}
    return sorted(by_pid.values(), key=lambda r: (r.rank, r.pid))


def members(session: Session, pid: int) -> set[int]:
    """The rank process and the processes working for it (its DataLoader workers)."""
    owned = {pid}
    for proc in session.processes:
        if proc.owner == pid or (proc.owner is None and proc.ppid == pid and proc.role != "rank"):
            owned.add(proc.pid)
    owned |= {w.pid for w in session.worker_starts if w.pid in owned}
    return owned


#: Each per-process list of a session split by pid, each record with its place in the whole list.
RecordIndex = dict[str, dict[int, list[tuple[int, Any]]]]


def records_by_pid(session: Session) -> RecordIndex:
    """Each per-process list of the session split by pid: a job's rank views are then made in time linear in the
    session, not in ranks x records."""
    index: RecordIndex = {}
    for name in (*PER_PROCESS, "processes", "ranks"):
        split: dict[int, list[tuple[int, Any]]] = {}
        for place, record in enumerate(getattr(session, name)):
            split.setdefault(record.pid, []).append((place, record))
        index[name] = split
    return index


def rank_view(session: Session, pid: int, index: RecordIndex | None = None) -> Session:
    """The session as if ``pid`` were the only training process: its records and its workers', in the session's
    order. ``index``: ``records_by_pid(session)``, made once for all of a job's ranks."""
    keep = members(session, pid)
    index = index or records_by_pid(session)

    def kept(name: str, pids: set[int]) -> list[Any]:
        return [r for _, r in heapq.merge(*(index[name].get(p, []) for p in sorted(pids)), key=lambda pr: pr[0])]

    changes: dict[str, Any] = {name: kept(name, keep) for name in (*PER_PROCESS, "processes")}
    changes["ranks"] = kept("ranks", {pid})
    return dataclasses.replace(session, **changes)


def node_cpus(session: Session, rank: int) -> tuple[int | None, float | None]:
    """(usable CPUs, CPU time per second) of the node ``rank`` ran on, where a merged session kept them per node
    (each node's own checks); (None, None) otherwise: the session's own then count."""
    for node in session.clock_alignment:
        if rank in node.get("ranks", []) and node.get("cpus") is not None:
            return node.get("usable_cpus"), node.get("cpus")
    return None, None


def analyze_ranks(session: Session, analyze_process: Callable[[Session, int | None], Analysis],
                  cpus: int) -> dict[int, tuple[RankRecord, Analysis]]:
    """rank -> (its record, its analysis); each rank gets its share of its node's CPUs (``cpus``, the session's,
    where a merged session did not keep its node's own)."""
    ranks = rank_processes(session)
    per_host = Counter(r.host for r in ranks)
    index = records_by_pid(session)
    return {r.rank: (r, analyze_process(rank_view(session, r.pid, index),
                                        max(1, (node_cpus(session, r.rank)[0] or cpus) // per_host[r.host])))
            for r in ranks}


def rank_verdict(analysis: Analysis) -> tuple[str, str | None, float]:
    """The rank's verdict and limiting node: ``sync-bound`` when waiting for the others dominates."""
    stats = analysis.steps
    total = sum(analysis.node_seconds.values())
    if stats.steady and stats.sync_fraction >= SYNC_BOUND_AT and stats.sync_fraction > stats.data_wait_fraction:
        return "sync-bound", "sync", analysis.node_seconds.get("sync", 0.0) / total if total > 0 else 0.0
    return analysis.verdict, analysis.bottleneck_node, analysis.bottleneck_share


def _own_times(analysis: Analysis) -> dict[int, float]:
    return {s.index: (s.duration_ns - s.sync_ns) / 1e9 for s in analysis.steps.steady}


def summarize_rank(record: RankRecord, analysis: Analysis, session: Session) -> RankSummary:
    verdict, node, share = rank_verdict(analysis)
    stats = analysis.steps
    own = list(_own_times(analysis).values())
    train = next((ld for ld in analysis.loaders if ld.role == "train"), None)
    errors = [e for e in session.errors if e.pid == record.pid and e.where == "main"]
    return RankSummary(
        rank=record.rank, local_rank=record.local_rank, node_rank=record.node_rank, host=record.host,
        pid=record.pid, world_size=record.world_size, verdict=verdict, bottleneck_node=node, bottleneck_share=share,
        data_wait_fraction=stats.data_wait_fraction, sync_fraction=stats.sync_fraction, steps=stats.run_steps,
        steps_per_s=analysis.steps_per_s, samples_per_s=analysis.samples_per_s, median_step_s=stats.median_step_s,
        own_step_s=statistics.median(own) if own else None, node_seconds=dict(analysis.node_seconds),
        num_workers=int(train.config.get("num_workers") or 0) if train else None,
        sampler=train.config.get("sampler") if train else None,
        batches_per_epoch=train.batches / train.epochs if train and train.epochs else None,
        failed=f"{errors[0].type}: {errors[0].message}" if errors else None,
        steady_steps=len(stats.steady), parts_s=dict(stats.parts_s) if stats.parts_s else None,
        node_cpus=node_cpus(session, record.rank)[1],
    )


def _per_step(figures: dict[str, float] | None, steps: int) -> dict[str, float]:
    return {k: v / steps for k, v in (figures or {}).items()} if steps else {}


def straggler_cause(slow: RankSummary, others: list[RankSummary]) -> tuple[str | None, str | None, dict[str, float]]:
    """(stage, compute part or None, seconds per step beyond the others' median by stage and by part): where the
    straggler's own time differs from the other ranks'. The input stages count together against transfer and
    compute (each rank splits its own small wait over them its own way); the cause is then the input stage that
    differs most. The others' wait for the straggler (sync) is not own time and is left out."""
    mine = _per_step(slow.node_seconds, slow.steady_steps)
    theirs = [_per_step(o.node_seconds, o.steady_steps) for o in others if o.steady_steps]
    if not mine or not theirs:
        return None, None, {}
    differs = {stage: mine[stage] - statistics.median(t.get(stage, 0.0) for t in theirs)
               for stage in mine if stage != "sync"}
    groups = {"input": sum(differs.get(s, 0.0) for s in INPUT_STAGES),
              "transfer": differs.get("transfer", 0.0), "compute": differs.get("compute", 0.0)}
    group = max(groups, key=lambda g: groups[g])
    if groups[group] <= 0:
        return None, None, {}
    stage = max(INPUT_STAGES, key=lambda s: differs.get(s, 0.0)) if group == "input" else group
    part = None
    my_parts = _per_step(slow.parts_s, slow.steady_steps)
    their_parts = [_per_step(o.parts_s, o.steady_steps) for o in others if o.parts_s and o.steady_steps]
    if my_parts and their_parts:
        for name in my_parts:
            differs[name] = my_parts[name] - statistics.median(t.get(name, 0.0) for t in their_parts)
        if stage == "compute":
            part = max(my_parts, key=lambda name: differs[name])
    return stage, part, {k: round(v, 6) for k, v in differs.items()}


def job_findings(summaries: list[RankSummary], analyses: dict[int, Analysis]) -> DistributedFindings:
    world = max([s.world_size for s in summaries] + [len(summaries)])
    hosts = sorted({s.host for s in summaries})
    timed = [s for s in summaries if s.own_step_s is not None]
    waiting = {s.rank: round(s.sync_fraction, 4) for s in summaries}
    own = {s.rank: _own_times(analyses[s.rank]) for s in timed}
    skews, shares = _step_skews(own), _slowest_shares(own)
    straggler: RankSummary | None = None
    extra = 0.0
    if len(timed) >= 2:
        slowest = max(timed, key=lambda s: s.own_step_s or 0.0)
        fastest = min(timed, key=lambda s: s.own_step_s or 0.0)
        job_step = statistics.median(s.median_step_s or 0.0 for s in timed)
        extra = (slowest.own_step_s or 0.0) - (fastest.own_step_s or 0.0)
        others_wait = max(s.sync_fraction for s in timed if s.rank != slowest.rank)
        if extra >= max(STRAGGLER_MIN_S, STRAGGLER_AT * job_step) and others_wait >= WAITING_AT:
            straggler = slowest
    primary = straggler.rank if straggler else (timed[0].rank if timed else (summaries[0].rank if summaries else None))
    stage = part = None
    differs: dict[str, float] = {}
    if straggler is not None:
        stage, part, differs = straggler_cause(straggler, [s for s in timed if s.rank != straggler.rank])
        if stage is None:  # no stage of its own time stands out: its largest one
            stage = straggler.bottleneck_node if straggler.bottleneck_node != "sync" else "compute"
    return DistributedFindings(
        world_size=world, hosts=hosts, primary_rank=primary,
        straggler_rank=straggler.rank if straggler else None, straggler_stage=stage,
        straggler_verdict=straggler.verdict if straggler else None, straggler_extra_s=max(0.0, extra),
        waiting=waiting, skew_median_s=statistics.median(skews) if skews else None,
        skew_p90_s=sorted(skews)[min(len(skews) - 1, int(0.9 * (len(skews) - 1) + 0.5))] if skews else None,
        step_skew_s=[round(v, 6) for v in skews],
        straggler_part=part, straggler_limit=straggler.bottleneck_node if straggler else None,
        straggler_differs_s=differs, straggler_cpus=_fewer_cpus(straggler, summaries) if straggler else None,
        slowest_share=shares, slowest_moves=_moves(shares, skews, timed),
    )


def _moves(shares: dict[int, float], skews: list[float], timed: list[RankSummary]) -> bool:
    if len(skews) < MOVES_MIN_STEPS or not shares:
        return False
    job_step = statistics.median(s.median_step_s or 0.0 for s in timed)
    return max(shares.values()) < SLOWEST_MOVES_BELOW and statistics.median(skews) >= STRAGGLER_AT * job_step


def _fewer_cpus(slow: RankSummary, summaries: list[RankSummary]) -> dict[str, float] | None:
    """The straggler's node's CPUs against the others' median, where it has at most ``FEWER_CPUS_AT`` of theirs."""
    theirs = [s.node_cpus for s in summaries if s.rank != slow.rank and s.node_cpus]
    if slow.node_cpus is None or not theirs:
        return None
    median = statistics.median(theirs)
    return {"rank": slow.node_cpus, "others": median} if slow.node_cpus <= FEWER_CPUS_AT * median else None


def node_rows(session: Session, summaries: list[RankSummary]) -> list[dict[str, Any]]:
    """Per node (each node session a merged job was made of; the whole session otherwise): its host, ranks and CPUs,
    its slowest rank's steps/s, its ranks' mean data wait and sync wait, and the stage that leads most of them."""
    groups = [(n.get("host"), set(n.get("ranks", [])), n.get("cpus")) for n in session.clock_alignment] or [
        (summaries[0].host if summaries else None, {s.rank for s in summaries}, None)]
    rows = []
    for host, ranks, cpus in groups:
        mine = [s for s in summaries if s.rank in ranks]
        if not mine:
            rows.append({"host": host, "ranks": sorted(ranks), "cpus": cpus, "sent": False})
            continue
        stages = Counter(s.bottleneck_node for s in mine if s.bottleneck_node)
        rows.append({"host": host, "ranks": sorted(s.rank for s in mine), "cpus": cpus, "sent": True,
                     "steps_per_s": round(min(s.steps_per_s for s in mine), 3),
                     "data_wait_fraction": round(statistics.fmean(s.data_wait_fraction for s in mine), 4),
                     "sync_fraction": round(statistics.fmean(s.sync_fraction for s in mine), 4),
                     "leading": stages.most_common(1)[0][0] if stages else None})
    return rows


def _slowest_shares(own: dict[int, dict[int, float]]) -> dict[int, float]:
    """rank -> the share of the steps present on every rank in which it did the most of its own work."""
    if len(own) < 2:
        return {}
    common = sorted(set.intersection(*(set(times) for times in own.values())))
    if not common:
        return {}
    counts = Counter(max(own, key=lambda rank: own[rank][i]) for i in common)
    return {rank: round(counts.get(rank, 0) / len(common), 4) for rank in sorted(own)}


def _step_skews(own: dict[int, dict[int, float]]) -> list[float]:
    """Per step index present on every rank: the spread of the ranks' own time."""
    if len(own) < 2:
        return []
    common = set.intersection(*(set(times) for times in own.values()))
    return [max(t[i] for t in own.values()) - min(t[i] for t in own.values()) for i in sorted(common)]


def _straggler_cpus(summaries: list[RankSummary], findings: DistributedFindings) -> Recommendation:
    """Give the straggler's node the CPUs the others have. Its own work (its step less its wait for the others) is
    taken to be CPU work, which then shrinks by its CPUs over theirs; the job's step becomes the longer of that and
    the next slowest rank's own work, plus the collective time the straggler itself waits."""
    slow = next(s for s in summaries if s.rank == findings.straggler_rank)
    cpus = findings.straggler_cpus or {}
    pace = max((s.own_step_s for s in summaries if s.rank != slow.rank and s.own_step_s), default=0.0)
    gain = None
    if slow.median_step_s and slow.own_step_s and cpus.get("rank") and cpus.get("others"):
        own_after = max(slow.own_step_s * cpus["rank"] / cpus["others"], pace)
        after = own_after + max(0.0, slow.median_step_s - slow.own_step_s)
        gain = round(slow.median_step_s / after, 2) if after < slow.median_step_s else None
    return advise("straggler-cpus", gain, facts={
        "rank": slow.rank, "host": slow.host, "cpus": cpus.get("rank"), "others_cpus": cpus.get("others"),
        "extra_ms": round(1e3 * findings.straggler_extra_s, 3),
        "own_step_ms": round(1e3 * (slow.own_step_s or 0.0), 3), "pace_own_step_ms": round(1e3 * pace, 3)})


def rank_recommendations(summaries: list[RankSummary], findings: DistributedFindings, usable_cpus: int,
                         dataset_len: int | None) -> list[Recommendation]:
    """Sharded-input and per-node worker fixes; the straggler's own fixes come from its analysis."""
    recs: list[Recommendation] = []
    world = max(findings.world_size, len(summaries))
    samplers = {s.sampler for s in summaries if s.sampler}
    if world > 1 and samplers and "DistributedSampler" not in samplers:
        recs.append(advise("distributed-sampler", None,
                           facts={"samplers": sorted(samplers), "world_size": world}))
    per_epoch = {s.rank: s.batches_per_epoch for s in summaries if s.batches_per_epoch is not None}
    if len(set(per_epoch.values())) > 1:
        recs.append(advise("uneven-shards", None,
                           facts={"batches_per_epoch": {r: v for r, v in sorted(per_epoch.items())}}))
    elif "DistributedSampler" in samplers and dataset_len and dataset_len % world:
        recs.append(advise("sampler-drop-last", None,
                           facts={"dataset_len": dataset_len, "world_size": world}))
    if findings.straggler_cpus is not None:
        recs.append(_straggler_cpus(summaries, findings))
    by_host: dict[str, list[RankSummary]] = {}
    for s in summaries:
        by_host.setdefault(s.host, []).append(s)
    for host, ranks in sorted(by_host.items()):
        workers = sum(s.num_workers or 0 for s in ranks)
        if workers + len(ranks) > usable_cpus and workers > 0:
            fit = max(0, (usable_cpus - len(ranks)) // len(ranks))
            recs.append(advise("workers-per-node", None, {"num_workers": fit},
                               {"host": host, "ranks": len(ranks), "workers": workers,
                                "usable_cpus": usable_cpus}))
    return recs
