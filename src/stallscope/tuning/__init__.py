"""Closed loop on the user's script: ``tune`` tries DataLoader changes and confirms the winner;
``bench`` measures the input pipeline alone and the compute-only ceiling; ``race_decoders``
races JPEG decoders on the user's files."""

from __future__ import annotations

from stallscope.tuning.bench import BenchResult, bench
from stallscope.tuning.decoders import DecoderRace, race_decoders
from stallscope.tuning.tuning import TuneResult, tune

__all__ = ["BenchResult", "DecoderRace", "TuneResult", "bench", "race_decoders", "tune"]
