"""--set parsing and application to DataLoader arguments (real DataLoader signature)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from stallscope.recorder.overrides import apply_overrides  # noqa: E402
from stallscope.settings import OverrideError, parse_overrides  # noqa: E402


def test_parse_types_and_errors():
    assert parse_overrides(["num_workers=4", "pin_memory=true", "timeout=1.5", "multiprocessing_context=spawn",
                            "prefetch_factor=None"]) == {
        "num_workers": 4, "pin_memory": True, "timeout": 1.5, "multiprocessing_context": "spawn",
        "prefetch_factor": None}
    for bad, message in [("num_workers", "name=value"), ("dataset=x", "not one of the settings --set can change"),
                         ("num_workers=-1", "negative"), ("pin_memory=maybe", "true or false"),
                         ("prefetch_factor=0", "at least 1"), ("torch_threads=0", "at least 1"),
                         ("torch_threads=none", "at least 1")]:
        with pytest.raises(OverrideError, match=message):
            parse_overrides([bad])


def test_apply_binds_positional_arguments():
    data = list(range(10))
    args, kwargs, applied = apply_overrides(DataLoader.__init__, (data, 5), {"shuffle": False},
                                            {"num_workers": 2, "batch_size": 3})
    assert args == ()
    assert kwargs["dataset"] is data and kwargs["batch_size"] == 3 and kwargs["num_workers"] == 2
    assert applied == {"num_workers": [0, 2], "batch_size": [5, 3]}
    loader = DataLoader(**kwargs)
    assert loader.batch_size == 3 and loader.num_workers == 2


def test_zero_workers_clears_worker_only_arguments():
    _, kwargs, applied = apply_overrides(DataLoader.__init__, (list(range(4)),),
                                         {"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True},
                                         {"num_workers": 0})
    assert kwargs["prefetch_factor"] is None and kwargs["persistent_workers"] is False
    assert applied["prefetch_factor"]["adjusted"] == [4, None]
    DataLoader(**kwargs)  # would raise ValueError if a worker-only argument were left


def test_batch_size_is_not_forced_over_a_batch_sampler():
    from torch.utils.data import BatchSampler, SequentialSampler

    sampler = BatchSampler(SequentialSampler(range(8)), 4, False)
    _, kwargs, applied = apply_overrides(DataLoader.__init__, (list(range(8)),), {"batch_sampler": sampler},
                                         {"batch_size": 2})
    assert "skipped" in applied["batch_size"]
    assert kwargs.get("batch_size", 1) == 1
    DataLoader(**kwargs)


def test_no_overrides_is_identity():
    args, kwargs, applied = apply_overrides(DataLoader.__init__, (1, 2), {"a": 3}, {})
    assert (args, kwargs, applied) == ((1, 2), {"a": 3}, {})
