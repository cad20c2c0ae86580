"""The analysis layer: pure functions from a Session to findings, as data (never words, never the recorder).

``analyze(session)`` is the front door (``job.py``); ``Analysis`` and the findings it holds are in
``findings.py``. Renderers turn findings into words, tables and charts.
"""

from __future__ import annotations

from stallscope.analysis.findings import (
    Analysis,
    Failure,
    LoaderSummary,
    Recommendation,
    Step,
    StepStats,
    WorkerPipeline,
    shares,
)
from stallscope.analysis.job import analyze, usable_cpus

__all__ = ["Analysis", "Failure", "LoaderSummary", "Recommendation", "Step", "StepStats", "WorkerPipeline",
           "analyze", "shares", "usable_cpus"]
