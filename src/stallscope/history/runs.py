"""A run as the history keeps it: one row of figures per run, built from its Session and Analysis.

``RunRow`` is plain data: the history's SQLite table stores it (``store.py``), ``compare`` tests the
differences between rows, and the renderers print them. Rates and shares of a run without steady
steps are unknown (``None``), never 0. The per-step durations of the steady steps are kept
(thinned to at most ``MAX_KEPT_STEPS``) so ``compare`` can tell a real change from run-to-run noise
without the session files.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from stallscope.analysis import Analysis
from stallscope.analysis.ranks import job_of
from stallscope.environment import fingerprint_hash, git_commit
from stallscope.session import Session

MAX_KEPT_STEPS = 2000


@dataclass(frozen=True)
class RunRow:
    """One run of the history, as stored."""
    run_id: str
    recorded_at: float
    started_wall: float | None
    command: list[str]
    cwd: str | None
    overrides: dict[str, Any]
    environment: dict[str, Any]
    env_fingerprint: str | None
    git_commit: str | None
    exit_code: int | None
    ended_by: str | None
    verdict: str | None
    bottleneck: str | None
    steps: int | None
    steady_steps: int | None
    wall_s: float | None
    step_median_s: float | None
    step_p90_s: float | None
    steps_per_s: float | None
    samples_per_s: float | None
    data_wait_fraction: float | None
    node_seconds: dict[str, float]
    gpu_util_mean: float | None
    peak_device_mem_bytes: int | None
    peak_rss_bytes: int | None
    step_detail: dict[str, list[Any]]
    session_path: str | None

    @property
    def step_durations_s(self) -> list[float]:
        return [v / 1e6 for v in self.step_detail.get("duration_us", [])]

    @property
    def step_wait_fractions(self) -> list[float]:
        durations = self.step_detail.get("duration_us", [])
        waits = self.step_detail.get("wait_us", [])
        return [w / d if d > 0 else 0.0 for d, w in zip(durations, waits)]


def _thin(values: list[Any], limit: int = MAX_KEPT_STEPS) -> list[Any]:
    """Evenly spaced subset: keeps the shape of a long run's distribution at a bounded size."""
    if len(values) <= limit:
        return list(values)
    return [values[i * len(values) // limit] for i in range(limit)]


def step_detail(analysis: Analysis) -> dict[str, Any]:
    """Steady-step samples for compare's bootstrap, per-rank figures of a distributed job, and the CPUs other
    programs kept busy over the steady steps (where the sampler read them): a run beside a busy neighbour is slower
    for a reason of the machine's, which compare says. Kept in this JSON column so older histories read as before."""
    steady = analysis.steps.steady
    detail: dict[str, Any] = {
        "duration_us": _thin([round(s.duration_ns / 1000) for s in steady]),
        "wait_us": _thin([round(s.wait_ns / 1000) for s in steady]),
        "samples": _thin([s.samples for s in steady]),
    }
    if len(analysis.ranks) > 1:
        detail["ranks"] = [{"rank": r.rank, "steps_per_s": r.steps_per_s, "data_wait_fraction": r.data_wait_fraction,
                            "sync_fraction": r.sync_fraction, "verdict": r.verdict, "bottleneck": r.bottleneck_node}
                           for r in analysis.ranks]
    if steady and analysis.system.present:
        detail["other_cpus"] = round(analysis.other_cpus, 2)
    return detail


def _if_measured(value: float | None, measured: bool) -> float | None:
    """Rates and shares of a run without steady steps are unknown (null), never 0."""
    return value if measured and value is not None else None


def row_values(session: Session, analysis: Analysis, session_path: str | os.PathLike[str] | None,
               commit: str | None) -> dict[str, Any]:
    stats = analysis.steps
    measured = bool(stats.steady) and stats.wall_s > 0
    return {
        "run_id": session.run_id,
        "recorded_at": time.time(),
        "started_wall": session.started_wall,
        "command": list(session.command),
        "cwd": session.cwd,
        "overrides": dict(session.overrides),
        "environment": {**session.environment, **_job_words(session)},
        "env_fingerprint": fingerprint_hash(session.environment),
        "git_commit": commit,
        "exit_code": session.exit_code,
        "ended_by": session.ended_by,
        "verdict": analysis.verdict,
        "bottleneck": analysis.bottleneck_node,
        "steps": stats.run_steps,
        "steady_steps": len(stats.steady),
        "wall_s": session.wall_s,
        "step_median_s": stats.median_step_s,
        "step_p90_s": stats.p90_step_s,
        "steps_per_s": _if_measured(analysis.steps_per_s, measured),
        "samples_per_s": _if_measured(analysis.samples_per_s, measured),
        "data_wait_fraction": _if_measured(analysis.data_wait_fraction, measured),
        "node_seconds": dict(analysis.node_seconds) if measured else {},
        "gpu_util_mean": session.system.gpu_util_mean(),
        "peak_device_mem_bytes": session.system.peak_device_memory(),
        "peak_rss_bytes": session.system.tree_rss_peak,
        "step_detail": step_detail(analysis),
        "session_path": str(session_path) if session_path else None,
    }


def _job_words(session: Session) -> dict[str, Any]:
    """A rank's run in a job of more ranks than it holds (one node's, or one srun task's): the job it is part of and
    the ranks it holds, so that the history tells the nodes' rows of one job apart from unrelated runs."""
    job = job_of(session)
    if job is None or job["world_size"] <= 1:
        return {}
    return {"job": job["id"], "job_ranks": job["ranks_here"], "job_world_size": job["world_size"],
            "job_host": next((r.host for r in session.ranks if r.host), None)}


def row_from_session(session: Session, analysis: Analysis,
                     session_path: str | os.PathLike[str] | None) -> RunRow:
    """The row a run has in the history, built in memory (also for runs outside any history)."""
    return RunRow(**row_values(session, analysis, session_path, git_commit(session.cwd)))
