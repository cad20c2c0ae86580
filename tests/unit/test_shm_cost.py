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


def test_the_size_measured_at_is_the_runs_batch_within_bounds():
    assert shm_cost.calibration_bytes(None) == shm_cost.CALIBRATION_BYTES  # no batch seen: the default
    assert shm_cost.calibration_bytes(0) == shm_cost.CALIBRATION_BYTES
    assert shm_cost.calibration_bytes(19_267_584) == 19_267_584  # 32 images of 3x224x224 float32
    assert shm_cost.calibration_bytes(1000) == shm_cost.MIN_BYTES  # per-call costs would swamp the faults
    assert shm_cost.calibration_bytes(1 << 33) == shm_cost.MAX_BYTES  # the exit stays short
