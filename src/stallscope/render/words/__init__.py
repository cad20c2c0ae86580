"""Every sentence stallscope says about a run, made from the findings' data.

The analysis returns ids, numbers and changes (``analysis/findings.py``); this package is where they
become words, once, for the terminal, the HTML report and the summary JSON alike: one module per kind
of finding (``recommendations``, ``pitfalls``, ``failures``, ``evidence``), each with one function per
id. A finding id with no words is shown by its id and facts rather than dropped.
"""

from __future__ import annotations

from stallscope.render.words.evidence import (
    CONDITIONS,
    NO_SAMPLES,
    beside_compute,
    evidence,
    gpu_timing,
    notes,
    operators,
    rate,
    recording,
    straggler_short,
    training_process,
)
from stallscope.render.words.phrases import MIB, PART_LABELS, facts_text, gain, overrides
from stallscope.render.words.pitfalls import PitfallSaid, pitfall
from stallscope.render.words.recommendations import Said, created_at, hotspot, not_recommended, recommendation

__all__ = ["CONDITIONS", "MIB", "NO_SAMPLES", "PART_LABELS", "PitfallSaid", "Said", "beside_compute", "created_at",
           "evidence", "facts_text", "gain", "gpu_timing", "hotspot", "not_recommended", "notes", "operators",
           "overrides", "pitfall", "rate", "recommendation", "recording", "straggler_short", "training_process"]
