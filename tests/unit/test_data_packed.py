"""PackedImageDataset and PackedImageIterable under DataLoader workers started by fork and spawn."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from torch.utils.data import DataLoader

from stallscope.data import (
    FastImageFolder,
    PackedImageDataset,
    PackedImageIterable,
    PackOptions,
    RandomResizedCrop,
    collate_uint8,
    pack,
)
from stallscope.demo.dataset import DatasetSpec, make_dataset

pytest.importorskip("lmdb")
START_METHODS = [m for m in ("fork", "spawn") if m in multiprocessing.get_all_start_methods()]


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    base = tmp_path_factory.mktemp("packed")
    src = make_dataset(base / "src", DatasetSpec(n_files=40, width=200, height=160))
    out = {"src": src}
    for fmt in ("lmdb", "wds"):
        pack(src, base / fmt, PackOptions(format=fmt, shard_size=9))
        out[fmt] = base / fmt
    return out


@pytest.mark.parametrize("method", START_METHODS)
def test_map_style_lmdb_under_workers(packs, method):
    ds = PackedImageDataset(packs["lmdb"], crop=RandomResizedCrop(64))
    ds[0]  # the parent opens the environment first: the classic fork pitfall
    loader = DataLoader(ds, batch_size=6, num_workers=2, collate_fn=collate_uint8, multiprocessing_context=method)
    labels = []
    for images, batch_labels in loader:
        assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, 64, 64)
        labels.extend(batch_labels.tolist())
    assert labels == ds.targets


@pytest.mark.parametrize("fmt", ["lmdb", "wds"])
@pytest.mark.parametrize("method", START_METHODS)
def test_iterable_yields_every_record_once_across_workers(packs, fmt, method):
    ds = PackedImageIterable(packs[fmt], crop=RandomResizedCrop(32), shuffle_buffer=5, block=7, seed=3)
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_uint8, multiprocessing_context=method)
    labels = sorted(label for _, batch in loader for label in batch.tolist())
    assert labels == sorted(PackedImageDataset(packs[fmt]).targets)


def test_iterable_epochs_shuffle_differently_and_ranks_split(packs):
    ds = PackedImageIterable(packs["wds"], crop=RandomResizedCrop(16), shuffle_buffer=4)
    first = [label for _, label in ds]
    ds.set_epoch(1)
    assert len(first) == 40
    halves = [list(PackedImageIterable(packs["lmdb"], crop=RandomResizedCrop(16), shuffle=False, rank=r,
                                       world_size=2)) for r in (0, 1)]
    assert len(halves[0]) + len(halves[1]) == 40 and len(halves[0]) == 20


def test_packed_and_folder_agree_on_samples(packs):
    folder = FastImageFolder(packs["src"])
    for fmt in ("lmdb", "wds"):
        packed = PackedImageDataset(packs[fmt])
        assert packed.targets == folder.targets and packed.classes == folder.classes
        assert packed.raw(11)[0] == open(folder.samples[11][0], "rb").read()
