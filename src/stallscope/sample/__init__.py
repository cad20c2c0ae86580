"""Samplers that run in the launcher, outside the target: system and process-tree metrics at ~10 Hz."""

from stallscope.sample.system import SystemSampler

__all__ = ["SystemSampler"]
