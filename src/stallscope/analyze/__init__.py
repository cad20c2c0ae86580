"""Pure functions from a Session to findings. Nothing here imports the recorder or renders text."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from stallscope.analyze import ranks as ranks_mod
from stallscope.analyze.attribution import bottleneck, node_seconds, verdict_for
from stallscope.analyze.capacity import build_model, capacity_report
from stallscope.analyze.gpu_timing import gpu_timing
from stallscope.analyze.findings import Analysis, Failure, LoaderSummary, StepStats
from stallscope.analyze.pipeline import worker_pipeline
from stallscope.analyze.pitfalls import find_pitfalls
from stallscope.analyze.recommend import recommend
from stallscope.analyze.steps import step_stats
from stallscope.analyze.system_metrics import helper_cpu_between, process_cpu_between, summarize_samples
from stallscope.session import Session

__all__ = ["Analysis", "analyze", "usable_cpus"]


def usable_cpus(session: Session) -> int:
    """CPUs the job may use: the doctor's figure (affinity and cgroup quota) when it ran, else affinity."""
    for check in session.checks:
        usable = (check.get("data") or {}).get("usable") if check.get("id") == "cpu.usable" else None
        if isinstance(usable, (int, float)) and usable > 0:
            return max(1, int(usable))
    env = session.environment
    return int(env.get("cpus_affinity") or env.get("cpu_count") or 1)


def _loader_summaries(session: Session, train_id: int | None) -> list[LoaderSummary]:
    waits: dict[int, float] = defaultdict(float)
    batches: dict[int, int] = defaultdict(int)
    epochs: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for n in session.nexts:
        waits[n.loader_id] += (n.end_ns - n.start_ns) / 1e9
        batches[n.loader_id] += 1
        epochs[n.loader_id].add((n.iter_id, n.epoch))
    iter_start: dict[int, float] = defaultdict(float)
    for it in session.iters:
        iter_start[it.loader_id] += (it.end_ns - it.start_ns) / 1e9
    summaries = []
    for ld in session.loaders:
        role = "train" if ld.loader_id == train_id else ("eval" if batches[ld.loader_id] else "other")
        summaries.append(LoaderSummary(
            loader_id=ld.loader_id, role=role, site=ld.site, config=ld.config, overrides=ld.overrides,
            batches=batches[ld.loader_id], epochs=len(epochs[ld.loader_id]), wait_s=waits[ld.loader_id],
            iter_start_s=iter_start[ld.loader_id], pipeline=worker_pipeline(session, ld.loader_id)))
    return summaries


def _startup_in_steady(session: Session, stats: StepStats, train: LoaderSummary | None) -> float:
    """Iterator creation, and first batches of later epochs beyond the usual wait, inside steady steps."""
    if train is None or not stats.steady:
        return 0.0
    t0, t1 = stats.steady[0].start_ns, stats.steady[-1].end_ns
    total = sum(max(0, min(it.end_ns, t1) - max(it.start_ns, t0)) for it in session.iters
                if it.loader_id == train.loader_id) / 1e9
    if int(train.config.get("num_workers") or 0) > 0 and stats.median_wait_s is not None:
        first_of_epoch: dict[tuple[int, int], int] = {}
        for n in session.nexts:
            if n.loader_id == train.loader_id:
                first_of_epoch.setdefault((n.iter_id, n.epoch), n.start_ns)
        typical = stats.median_wait_s / max(1.0, sum(s.batches for s in stats.steady) / len(stats.steady))
        for n in session.nexts:
            if n.loader_id == train.loader_id and first_of_epoch.get((n.iter_id, n.epoch)) == n.start_ns \
                    and t0 <= n.start_ns < t1 and (n.iter_id, n.epoch) != (0, 0):
                total += max(0.0, (n.end_ns - n.start_ns) / 1e9 - typical)
    return total


def _failure(session: Session) -> Failure | None:
    worker_errors = [e for e in session.errors if e.where == "worker"]
    main_errors = [e for e in session.errors if e.where == "main"]
    if worker_errors:
        e = worker_errors[0]
        return Failure("worker", e.type, e.message, e.location, e.loader_id, e.worker)
    if main_errors:
        e = main_errors[0]
        return Failure("main", e.type, e.message, e.location)
    if session.exit_code != 0:
        return Failure("main", "exit", f"the script exited with code {session.exit_code}", None)
    return None


def _evidence(stats: StepStats, train: LoaderSummary | None, seconds: dict[str, float], node: str | None,
              cpus: int) -> list[str]:
    lines: list[str] = []
    if stats.steady:
        lines.append(
            f"data wait is {100 * stats.data_wait_fraction:.1f}% of step time over {len(stats.steady)} steps "
            f"(median step {1000 * (stats.median_step_s or 0):.1f} ms, median wait "
            f"{1000 * (stats.median_wait_s or 0):.1f} ms)")
    total = sum(seconds.values())
    if node and total > 0:
        lines.append(f"{node} accounts for {100 * seconds[node] / total:.0f}% of step time "
                     f"({seconds[node]:.2f} s of {total:.2f} s)")
    pipeline = train.pipeline if train else None
    if pipeline is not None and pipeline.busy_s > 0:
        top = ", ".join(f"{name} {100 * s / pipeline.busy_s:.0f}%" for name, s in list(pipeline.by_call.items())[:3])
        lines.append(f"loader work per batch: {1000 * (pipeline.batch_wall_median_s or 0):.1f} ms wall, "
                     f"{1000 * (pipeline.batch_cpu_median_s or 0):.1f} ms CPU; costliest calls: {top or 'none'}")
        if pipeline.num_workers > 0:
            busy = f", busy {100 * pipeline.busy_fraction:.0f}% of their time" if pipeline.busy_fraction else ""
            plural = "s" if pipeline.num_workers != 1 else ""
            lines.append(f"{pipeline.num_workers} worker{plural} on {cpus} usable CPUs{busy}")
            if pipeline.empty_queue_fraction is not None:
                lines.append(f"no batch was ready on {100 * pipeline.empty_queue_fraction:.0f}% of requests "
                             f"(mean {pipeline.queue_depth_mean:.1f} batches queued)")
        else:
            lines.append(f"num_workers=0: batches are loaded in the training process, nothing overlaps ({cpus} usable CPUs)")
        if pipeline.blocked_s > 0.2 * pipeline.busy_s:
            lines.append(f"workers were blocked (I/O, sleeps, network) {100 * pipeline.blocked_s / pipeline.busy_s:.0f}% "
                         "of their busy time")
    return lines


def analyze(session: Session) -> Analysis:
    """The job's findings. A distributed job is analysed per rank (see ``ranks.py``); its top-level
    findings are the straggler's, or the lowest rank's when no rank holds the others back."""
    rank_records = ranks_mod.rank_processes(session)
    if len(rank_records) < 2:
        return _analyze_process(session)
    cpus = usable_cpus(session)
    per_rank = ranks_mod.analyze_ranks(session, _analyze_process, cpus)
    summaries = [ranks_mod.summarize_rank(record, analysis, session) for record, analysis in per_rank.values()]
    analyses = {rank: analysis for rank, (_, analysis) in per_rank.items()}
    findings = ranks_mod.job_findings(summaries, analyses)
    primary = analyses[findings.primary_rank] if findings.primary_rank is not None else _analyze_process(session)
    train = next((ld for ld in primary.loaders if ld.role == "train"), None)
    extra = ranks_mod.rank_recommendations(summaries, findings, cpus,
                                           train.config.get("dataset_len") if train else None)
    recs = list(primary.recommendations)
    recs = recs + extra if findings.straggler_rank is not None else extra + recs
    return dataclasses.replace(
        primary, evidence=ranks_mod.rank_evidence(findings, summaries) + primary.evidence, recommendations=recs,
        failure=_failure(session), notes=list(session.notes), ranks=summaries, distributed=findings)


def _analyze_process(session: Session, cpus: int | None = None) -> Analysis:
    """One training process (``session.main_pid``) and its workers, on ``cpus`` usable CPUs."""
    stats = step_stats(session)
    loaders = _loader_summaries(session, stats.loader_id)
    train = next((ld for ld in loaders if ld.role == "train"), None)
    verdict = verdict_for(stats)
    startup = _startup_in_steady(session, stats, train)
    seconds = node_seconds(stats, train, startup)
    seconds["sync"] += stats.sync_s
    node, share = bottleneck(verdict, seconds)
    cpus = cpus or usable_cpus(session)
    system = summarize_samples(session)
    main_cpu = helper_cpu = None
    if stats.steady:
        window = (stats.steady[0].start_ns, stats.steady[-1].end_ns)
        main_cpu = process_cpu_between(session, session.main_pid, *window)
        helper_cpu = helper_cpu_between(session, session.main_pid, *window)
    # CPUs other programs kept busy during the run are not available to this job either.
    host_cpus = session.environment.get("cpu_count")
    other = system.other_cores_mean if host_cpus == cpus and system.other_cores_mean else 0.0
    model = build_model(stats, train, max(1.0, cpus - other), main_cpu, startup, helper_cpu)
    pitfalls = find_pitfalls(session, loaders, system, cpus)
    notes = list(session.notes)
    if not session.loaders:
        notes.append("no torch DataLoader was created: stallscope measures DataLoader-fed training")
    elif not stats.steps:
        notes.append("no training step completed")
    return Analysis(
        verdict=verdict,
        data_wait_fraction=stats.data_wait_fraction,
        steps=stats,
        node_seconds=seconds,
        bottleneck_node=node,
        bottleneck_share=share,
        evidence=_evidence(stats, train, seconds, node, cpus),
        loaders=loaders,
        recommendations=recommend(verdict, stats, train, seconds, cpus, startup, model,
                                  _unpinned_fraction(session)),
        failure=_failure(session),
        usable_cpus=cpus,
        notes=notes,
        capacity=capacity_report(model),
        pitfalls=pitfalls,
        system=system,
        gpu_timing=gpu_timing(session),
    )


def _unpinned_fraction(session: Session) -> float | None:
    total = sum(t.nbytes for t in session.transfers)
    if not total:
        return None
    return sum(t.nbytes for t in session.transfers if not t.pinned) / total
