"""The sampled stacks of a run as a speedscope file (https://www.speedscope.app, or ``npx speedscope FILE``).

speedscope's file format (https://www.speedscope.app/file-format-schema.json): a shared table of frames and
``sampled`` profiles whose samples are stacks of indices into it, outermost frame first, each with a weight.
Here there is one profile per stage of the training loader's fetches (the samples the hotspots are made of), the
limiting stage shown first on opening; a weight is a count of samples (unit ``none``): the recorder counts
stacks, so "Time Order" is the order of the counts, not of time, and "Left Heavy" and "Sandwich" are the views
that mean something.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import stallscope
from stallscope.analysis import Analysis
from stallscope.analysis.sampled_stacks import Frame, job_stacks
from stallscope.constants import NODE_IDS
from stallscope.paths import write_file
from stallscope.session import Session

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def render(session: Session, analysis: Analysis) -> dict[str, Any] | None:
    """The speedscope document of the job's sampled stacks; None when the run has none."""
    stacks = job_stacks(session, analysis.steps.loader_ids)
    if not stacks:
        return None
    frames: dict[Frame, int] = {}
    by_stage: dict[str, dict[tuple[int, ...], int]] = {}  # stage -> stack (frame indices) -> samples
    for stack in stacks:
        key = tuple(frames.setdefault(frame, len(frames)) for frame in stack.frames)
        counts = by_stage.setdefault(stack.stage, {})
        counts[key] = counts.get(key, 0) + stack.count  # the same stack in several processes: one sample
    order = {node: i for i, node in enumerate(NODE_IDS)}
    stages = sorted(by_stage, key=lambda s: (s != analysis.bottleneck_node, order.get(s, len(order)), s))
    shares = analysis.node_shares
    profiles = []
    for stage in stages:
        ordered = sorted(by_stage[stage].items(), key=lambda item: (-item[1], item[0]))
        total = sum(by_stage[stage].values())
        limiting = " (limiting stage)" if stage == analysis.bottleneck_node else ""
        profiles.append({
            "type": "sampled", "name": f"{stage}{limiting}: {total} samples, {100 * shares.get(stage, 0.0):.1f}% "
                                      "of step time",
            "unit": "none", "startValue": 0, "endValue": total,
            "samples": [list(key) for key, _ in ordered], "weights": [count for _, count in ordered]})
    return {
        "$schema": SCHEMA,
        "shared": {"frames": [{"name": f.function or "?", "file": f.file, "line": f.line} for f in frames]},
        "profiles": profiles,
        "name": f"stallscope {session.run_id}: sampled stacks of the training loader's fetches",
        "activeProfileIndex": 0,
        "exporter": f"stallscope {stallscope.__version__}",
    }


def write_speedscope(path: str | os.PathLike[str], document: dict[str, Any]) -> Path:
    return write_file(path, json.dumps(document, separators=(",", ":")))
