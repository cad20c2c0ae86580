"""Ranking of recommendations: measured configuration changes before assumed code changes."""

from __future__ import annotations

from stallscope.analyze.recommend import SPECULATIVE_DISCOUNT, _rank_value
from stallscope.analyze.findings import Recommendation


def rec(id_, change, gain):
    return Recommendation(id_, "loader", id_, change, gain, "")


def test_measured_set_change_beats_a_slightly_larger_assumed_gain():
    measured = rec("num-workers", "--set num_workers=2", 1.9)
    assumed = rec("dataset-code", "profile __getitem__ ...", 2.1)
    assert _rank_value(measured) > _rank_value(assumed)
    assert _rank_value(assumed) == 2.1 * SPECULATIVE_DISCOUNT


def test_much_larger_assumed_gain_still_wins():
    assert _rank_value(rec("pack", "pack the dataset", 4.0)) > _rank_value(rec("w", "--set num_workers=3", 1.5))


def test_unpredicted_changes_rank_last():
    assert _rank_value(rec("sharing-strategy", "--set sharing_strategy=file_system", None)) == 0.0
