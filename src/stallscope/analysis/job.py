"""The whole analysis of a Session: one training process and its workers, or every rank of a distributed
job. It puts together what the other modules of ``analysis`` each answer: ``steps`` (where steps begin
and end), ``pipeline`` (the workers' time per stage), ``attribution`` (the verdict and the stage split),
``capacity`` (the throughput model), ``recommend``, ``pitfalls``, ``system_metrics``, ``gpu_timing`` and
``ranks``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from stallscope.analysis import ranks as ranks_mod
from stallscope.analysis.attribution import bottleneck, node_seconds, verdict_for
from stallscope.analysis.capacity import capacity_report
from stallscope.analysis.compute_findings import compute_findings, thread_finding
from stallscope.analysis.epochs import epoch_shape, start_method
from stallscope.analysis.failures import failure
from stallscope.analysis.findings import Analysis, LoaderSummary, Recommendation, StepStats
from stallscope.analysis.fixes import advise
from stallscope.analysis.frameworks import code_site
from stallscope.analysis.gpu_timing import gpu_timing
from stallscope.analysis.hotspots import session_hotspots, top_of_stage
from stallscope.analysis.in_order import batch_time_shape
from stallscope.analysis.model_from_run import build_model
from stallscope.analysis.operators import operators
from stallscope.analysis.over_time import over_time
from stallscope.analysis.pipeline import fetch_stages, worker_pipeline
from stallscope.analysis.pitfalls import agreeing_with, find_pitfalls
from stallscope.analysis.ranks import DistributedFindings, RankSummary
from stallscope.analysis.recommend import not_recommended, recommend
from stallscope.analysis.steps import FEW_STEADY_STEPS, epochs_of, step_stats
from stallscope.analysis.store_requests import LocalServers
from stallscope.analysis.sync import merge_intervals, overlap_ns
from stallscope.analysis.system_metrics import (
    helper_cpu_between,
    local_server_cpu_between,
    other_cores_between,
    summarize_samples,
)
from stallscope.analysis.training_process import training_process
from stallscope.constants import EVENTS_LOST_NOTE, SIGNAL_NOTE_WORDS, STARTING_S
from stallscope.environment import recorded_physical_cores, recorded_usable_cpus
from stallscope.session import LoaderRecord, RankRecord, Session


def usable_cpus(session: Session) -> int:
    """CPUs the recorded job could use (the one rule: ``environment.recorded_usable_cpus``)."""
    return recorded_usable_cpus(session.environment, session.checks)


def _loader_groups(session: Session, train_ids: tuple[int, ...]) -> list[list[LoaderRecord]]:
    """The script's loaders, in the order they were created: the training loader's DataLoaders as one
    (``train_ids``, of the training process), the others one per process and line."""
    main = session.main_pid
    groups: dict[tuple[int, str], list[LoaderRecord]] = {}
    for ld in session.loaders:
        key = (main, "train") if ld.pid == main and ld.loader_id in train_ids else (ld.pid, ld.site)
        groups.setdefault(key, []).append(ld)
    return list(groups.values())


def _loader_summaries(session: Session, train_ids: tuple[int, ...],
                      paired_ids: tuple[int, ...] = ()) -> list[LoaderSummary]:
    # loader ids are numbered per process (a spawned worker that runs the script's module code again builds a loader
    # 0 of its own): each tally is by process and id
    waits: dict[tuple[int, int], float] = defaultdict(float)
    batches: dict[tuple[int, int], int] = defaultdict(int)
    epochs: dict[tuple[int, int], set[tuple[int, int]]] = defaultdict(set)
    for n in session.nexts:
        waits[n.pid, n.loader_id] += (n.end_ns - n.start_ns) / 1e9
        batches[n.pid, n.loader_id] += 1
        epochs[n.pid, n.loader_id].add((n.iter_id, n.epoch))
    iter_start: dict[tuple[int, int], float] = defaultdict(float)
    for it in session.iters:
        iter_start[it.pid, it.loader_id] += (it.end_ns - it.start_ns) / 1e9
    summaries = []
    for group in _loader_groups(session, train_ids):
        ld = group[0]
        ids = tuple(g.loader_id for g in group)
        keys = [(ld.pid, i) for i in ids]  # a group's loaders were all built in one process
        used = sum(batches[k] for k in keys)
        if train_ids and ld.pid == session.main_pid and ids == tuple(train_ids):
            role = "train"
        elif ld.pid == session.main_pid and ld.loader_id in paired_ids:
            role = "paired"  # fed with the training loader, one batch of each per step (zip)
        else:
            role = "eval" if used else "other"
        summaries.append(LoaderSummary(
            loader_id=ld.loader_id, role=role, site=ld.site, config=ld.config, overrides=ld.overrides,
            batches=used, epochs=len(set().union(*(epochs[k] for k in keys))), wait_s=sum(waits[k] for k in keys),
            iter_start_s=sum(iter_start[k] for k in keys), pipeline=worker_pipeline(session, ids, ld.pid),
            loader_ids=ids if len(ids) > 1 else (),
            code=code_site(ld.site, ld.stack or [ld.site], ld.created_ns, ld.pid, session.framework_args),
            pid=ld.pid))
    return summaries


def _startup_in_steady(session: Session, stats: StepStats, train: LoaderSummary | None) -> float:
    """Iterator creation, stopping the workers of the epoch before, and first batches of later epochs beyond the
    usual wait, inside steady steps."""
    if train is None or not stats.steady:
        return 0.0
    t0, t1 = stats.steady[0].start_ns, stats.steady[-1].end_ns
    ids = train.ids
    spans = merge_intervals([(it.start_ns, it.end_ns) for it in session.iters
                             if it.loader_id in ids and train.pid in (None, it.pid)]
                            + [(sd.start_ns, sd.end_ns) for sd in session.shutdowns
                               if sd.loader_id in ids and sd.pid == session.main_pid])
    total = overlap_ns(spans, t0, t1) / 1e9
    if int(train.config.get("num_workers") or 0) > 0 and stats.median_wait_s is not None:
        # the first batch of each epoch after the very first: the queue filling again
        later_firsts = [batches[0] for batches in epochs_of(session, ids, train.pid).values()][1:]
        typical = stats.median_wait_s / max(1.0, sum(s.batches for s in stats.steady) / len(stats.steady))
        total += sum(max(0.0, (n.end_ns - n.start_ns) / 1e9 - typical) for n in later_firsts if t0 <= n.start_ns < t1)
    return total


def analyze(session: Session) -> Analysis:
    """The job's findings. A distributed job is analysed per rank (see ``ranks.py``); its top-level
    findings are the straggler's, or the lowest rank's when no rank holds the others back."""
    rank_records = ranks_mod.rank_processes(session)
    if len(rank_records) < 2:
        alone = dataclasses.replace(_analyze_process(session), fetch_stages=fetch_stages(session.fetches),
                                    training_process=training_process(session))
        # a merged job left with one rank (the others sent nothing) is the job, not one node waiting for the others
        return alone if session.clock_alignment else _waiting_for_other_nodes(alone, rank_records)
    cpus = usable_cpus(session)
    per_rank = ranks_mod.analyze_ranks(session, _analyze_process, cpus)
    summaries = [ranks_mod.summarize_rank(record, analysis, session) for record, analysis in per_rank.values()]
    analyses = {rank: analysis for rank, (_, analysis) in per_rank.items()}
    findings = dataclasses.replace(ranks_mod.job_findings(summaries, analyses),
                                   nodes=ranks_mod.node_rows(session, summaries))
    primary = analyses[findings.primary_rank] if findings.primary_rank is not None else _analyze_process(session)
    if findings.straggler_rank is not None:
        primary = _straggler_analysis(session, per_rank[findings.straggler_rank][0], primary, findings, summaries,
                                      cpus)
    train = next((ld for ld in primary.loaders if ld.role == "train"), None)
    extra = ranks_mod.rank_recommendations(summaries, findings, cpus,
                                           train.config.get("dataset_len") if train else None)
    recs = list(primary.recommendations)
    first = [r for r in extra if r.id == "straggler-cpus"]  # the cause itself: before the straggler's own advice
    extra = [r for r in extra if r.id != "straggler-cpus"]
    recs = first + recs + extra if findings.straggler_rank is not None else extra + recs
    workers_set = any("num_workers" in r.overrides for r in recs)  # a rank's advice may set them (workers-per-node)
    job = dataclasses.replace(
        primary, recommendations=recs,
        not_recommended=[n for n in primary.not_recommended if not (workers_set and n.id == "num-workers")],
        failure=failure(session), notes=list(session.notes), conditions=[],
        ranks=summaries, distributed=findings, fetch_stages=fetch_stages(session.fetches))
    return job if findings.straggler_rank is not None else _waiting_for_other_nodes(job, rank_records)


def _waiting_for_other_nodes(analysis: Analysis, ranks: list[RankRecord]) -> Analysis:
    """One node's session of a job that spans more: where its ranks spend ``SYNC_BOUND_AT`` or more of their step
    waiting for ranks it does not hold (and none of its own holds the others back), the pace is set elsewhere and
    no change on this node shortens the step: say so, and how to see the whole job, instead of advice for this
    node."""
    world = max((r.world_size for r in ranks), default=0)
    stats = analysis.steps
    if not ranks or len(ranks) >= world or not stats.steady or stats.sync_fraction < ranks_mod.SYNC_BOUND_AT:
        return analysis
    own = 1.0 - stats.sync_fraction
    found = advise("wait-for-other-nodes", None, facts={
        "world_size": world, "ranks_here": sorted(r.rank for r in ranks),
        "node_ranks": sorted({r.node_rank for r in ranks}), "sync_share": round(stats.sync_fraction, 4),
        "own_share": round(own, 4), "hosts": sorted({r.host for r in ranks})})
    return dataclasses.replace(analysis, recommendations=[found], not_recommended=[])


def _straggler_analysis(session: Session, record: RankRecord, analysis: Analysis, findings: DistributedFindings,
                        summaries: list[RankSummary], cpus: int) -> Analysis:
    """The straggler's analysis as the job's: where it is slow for its data (the cause is an input stage) but its
    own data wait stays under the input-bound mark, analysed as input-bound, so its advice is for its data; and
    every predicted gain held to the job's: the job runs at its slowest rank's pace, so fixing the straggler gains
    at most its step over the next slowest rank's own time."""
    if findings.straggler_stage in ranks_mod.INPUT_STAGES and analysis.verdict != "input-bound":
        per_host = sum(1 for s in summaries if s.host == record.host)
        analysis = _analyze_process(ranks_mod.rank_view(session, record.pid), max(1, cpus // per_host),
                                    verdict="input-bound")
    slow = next(s for s in summaries if s.rank == findings.straggler_rank)
    pace = max((s for s in summaries if s.rank != slow.rank and s.own_step_s), key=lambda s: s.own_step_s or 0.0,
               default=None)
    if pace is None or not slow.median_step_s or not pace.own_step_s:
        return analysis
    ceiling = slow.median_step_s / pace.own_step_s
    held = [dataclasses.replace(r, predicted_speedup=round(max(1.0, min(r.predicted_speedup, ceiling)), 2),
                                facts={**r.facts, "job_ceiling": round(ceiling, 2), "pace_rank": pace.rank,
                                       "rank_speedup": r.predicted_speedup})
            if r.predicted_speedup is not None and r.predicted_speedup > ceiling else r
            for r in analysis.recommendations]
    return dataclasses.replace(analysis, recommendations=held)


def _analyze_process(session: Session, cpus: int | None = None, verdict: str | None = None) -> Analysis:
    """One training process (``session.main_pid``) and its workers, on ``cpus`` usable CPUs; ``verdict`` where the
    job's analysis sets it (a straggler slow for its data)."""
    stats = step_stats(session)
    loaders = _loader_summaries(session, stats.loader_ids, stats.paired_loader_ids)
    train = next((ld for ld in loaders if ld.role == "train"), None)
    verdict = verdict or verdict_for(stats)
    startup = _startup_in_steady(session, stats, train)
    seconds = node_seconds(stats, train, startup)
    seconds["sync"] += stats.sync_s
    node, share = bottleneck(verdict, seconds)
    cpus = cpus or usable_cpus(session)
    system = summarize_samples(session)
    main_cpu = helper_cpu = None
    if stats.steady:
        window = (stats.steady[0].start_ns, stats.steady[-1].end_ns)
        main_cpu = session.system.cpu_between(session.main_pid, *window)
        helper_cpu = helper_cpu_between(session, session.main_pid, *window)
    # CPUs other programs kept busy during the run are not available to this job either.
    host_cpus = session.environment.get("cpu_count")
    other = 0.0
    if host_cpus == cpus:  # over the steady steps; over the whole run where no tick of them could be read
        other = (other_cores_between(session, *window) if stats.steady else None) or system.other_cores_mean or 0.0
    servers, served = None, 0.0
    if stats.steady and helper_cpu is not None:  # a store on this machine works for every request: priced per sample
        served = local_server_cpu_between(session, *window)
        if served:
            helper_cpu += served
            servers = _local_servers(session, train, served, (window[1] - window[0]) / 1e9)
            other = max(0.0, other - servers.cpus)
    on_gpu = bool(session.transfers or session.gpu_spans) or any(p.cuda_device for p in session.processes)
    usable = max(1.0, cpus - other)
    epochs = epoch_shape(session, stats, train, usable)
    warmup_share = epochs.warmup_share(int(train.pipeline.num_workers)) if epochs and train and train.pipeline else 0.0
    model = build_model(stats, train, usable, main_cpu, startup, helper_cpu,
                        compute_on_cpu=not on_gpu, bytes_per_sample=_bytes_per_sample(session, stats),
                        shm_calibration=next((c for c in session.calibrations if c.get("kind") == "shared_memory"
                                              and c.get("pid") == session.main_pid), None),
                        physical_cores=_physical_cores(session, usable), warmup_share=warmup_share,
                        batch_time_shape=batch_time_shape(session, stats, train),
                        server_cpu_s=served)
    spots = session_hotspots(session, stats.loader_ids, seconds)
    shared = bool(session.shared_connections) and train is not None and start_method(session, train.config) == "fork"
    recommendations = _with_hotspots(_in_code(recommend(verdict, stats, train, seconds, cpus, startup, model,
                                                        _unpinned_fraction(session, stats), epochs, other, shared),
                                              train), spots)
    if verdict != "input-bound" and node in ("compute", "sync"):  # inside the step: before "no input-side fix"
        inside = compute_findings(session, stats, seconds, spots)
        at = next((i for i, r in enumerate(recommendations) if r.id != "compute-threads"), len(recommendations))
        recommendations = recommendations[:at] + inside + recommendations[at:]
    else:  # a thread holding the interpreter lock slows the batches the process loads itself as much as its step
        for found in thread_finding(session, stats):
            gain = found.predicted_speedup or 1.0
            at = next((i for i, r in enumerate(recommendations) if (r.predicted_speedup or 0.0) < gain),
                      len(recommendations))
            recommendations = recommendations[:at] + [found] + recommendations[at:]
    left_out = not_recommended(verdict, train, model, recommendations, seconds, cpus, other, epochs)
    pitfalls = agreeing_with(find_pitfalls(session, loaders, system, cpus), recommendations)
    conditions = []
    lost = any(note.startswith(EVENTS_LOST_NOTE) for note in session.notes)
    if lost and not stats.steps:  # what processes wrote after the run's folder was removed: not what the job did
        conditions.append("events-lost")
    elif not session.processes:
        signalled = (any(words in note for note in session.notes for words in SIGNAL_NOTE_WORDS)
                     and session.end_ns - session.start_ns < STARTING_S * 1e9)
        conditions.append("stopped-while-starting" if signalled else "recorder-not-started")
    elif not session.loaders:
        conditions.append("no-dataloader")
    elif not stats.steps:
        conditions.append("no-training-step")
    elif len(stats.steady) < FEW_STEADY_STEPS:
        conditions.append("few-steps")
    return Analysis(
        verdict=verdict,
        data_wait_fraction=stats.data_wait_fraction,
        steps=stats,
        node_seconds=seconds,
        bottleneck_node=node,
        bottleneck_share=share,
        loaders=loaders,
        recommendations=recommendations,
        failure=failure(session),
        usable_cpus=cpus,
        notes=list(session.notes),
        conditions=conditions,
        capacity=capacity_report(model),
        pitfalls=pitfalls,
        system=system,
        gpu_timing=gpu_timing(session),
        operators=operators(session),
        hotspots=spots,
        other_cpus=other,
        local_servers=servers,
        not_recommended=left_out,
        over_time=over_time(session),
    )


def _local_servers(session: Session, train: LoaderSummary | None, cpu_s: float, window_s: float) -> LocalServers:
    """The local servers' CPU over the steady steps, and per request of the training loader where it made some."""
    requests = train.pipeline.requests if train is not None and train.pipeline is not None else None
    cpus = cpu_s / window_s if window_s > 0 else 0.0
    rate = requests.requests / requests.loading_s if requests is not None and requests.loading_s > 0 else 0.0
    names = tuple(sorted({proc.name or str(pid) for pid, proc in session.system.servers.items()}))
    return LocalServers(cpus, names, cpus / rate if rate > 0 else None)


def _physical_cores(session: Session, usable: float) -> float | None:
    """The physical cores behind ``usable`` CPUs (a rank's share, less what other programs kept busy), where the
    recorded CPUs were hardware threads of fewer cores; None where each CPU was a core of its own. A cgroup quota
    below the cores is taken to leave each busy thread a core of its own (the scheduler spreads threads over idle
    cores first); that holds while no more threads are runnable than the affinity has cores."""
    cores = recorded_physical_cores(session.checks)
    total = usable_cpus(session)
    if cores is None or total <= 0 or cores >= total:
        return None
    return cores * usable / total


def _with_hotspots(recommendations: list[Recommendation], spots: list) -> list[Recommendation]:
    """A fix of the dataset's own code carries the sites of its stage that cost the most (``hotspots``)."""
    return [dataclasses.replace(r, facts={**r.facts, "hotspots": [h.to_dict() for h in top_of_stage(spots, r.node)]})
            if r.id == "dataset-code" and top_of_stage(spots, r.node) else r for r in recommendations]


def _in_code(recommendations: list[Recommendation], train: LoaderSummary | None) -> list[Recommendation]:
    """Each ``--set`` recommendation also says where that change goes in the user's code (``in_code``)."""
    if train is None or train.code is None:
        return recommendations
    where = train.code.to_dict()
    return [dataclasses.replace(r, facts={**r.facts, "in_code": where}) if r.overrides else r
            for r in recommendations]


def _bytes_per_sample(session: Session, stats: StepStats) -> float | None:
    """Bytes of tensors per sample in the training loader's batches (its first batch of each epoch)."""
    ids = set(stats.loader_ids)
    sizes = [info["nbytes"] for info in session.batch_info
             if info.get("loader_id") in ids and isinstance(info.get("nbytes"), (int, float))]
    batches = sum(s.batches for s in stats.steady)
    if not sizes or not batches or not stats.samples:
        return None
    return sorted(sizes)[len(sizes) // 2] / (stats.samples / batches)


def _unpinned_fraction(session: Session, stats: StepStats) -> float | None:
    """The share of bytes copied to the device from pageable memory during the training steps. Copies before
    the first step (``model.to(device)``, buffers made once) are left out: a big model's weights are never
    pinned and would outweigh every batch of a short run."""
    start = stats.steps[0].start_ns if stats.steps else None
    copies = [t for t in session.transfers if start is None or t.start_ns >= start]
    total = sum(t.nbytes for t in copies)
    if not total:
        return None
    return sum(t.nbytes for t in copies if not t.pinned) / total
