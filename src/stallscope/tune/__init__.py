"""Closed loop on the user's script: ``tune`` tries DataLoader changes and confirms the winner;
``bench`` measures the input pipeline alone and the compute-only ceiling; ``race_decoders``
races JPEG decoders on the user's files."""

from __future__ import annotations

from stallscope.tune.bench import BenchResult, bench
from stallscope.tune.decoders import DecoderRace, race_decoders
from stallscope.tune.tuning import TuneResult, tune

__all__ = ["BenchResult", "DecoderRace", "TuneResult", "bench", "race_decoders", "tune"]
