"""A summary JSON as the flat metrics and tags an experiment tracker stores: one vocabulary for all three.

Pure functions of the summary (``stallscope.summary/1``), so what MLflow, W&B and TensorBoard receive is
the same and is tested exactly, without any tracker installed. Names are ``stallscope/...``: MLflow, W&B and
TensorBoard all accept slashes, and the prefix keeps them apart from the script's own metrics.
"""

from __future__ import annotations

import math
from typing import Any

from stallscope import __version__

PREFIX = "stallscope/"


def _number(value: Any) -> float | None:
    """A finite number, or None (a summary leaves out what it could not measure as null)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def flat_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The run's headline numbers: data-wait fraction, steps/s, samples/s, each stage's share of step time,
    the bottleneck's share and each recommendation's predicted speedup (by its id). Missing values are
    left out rather than logged as 0, which a tracker would plot as a real measurement."""
    throughput = summary.get("throughput") or {}
    bottleneck = summary.get("bottleneck") or {}
    candidates: dict[str, Any] = {
        "data_wait_fraction": summary.get("data_wait_fraction"),
        "steps_per_s": throughput.get("steps_per_s"),
        "samples_per_s": throughput.get("samples_per_s"),
        "bottleneck_share": bottleneck.get("share"),
    }
    for node, figures in sorted((summary.get("nodes") or {}).items()):
        candidates[f"share/{node}"] = (figures or {}).get("share")
    for rec in summary.get("recommendations") or []:
        if rec.get("id"):
            candidates[f"speedup/{rec['id']}"] = rec.get("predicted_speedup")
    return {PREFIX + name: number for name, value in candidates.items() if (number := _number(value)) is not None}


def tags(summary: dict[str, Any]) -> dict[str, str]:
    """The verdict, the limiting stage (when there is one), the stallscope run id and version."""
    found = {
        "verdict": summary.get("verdict"),
        "bottleneck": (summary.get("bottleneck") or {}).get("node"),
        "run_id": summary.get("run_id"),
        "version": __version__,
    }
    return {PREFIX + name: str(value) for name, value in found.items() if value not in (None, "")}
