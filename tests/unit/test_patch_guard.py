"""The guard behind the autouse fixture ``recorder_left_as_found`` sees what a leaking test leaves behind."""

from __future__ import annotations

import pytest

from stallscope.recorder import events, steps
from tests import patch_guard

pytest.importorskip("torch")


def test_the_recorders_dataloader_patch_is_seen_until_it_is_undone() -> None:
    from torch.utils.data import dataloader

    from stallscope.recorder import loader

    saved = {cls: dict(vars(cls)) for cls in (dataloader.DataLoader, dataloader._BaseDataLoaderIter,
                                              dataloader._MultiProcessingDataLoaderIter,
                                              dataloader._SingleProcessDataLoaderIter)}
    assert patch_guard.installed() == []
    loader.patch_dataloader(dataloader)
    try:
        left = patch_guard.installed()
        assert "torch.utils.data.dataloader.DataLoader.__init__" in left
        assert "torch.utils.data.dataloader._BaseDataLoaderIter.__next__" in left
    finally:
        for cls, attributes in saved.items():
            for name in set(vars(cls)) - set(attributes):
                delattr(cls, name)
            for name, value in attributes.items():
                if vars(cls).get(name) is not value and name not in ("__dict__", "__weakref__"):
                    setattr(cls, name, value)
    assert patch_guard.installed() == []


def test_optimizer_hooks_and_a_configured_recorder_are_seen(tmp_path) -> None:
    from torch.optim import optimizer

    handle = optimizer.register_optimizer_step_pre_hook(steps._pre_hook)
    events.configure(tmp_path)
    try:
        assert patch_guard.installed() == ["events configured", "torch.optim.optimizer._global_optimizer_pre_hooks"]
    finally:
        handle.remove()
        events.reset()
    assert patch_guard.installed() == []
