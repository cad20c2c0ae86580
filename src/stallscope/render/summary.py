"""The summary JSON of ``run --json`` (schema ``stallscope.summary/1``; see PRODUCT.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from stallscope.analysis import Analysis, shares
from stallscope.analysis.findings import LoaderSummary, StepStats
from stallscope.analysis.ranks import job_of
from stallscope.constants import NODE_IDS, SUMMARY_SCHEMA
from stallscope.paths import write_file
from stallscope.render import words
from stallscope.render.words import failures
from stallscope.render.words import over_time as over_time_words
from stallscope.session import Session


def _run_samples(stats: StepStats) -> int | None:
    """The run's samples: those of its recorded steps, or where records were folded, those its windows counted."""
    if stats.window_steps is not None:
        return stats.window_samples
    if not stats.steps or any(s.samples is None for s in stats.steps):
        return None
    return sum(s.samples or 0 for s in stats.steps)


def recording_dict(session: Session, stats: StepStats) -> dict[str, Any] | None:
    """How a long run was kept (``folding.py``): the window, the time whose records were folded into per-window
    figures and the steps counted there; None where nothing was folded."""
    folded = session.recording.get("folded") or []
    if not folded:
        return None
    return {"window_s": session.recording.get("window_ns", 0) / 1e9,
            "folded_s": round(sum(b - a for a, b in folded) / 1e9, 3),
            "folded_spans": len(folded), "steps_folded": stats.folded_steps,
            "steps_in_detail": len(stats.steps), "kept_windows": session.recording.get("kept_windows", {})}


def over_time_dict(session: Session, analysis: Analysis) -> dict[str, Any] | None:
    """The run's windows (throughput, data wait, memory) and what changed over them, with its words."""
    found = analysis.over_time
    if found is None:
        return None
    origin = session.start_ns
    windows = [{"start_s": round((w.start_ns - origin) / 1e9, 3), "steps": w.steps,
                "steps_per_s": round(w.steps_per_s, 4) if w.steps_per_s is not None else None,
                "data_wait_fraction": round(w.data_wait_fraction, 4) if w.data_wait_fraction is not None else None,
                "rss_mib": round(w.rss_bytes / 2**20, 1) if w.rss_bytes is not None else None,
                "workers_mib": round(w.workers_rss_bytes / 2**20, 1) if w.workers_rss_bytes is not None else None,
                "batch_kib": round(w.batch_bytes / 1024, 2) if w.batch_bytes is not None else None}
               for w in found.windows]
    change = None
    if found.change is not None:
        c = found.change
        change = {"direction": c.direction, "ratio": round(c.ratio, 4),
                  "began_s": round((c.began_ns - origin) / 1e9, 3),
                  "early_steps_per_s": round(c.early_steps_per_s, 4), "late_steps_per_s": round(c.late_steps_per_s, 4),
                  "part": c.part, "cause": c.cause,
                  "per_step_ms": {k: [round(a, 4), round(b, 4)] for k, (a, b) in c.per_step_ms.items()},
                  "evidence": {k: list(v) for k, v in c.evidence.items()},
                  "said": over_time_words.change(c, origin)}
    memory = [{"who": m.who, "early_mib": round(m.early_bytes / 2**20, 1), "late_mib": round(m.late_bytes / 2**20, 1),
               "began_s": round((m.began_ns - origin) / 1e9, 3), "said": over_time_words.memory(m, origin)}
              for m in found.memory]
    pauses = None
    if found.gc_pauses is not None:
        g = found.gc_pauses
        pauses = {"early_ms": round(g.early_ms, 3), "late_ms": round(g.late_ms, 3),
                  "began_s": round((g.began_ns - origin) / 1e9, 3), "said": over_time_words.gc_pauses(g, origin)}
    return {"window_s": found.window_s, "windows": windows, "change": change, "memory_growth": memory,
            "gc_pauses": pauses}


def summary_dict(session: Session, analysis: Analysis, session_path: str | os.PathLike[str] | None) -> dict[str, Any]:
    stats = analysis.steps
    return {
        "schema": SUMMARY_SCHEMA,
        "exit_code": session.exit_code,
        "ended_by": session.ended_by,
        "steps": stats.run_steps,
        "steady_steps": len(stats.steady),
        "step_boundary": stats.boundary,
        "samples": _run_samples(stats),
        "wall_s": round(session.wall_s, 4),
        "verdict": analysis.verdict,
        "data_wait_fraction": round(analysis.data_wait_fraction, 4),
        "throughput": {
            "steps_per_s": round(analysis.steps_per_s, 4),
            "samples_per_s": round(analysis.samples_per_s, 3) if analysis.samples_per_s is not None else None,
        },
        "recording": recording_dict(session, stats),
        "over_time": over_time_dict(session, analysis),
        "step_time_s": {"median": stats.median_step_s, "p90": stats.p90_step_s, "first": stats.first_step_s},
        "receive_s": {"wall": round(stats.unpickle_s, 4), "cpu": round(stats.unpickle_cpu_s, 4)},
        "bottleneck": {
            "node": analysis.bottleneck_node,
            "share": round(analysis.bottleneck_share, 4),
            "evidence": words.evidence(analysis),
        },
        "nodes": _nodes_dict(analysis.node_seconds, compute_parts=_parts_dict(stats),
                             storage_requests=_storage_requests_dict(analysis)),
        "recommendations": [_recommendation_dict(r) for r in analysis.recommendations],
        "not_recommended": [_not_recommended_dict(n) for n in analysis.not_recommended],
        "hotspots": [h.to_dict() for h in analysis.hotspots],
        # the profiler window: top operators by part, its steps (left out of the figures) and its cost
        "operators": ({**analysis.operators.to_dict(), "steps_left_out": stats.profiled_steps}
                      if analysis.operators is not None else None),
        "loaders": [_loader_dict(ld) for ld in analysis.loaders],
        "capacity": _capacity_dict(analysis.capacity),
        "pitfalls": [_pitfall_dict(p) for p in analysis.pitfalls],
        "system": _system_dict(analysis.system),
        "overrides": session.overrides,
        "failure": _failure_dict(analysis.failure),
        "usable_cpus": analysis.usable_cpus,
        "notes": words.notes(analysis),
        "run_id": session.run_id,
        "session": str(session_path) if session_path else None,
        "ranks": [_rank_dict(r) for r in analysis.ranks],
        "distributed": _distributed_dict(analysis.distributed),
        # the job a session of ranks belongs to; a merged one's nodes and the ranks that sent nothing
        "job": job_of(session),
        "gpu_timing": dataclasses.asdict(analysis.gpu_timing) if analysis.gpu_timing else None,
        # which process the figures are of: the script itself (launched) or one it started, and others that trained
        "training_process": dataclasses.asdict(analysis.training_process) if analysis.training_process else None,
    }


def _nodes_dict(seconds: dict[str, float], compute_parts: dict[str, Any] | None = None,
                storage_requests: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    share = shares(seconds)
    nodes: dict[str, dict[str, Any]] = {
        node: {"seconds": round(seconds.get(node, 0.0), 4), "share": round(share.get(node, 0.0), 4)}
        for node in NODE_IDS}
    if compute_parts is not None:
        nodes["compute"]["parts"] = compute_parts
    if storage_requests is not None:
        nodes["storage"]["requests"] = storage_requests
    return nodes


def _storage_requests_dict(analysis: Any) -> dict[str, Any] | None:
    """The training loader's requests (an object store), with those the compute's rate would need in flight."""
    train = next((ld for ld in analysis.loaders if ld.role == "train"), None)
    if train is None or train.pipeline is None or train.pipeline.requests is None:
        return None
    model = analysis.capacity.model if analysis.capacity is not None else None
    said = train.pipeline.requests.to_dict(model.compute_rate() if model is not None else None)
    servers = getattr(analysis, "local_servers", None)
    said["local_servers"] = servers.to_dict() if servers is not None else None
    return said


def _parts_dict(stats: Any) -> dict[str, Any] | None:
    """Compute's parts (forward, backward, optimizer, step_code): seconds, share of compute, mean ms per step."""
    if stats.parts_s is None:
        return None
    compute = sum(stats.parts_s.values())
    steps = len(stats.steady)
    return {name: {"seconds": round(value, 4), "share_of_compute": round(value / compute, 4) if compute > 0 else 0.0,
                   "per_step_ms": round(1e3 * value / steps, 3) if steps else None}
            for name, value in stats.parts_s.items()}


def _recommendation_dict(r: Any) -> dict[str, Any]:
    said = words.recommendation(r)
    return {"id": r.id, "node": r.node, "title": said.title, "change": said.change,
            "predicted_speedup": r.predicted_speedup, "reason": said.reason, "overrides": dict(r.overrides),
            "facts": _plain(r.facts)}


def _not_recommended_dict(n: Any) -> dict[str, Any]:
    """A likely fix left out, and why: ``cause`` is the reason's id, ``reason`` its words."""
    said = words.not_recommended(n)
    return {"id": n.id, "node": n.node, "title": said.title, "cause": n.cause, "reason": said.reason,
            "facts": _plain(n.facts)}


def _pitfall_dict(p: Any) -> dict[str, Any]:
    said = words.pitfall(p)
    return {"id": p.id, "node": p.node, "title": said.title, "evidence": said.evidence, "fix": said.fix,
            "facts": _plain(p.facts)}


def _failure_dict(f: Any) -> dict[str, Any] | None:
    if f is None:
        return None
    return {**dataclasses.asdict(f), "message": failures.failure_message(f)}


def _plain(value: Any) -> Any:
    """Facts as JSON: mapping keys as strings, floats rounded."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return _rounded(value, 6)


def _rank_dict(r: Any) -> dict[str, Any]:
    return {
        "rank": r.rank, "local_rank": r.local_rank, "node_rank": r.node_rank, "host": r.host, "pid": r.pid,
        "verdict": r.verdict,
        "bottleneck": {"node": r.bottleneck_node, "share": round(r.bottleneck_share, 4)},
        "data_wait_fraction": round(r.data_wait_fraction, 4), "sync_fraction": round(r.sync_fraction, 4),
        "steps": r.steps, "steps_per_s": round(r.steps_per_s, 4),
        "samples_per_s": round(r.samples_per_s, 3) if r.samples_per_s is not None else None,
        "median_step_s": r.median_step_s, "own_step_s": r.own_step_s,
        "nodes": _nodes_dict(r.node_seconds),
        "num_workers": r.num_workers, "sampler": r.sampler, "failed": r.failed, "node_cpus": r.node_cpus,
    }


def _distributed_dict(d: Any) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "world_size": d.world_size, "hosts": d.hosts, "primary_rank": d.primary_rank,
        "straggler": None if d.straggler_rank is None else {
            "rank": d.straggler_rank, "node": d.straggler_stage, "part": d.straggler_part,
            "limiting_node": d.straggler_limit, "verdict": d.straggler_verdict,
            "extra_s_per_step": round(d.straggler_extra_s, 6), "differs_s_per_step": d.straggler_differs_s,
            "cpus": d.straggler_cpus},
        "sync_fraction_by_rank": {str(k): v for k, v in d.waiting.items()},
        "slowest_share_by_rank": {str(k): v for k, v in d.slowest_share.items()},
        "slowest_moves": d.slowest_moves,
        "nodes": d.nodes,
        "skew_s": {"median": d.skew_median_s, "p90": d.skew_p90_s},
        "step_skew_s": d.step_skew_s,
    }


def _loader_dict(ld: LoaderSummary) -> dict[str, Any]:
    p = ld.pipeline
    pipeline = None
    if p is not None:
        node_total = sum(p.node_s.values())
        pipeline = {
            "num_workers": p.num_workers,
            "batches": p.batches,
            "call_timed_batches": p.call_timed_batches if p.call_timed_batches is not None else p.batches,
            "busy_s": round(p.busy_s, 4),
            "node_seconds": {k: round(v, 4) for k, v in p.node_s.items()},
            "node_seconds_over_busy": round(node_total / p.busy_s, 4) if p.busy_s > 0 else None,
            "direct_call_fraction": round(p.direct_s / p.busy_s, 4) if p.busy_s > 0 else None,
            "cpu_s": round(p.cpu_s, 4),
            "blocked_s": round(p.blocked_s, 4),
            "runqueue_s": round(p.runqueue_s, 4) if p.runqueue_s is not None else None,
            "by_call_s": {k: round(v, 4) for k, v in list(p.by_call.items())[:12]},
            "call_nodes": {k: p.call_node[k] for k in list(p.by_call)[:12] if k in p.call_node},  # each call's stage
            "batch_wall_median_s": p.batch_wall_median_s,
            "worker_startup_s": [round(v, 4) for v in p.startup_s],
            "worker_busy_fraction": round(p.busy_fraction, 4) if p.busy_fraction is not None else None,
            "queue_depth_mean": round(p.queue_depth_mean, 3) if p.queue_depth_mean is not None else None,
            "empty_queue_fraction": round(p.empty_queue_fraction, 4) if p.empty_queue_fraction is not None else None,
            "pin_memory_thread_s": round(p.pin_s, 4),
            "worker_errors": p.errors,
            "requests": p.requests.to_dict() if p.requests is not None else None,
        }
    return {"id": ld.loader_id, "loader_ids": list(ld.ids), "role": ld.role, "site": ld.site,
            "code": ld.code.to_dict() if ld.code else None, "config": ld.config, "overrides": ld.overrides,
            "batches": ld.batches, "epochs": ld.epochs, "wait_s": round(ld.wait_s, 4),
            "iter_start_s": round(ld.iter_start_s, 4), "pipeline": pipeline}


def _rounded(value: Any, digits: int = 3) -> Any:
    if isinstance(value, float):
        return round(value, digits) if value != float("inf") else None
    return value


def _capacity_dict(report: Any) -> dict[str, Any] | None:
    if report is None or report.model is None:
        return None
    model = report.model
    return {
        "stage_samples_per_s": {k: _rounded(v, 2) for k, v in report.stage_samples_per_s.items()},
        "pipeline_samples_per_s": _rounded(report.pipeline_samples_per_s, 2),
        "compute_samples_per_s": _rounded(model.compute_rate(), 2),
        "predicted_samples_per_s": _rounded(report.predicted_samples_per_s, 2),
        "measured_samples_per_s": _rounded(model.measured_samples_per_s, 2),
        "cost_ms_per_sample": {k: round(1000 * v, 4) for k, v in model.cost_s.items()},
        "workers": model.workers,
        "cpu_budget_samples_per_s": _rounded(model.cpu_rate(), 2),
        "training_process_cpu_ms_per_sample": round(1000 * model.main_cpu_per_sample_s, 4),
        "receive_ms_per_sample": round(1000 * model.receive_per_sample_s, 4),
        "worker_only_ms_per_sample": {"shared_memory_write": round(1000 * model.shm_write_per_sample_s, 4),
                                      "shared_memory_read": round(1000 * model.shm_read_s(), 4),  # as priced
                                      "basis": model.worker_only_basis},
        "usable_cpus": round(model.usable_cpus, 3),  # less what other programs kept busy
        "physical_cores": _rounded(model.physical_cores, 3),  # null: each CPU a core of its own
        # a CPU second under the run's own load against one busy thread (estimated); other worker counts are priced
        # against it: null where the model has no load pricing
        "recorded_load_cost": _rounded(model.recorded_load_cost, 4),
        # the same for the training process's own work, which pays more for sharing its core
        "recorded_compute_load_cost": _rounded(
            model.recorded_compute_load_cost if model.compute_priced_apart else None, 4),
        # the share of the time the training computed on the CPU beside busy workers (0 without workers): what
        # made their CPU seconds dearer (COMPUTE_NEIGHBOUR_COST); other configurations are priced against it
        "recorded_computing_share": _rounded(model.recorded_computing_share, 4),
    }


def _system_dict(system: Any) -> dict[str, Any] | None:
    if system is None:
        return None
    data = dataclasses.asdict(system)
    if not system.present:
        data["absent"] = {"samples": words.NO_SAMPLES, **data["absent"]}
    return {k: _rounded(v, 3) if not isinstance(v, list) else v for k, v in data.items()}


def print_json(document: dict[str, Any]) -> None:
    """``--json -``: the document on standard output; a reader that stops early (``| head``) is not an error."""
    try:
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader has what it wanted: later writes (and Python's exit flush) go nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def write_summary(path: str | os.PathLike[str], summary: dict[str, Any]) -> Path:
    """The summary JSON at ``path`` (``paths.write_file``: no half-written file on a full disk)."""
    return write_file(path, json.dumps(summary, indent=2))
