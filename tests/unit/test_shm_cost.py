"""The exit calibration of shared memory: real segments, real page faults."""

from __future__ import annotations

import sys

import torch  # noqa: F401  (loaded, as in the training process the recorder measures in)

from stallscope.record import shm_cost


def test_measures_writing_and_mapping_a_segment_of_the_given_size():
    result = shm_cost.measure(nbytes=1 << 20, repeats=3)
    assert result is not None
    assert result["nbytes"] == 1 << 20
    assert isinstance(result["write_extra_ns"], int) and isinstance(result["read_extra_ns"], int)
    assert result["write_extra_ns"] >= 0 and result["read_extra_ns"] >= 0
    # Page faults on 256 fresh pages cost something, but far less than a second per megabyte.
    assert result["write_extra_ns"] + result["read_extra_ns"] < 1_000_000_000


def test_without_torch_loaded_nothing_is_measured(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert shm_cost.measure() is None
