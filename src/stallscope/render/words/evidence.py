"""The diagnosis in words: the evidence behind the verdict, the conditions that limited it, the notes, which
process trained, the GPU's timings and the rate."""

from __future__ import annotations

import shlex
from typing import Any

from stallscope.analysis import Analysis
from stallscope.analysis.pipeline import calls_in_step_time
from stallscope.analysis.steps import FEW_STEADY_STEPS
from stallscope.analysis.system_metrics import OTHER_LOAD_NOTABLE_CPUS
from stallscope.render.words.phrases import PART_LABELS
from stallscope.render.words.recommendations import library_words


def beside_compute(analysis: Analysis) -> str:
    """Where an input stage limits a run whose compute takes more of the step: why a smaller share is named
    (the training waits for that stage; the compute is not what a change to the input would shorten)."""
    total = sum(analysis.node_seconds.values())
    compute = analysis.node_seconds.get("compute", 0.0) / total if total > 0 else 0.0
    if analysis.bottleneck_node in (None, "compute") or compute <= analysis.bottleneck_share:
        return ""
    return (f"; the input stage the training waits for most, beside {100 * compute:.0f}% of computing, "
            "which no input change shortens")


def evidence(analysis: Analysis) -> list[str]:
    """The numbers behind the verdict and the limiting stage, one line each."""
    lines = _rank_evidence(analysis)
    stats = analysis.steps
    if stats.steady:
        lines.append(
            f"data wait is {100 * stats.data_wait_fraction:.1f}% of step time over {len(stats.steady)} steps "
            f"(median step {1000 * (stats.median_step_s or 0):.1f} ms, median wait "
            f"{1000 * (stats.median_wait_s or 0):.1f} ms)"
            + (f", including {stats.stalled_s:.1f} s blocked in a next() that never returned a batch"
               if stats.stalled_s > 0 else ""))
    seconds = analysis.node_seconds
    node = analysis.bottleneck_node
    total = sum(seconds.values())
    if node and total > 0:
        lines.append(f"{node} accounts for {100 * seconds[node] / total:.0f}% of step time "
                     f"({seconds[node]:.2f} s of {total:.2f} s)")
    train = analysis.train_loader
    pipeline = train.pipeline if train else None
    cpus = analysis.usable_cpus
    if analysis.other_cpus >= OTHER_LOAD_NOTABLE_CPUS:
        left = max(1.0, cpus - analysis.other_cpus)
        lines.append(f"other programs kept {analysis.other_cpus:.1f} of the {cpus} CPUs busy during these steps: "
                     f"this job had about {left:.1f} for itself, and its figures and advice are for a machine that "
                     "busy (compare it with runs made under the same load, or rerun on a quiet machine)")
    if pipeline is not None and pipeline.busy_s > 0:
        # of step time, each with its stage, as the stages are: a call never shows more than its stage
        top = ", ".join(f"{name} {100 * s / total:.0f}% ({stage})"
                        for name, stage, s in calls_in_step_time(pipeline, seconds)[:3]) if total > 0 else ""
        lines.append(f"loader work per batch: {1000 * (pipeline.batch_wall_median_s or 0):.1f} ms wall, "
                     f"{1000 * (pipeline.batch_cpu_median_s or 0):.1f} ms CPU; costliest calls"
                     + (f" (share of step time): {top}" if top else ": none"))
        if pipeline.num_workers > 0:
            busy = f", busy {100 * pipeline.busy_fraction:.0f}% of their time" if pipeline.busy_fraction else ""
            plural = "s" if pipeline.num_workers != 1 else ""
            lines.append(f"{pipeline.num_workers} worker{plural} on {cpus} usable CPUs{busy}")
            if pipeline.empty_queue_fraction is not None:
                lines.append(f"no batch was ready on {100 * pipeline.empty_queue_fraction:.0f}% of requests "
                             f"(mean {pipeline.queue_depth_mean:.1f} batches queued)")
        else:
            lines.append(f"num_workers=0: batches are loaded in the training process, nothing overlaps "
                         f"({cpus} usable CPUs)")
        if pipeline.blocked_s > 0.2 * pipeline.busy_s:
            lines.append(f"workers were blocked (I/O, sleeps, network) "
                         f"{100 * pipeline.blocked_s / pipeline.busy_s:.0f}% of their busy time")
        if pipeline.requests is not None:
            model = analysis.capacity.model if analysis.capacity is not None else None
            lines.append(requests_line(pipeline.requests, model.compute_rate() if model is not None else None))
            if analysis.local_servers is not None:
                lines.append(local_servers_line(analysis.local_servers))
    return lines


def requests_line(requests: Any, compute_samples_per_s: float | None) -> str:
    """A loader's HTTP requests in one line: how many, how long, how many at once, and what bounds them."""
    parts = requests.parts
    total = sum(parts.values()) or 1.0
    bound = {"latency": "the wait for the first byte", "bandwidth": "reading bodies",
             "client-cpu": "the client's own CPU"}[requests.bound]
    size = requests.bytes_per_body  # an answer's body (a HEAD has none)
    rate = requests.body_bytes_per_s
    needed = requests.needed_in_flight(compute_samples_per_s) if compute_samples_per_s else None
    failed = f"; {requests.failed:.0f} failed" if requests.failed else ""
    background = ""
    if requests.background_share >= 0.05:
        made = (f"made by {library_words(requests.library)} download threads, which the batches waited on"
                if requests.library else "made on threads the loader started (a pool in the dataset)")
        background = f"; {100 * requests.background_share:.0f}% {made}"
    often = (f"{requests.per_sample:.1f} a sample" if requests.per_sample >= 0.1 or requests.per_sample <= 0
             else f"one per {1 / requests.per_sample:.0f} samples")
    return (f"requests: {often}, {1e3 * requests.latency_s:.1f} ms to the first byte "
            f"({1e3 * requests.request_s:.1f} ms in all, "
            + (f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} KB")
            + (f" at {rate / 1e6:.0f} MB/s" if rate else "") + f"), {requests.in_flight:.1f} in flight on average"
            + (f", {needed:.1f} needed for the compute's rate" if needed and needed < 10
               else f", {needed:.0f} needed for the compute's rate" if needed else "")
            + f"; {100 * parts[requests.bound] / total:.0f}% of their time is {bound} ({requests.bound}-bound)"
            + (" (the store's limit or the client's: `stallscope doctor s3://BUCKET/PREFIX` tells them apart)"
               if requests.bound == "bandwidth" else "")
            + failed + background)


def local_servers_line(servers: Any) -> str:
    """The servers on this machine that answered the requests, and what their CPU means for the advice."""
    each = (f" ({1e3 * servers.cpu_per_request_s:.1f} ms a request)" if servers.cpu_per_request_s is not None else "")
    return (f"answered on this machine: {', '.join(servers.names)} kept {servers.cpus:.2f} CPUs busy{each}; that CPU "
            "grows with the request rate and shares the job's cores, so every prediction prices it")


def straggler_short(findings: Any) -> str:
    """``storage: +25.9 ms a step over the others``: the straggler's cause in a few words (terminal, HTML)."""
    extra = findings.straggler_differs_s.get(findings.straggler_stage)
    part = f", {PART_LABELS.get(findings.straggler_part, findings.straggler_part)}" if findings.straggler_part else ""
    cpus = getattr(findings, "straggler_cpus", None)
    short = f"; {cpus['rank']:.3g} CPUs on its node against {cpus['others']:.3g}" if cpus else ""
    if extra is None:
        return f"{findings.straggler_stage}{part}{short}"
    return f"{findings.straggler_stage}{part}: +{1000 * extra:.1f} ms a step over the others{short}"


def straggler_cause(findings: Any, summaries: list[Any]) -> str:
    """Where the straggler's own time differs from the other ranks', with its data wait against theirs; its own
    largest stage where that is another; and its node's CPUs where it has fewer than the others'."""
    said = _straggler_stage_cause(findings, summaries)
    cpus = getattr(findings, "straggler_cpus", None)
    if cpus:
        said += (f"; its node gives it {cpus['rank']:.3g} CPUs against {cpus['others']:.3g} on the others' (affinity "
                 "and cgroup quota), so all its CPU work is slower")
    return said


def _straggler_stage_cause(findings: Any, summaries: list[Any]) -> str:
    """Where the straggler's own time differs from the other ranks', with its data wait against theirs; its own
    largest stage where that is another."""
    by_rank = {s.rank: s for s in summaries}
    slow = by_rank[findings.straggler_rank]
    others = [o for o in summaries if o.rank != slow.rank]
    stage, differs = findings.straggler_stage, findings.straggler_differs_s
    waits = sorted(o.data_wait_fraction for o in others)
    theirs = f"{100 * waits[len(waits) // 2]:.0f}%" if waits else "-"
    own = f"data wait {100 * slow.data_wait_fraction:.0f}% of its step time"
    if stage not in differs:
        return f"its limiting stage is {stage} ({own})"
    if stage == findings.straggler_limit:
        return (f"its limiting stage is {stage} ({own}), and that is where it differs from the others: "
                f"+{1000 * differs[stage]:.1f} ms a step (data wait {theirs} on the others)")
    data = f"{own}, {theirs} on the others"
    said = f"it differs from the others in {stage}: +{1000 * differs[stage]:.1f} ms a step"
    if findings.straggler_part and findings.straggler_part in differs:
        label = PART_LABELS.get(findings.straggler_part, findings.straggler_part)
        said += f", most of it in {label} (+{1000 * differs[findings.straggler_part]:.1f} ms)"
    said += f" ({data})"
    limit = findings.straggler_limit
    if limit and limit not in (stage, "sync") and limit in differs:
        said += f"; its largest stage, {limit}, differs by {1000 * differs[limit]:+.1f} ms a step"
    return said


def _rank_evidence(analysis: Analysis) -> list[str]:
    findings = analysis.distributed
    summaries = analysis.ranks
    if findings is None:
        return []
    lines: list[str] = []
    by_rank = {s.rank: s for s in summaries}
    if findings.straggler_rank is not None:
        s = by_rank[findings.straggler_rank]
        others = [o for o in summaries if o.rank != s.rank]
        waits = ", ".join(f"rank {o.rank} {100 * o.sync_fraction:.0f}%" for o in others[:6])
        lines.append(f"rank {s.rank} is the straggler: {1000 * findings.straggler_extra_s:.1f} ms more of its own "
                     f"work per step than the fastest rank; {straggler_cause(findings, summaries)}")
        collective = "all-reduce" if findings.straggler_stage else "collectives"
        lines.append(f"rank {s.rank}'s {findings.straggler_stage} stalls all ranks in {collective}: "
                     f"time waiting for the others is {waits} of step time")
    elif len(summaries) > 1:
        lines.append(f"no straggler across {len(summaries)} ranks: per-step skew median "
                     f"{1000 * (findings.skew_median_s or 0):.1f} ms")
    if getattr(findings, "slowest_moves", False):
        top = sorted(findings.slowest_share.items(), key=lambda kv: -kv[1])[:4]
        said = ", ".join(f"rank {rank} in {100 * share:.0f}%" for rank, share in top)
        lines.append(f"the slowest rank moves from step to step (slowest: {said} of the steps), the ranks "
                     f"{1000 * (findings.skew_median_s or 0):.1f} ms apart at the median: uneven work per batch "
                     "(sample sizes, augmentation, a shard's files), not a slow node; even it out across ranks "
                     "(bucket by size, shuffle the shards) rather than change one node")
    return lines


NO_SAMPLES = "no system samples in this session"

CONDITIONS = {
    "recorder-not-started": "the recorder started in no process of the command: it starts through the "
                            "sitecustomize that stallscope puts on PYTHONPATH, which python -I, -E and -S ignore, "
                            "as do Pythons older than 3.10 and those of another version without stallscope installed",
    "stopped-while-starting": "nothing was measured: the signal (see the note) reached the script while Python was "
                              "starting, before the recorder started in it",
    "events-lost": "nothing was measured: the run's folder, and the events recorded in it, were removed while "
                   "the job ran (see the note)",
    "no-dataloader": "no torch DataLoader was created: stallscope measures DataLoader-fed training",
    "no-training-step": "no training step was recorded: none completed, or the script was killed before the "
                        "recorder wrote its last records (it writes them every second or so)",
    "few-steps": f"fewer than {FEW_STEADY_STEPS} steady steps were measured (after the warm-up and the workers' first "
                 "round): too few for the figures and the predictions to act on; record a run of more steps (more "
                 "data or epochs, or a larger --steps where one was given)",
}


#: How much of a process's command line is said (a launcher's child can carry a long list of options).
COMMAND_CHARS = 80


def _process_command(argv: list[str]) -> str:
    said = "python " + shlex.join(argv) if argv else "command not recorded"
    return said if len(said) <= COMMAND_CHARS else said[:COMMAND_CHARS - 3] + "..."


def training_process(tp: Any) -> list[str]:
    """Which process trained, where it is not the launched script itself, and the other processes that trained
    (``analysis.training_process.TrainingProcess``); nothing where the script trained alone."""
    if tp is None:
        return []
    lines = []
    if not tp.launched:
        started = ("which the script started" if tp.depth == 1 else
                   f"started by the script through {tp.depth - 1} process{'es' if tp.depth > 2 else ''} between"
                   if tp.depth else "started by the script")
        lines.append(f"training ran in process {tp.pid} ({_process_command(tp.argv)}), {started}: these figures "
                     "are that process's")
    for other in tp.others:
        done = f"{other.steps} steps" if other.steps else f"{other.batches} batches"
        who = "the script's own process" if other.pid == tp.launched_pid else "process"
        lines.append(f"{who} {other.pid} ({_process_command(other.argv)}) also trained ({done}): not in these "
                     f"figures, which are of process {tp.pid} ({tp.steps or tp.batches} "
                     f"{'steps' if tp.steps else 'batches'})")
    return lines


def notes(analysis: Analysis) -> list[str]:
    """The session's own notes, then what limited the analysis."""
    return list(analysis.notes) + [CONDITIONS.get(c, c) for c in analysis.conditions]


def gpu_timing(g: Any) -> str:
    """The CUDA-event timings in one sentence."""
    parts = []
    if g.steps:
        parts.append(f"GPU (CUDA events, {g.steps} steps): busy {g.busy_ms_median:.1f} ms per step, idle "
                     f"{g.idle_ms_median:.1f} ms between steps ({100 * g.idle_fraction:.0f}% of its timeline idle)")
    if g.h2d_copies:
        rate = f" at {g.h2d_gb_per_s:.1f} GB/s" if g.h2d_gb_per_s else ""
        parts.append(f"host-to-device: {g.h2d_copies} copies, {g.h2d_bytes / 1e6:.1f} MB in {g.h2d_ms:.1f} ms{rate}")
    return "; ".join(parts)


def rate(analysis: Analysis) -> str:
    """The steady throughput: steps/s, and samples/s where batches have a size."""
    text = f"{analysis.steps_per_s:.2f} steps/s"
    if analysis.samples_per_s is not None:
        text += f", {analysis.samples_per_s:.1f} samples/s"
    return text


def recording(recorded: dict[str, Any] | None) -> str | None:
    """How a long run was kept (``render.summary.recording_dict``), in one line; None where nothing was folded."""
    if not recorded:
        return None
    kept = recorded.get("kept_windows", {})
    anomalies = kept.get("anomaly", 0)
    which = "its first and last stretches" + (
        f", and {anomalies} stretch{'es' if anomalies > 1 else ''} with an anomaly: an epoch start, a slow step, a "
        "stall, an error" if anomalies else "")
    return (f"long run: {recorded['steps_in_detail']:,} steps recorded in detail ({which}), the figures "
            f"above rest on them; {recorded['steps_folded']:,} steps over {recorded['folded_s'] / 60:.1f} min between "
            f"were folded into {recorded['window_s']:g}-second windows, counted in the steps and the over-time figures")


def operators(ops: Any, shown: int = 3) -> list[str]:
    """The profiler window's top operators under the limiting stage: one line of how, then one per operator."""
    on_device = ops.self_device_s > 0
    lines = [f"operators (torch.profiler over {ops.steps} steps, left out of the figures; it cost "
             f"{ops.cost_s:.2f} s): by self {'device' if on_device else 'CPU'} time"]
    for op in ops.top[:shown]:
        share = op.share_of_device if on_device else op.share_of_cpu
        lines.append(f"  {op.name}  {100 * share:.0f}% ({PART_LABELS.get(op.part, op.part)}, {op.calls} calls)")
    return lines
