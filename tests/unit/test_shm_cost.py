"""The exit calibration of shared memory: real segments, real page faults."""

from __future__ import annotations

import sys

import torch  # noqa: F401  (loaded, as in the training process the recorder measures in)

from stallscope.recorder import shm_cost


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
    roomy = 1 << 34
    assert shm_cost.calibration_bytes(None, roomy) == shm_cost.CALIBRATION_BYTES  # no batch seen: the default
    assert shm_cost.calibration_bytes(0, roomy) == shm_cost.CALIBRATION_BYTES
    assert shm_cost.calibration_bytes(19_267_584, roomy) == 19_267_584  # 32 images of 3x224x224 float32
    assert shm_cost.calibration_bytes(1000, roomy) == shm_cost.MIN_BYTES  # per-call costs would swamp the faults
    assert shm_cost.calibration_bytes(1 << 33, roomy) == shm_cost.MAX_BYTES  # the exit stays short


def test_a_small_or_full_dev_shm_is_measured_smaller_or_not_at_all():
    # Docker's default 64 MiB /dev/shm with 40 MiB in use: a quarter of the 24 MiB left
    assert shm_cost.calibration_bytes(19_267_584, 24 << 20) == 6 << 20
    assert shm_cost.calibration_bytes(19_267_584, 3 << 20) is None  # too little room: nothing measured
    assert shm_cost.measure(None) is None


def test_the_training_loaders_batch_sets_the_size():
    from stallscope.recorder import loader

    loader._batches_by_loader.clear()
    loader._batch_bytes_by_loader.clear()
    assert loader.main_batch_nbytes() is None
    loader._note_batch_bytes(0, 19_267_584)  # the training loader: 32 images
    loader._note_batch_bytes(1, 38_535_168)  # an evaluation loader with twice the batch, used less
    loader._batches_by_loader.update({0: 40, 1: 4})
    assert loader.main_batch_nbytes() == 19_267_584
    loader._batches_by_loader.clear()
    loader._batch_bytes_by_loader.clear()
