"""PackedImageDataset and PackedImageIterable under DataLoader workers started by fork and spawn."""

from __future__ import annotations

import multiprocessing
import random

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
from stallscope.data.packed import shuffled
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


def test_remote_reads_are_runs_of_neighbouring_records_cut_at_the_chunk_limit():
    from stallscope.data.remote import chunks

    # records 0-3 in shard 0 (512-byte tar headers between them), 4-5 in shard 1
    shards = [0, 0, 0, 0, 1, 1]
    offsets = [512, 2048, 3584, 5120, 512, 2048]
    sizes = [1000, 1000, 1000, 1000, 1000, 1000]
    plan = chunks([0, 1, 2, 3, 4, 5], shards, offsets, sizes, limit=3000)
    assert plan == [(0, 512, 3048, [0, 1]), (0, 3584, 6120, [2, 3]), (1, 512, 3048, [4, 5])]
    # out of storage order (a shuffled block order): a new range wherever the next record is not further on
    assert [p[3] for p in chunks([2, 0, 1], shards, offsets, sizes, limit=1 << 20)] == [[2], [0, 1]]
    # a record larger than the limit is one range of its own
    assert chunks([0], shards, offsets, [5000, 0, 0, 0, 0, 0], limit=3000) == [(0, 512, 5512, [0])]


def test_a_pass_starts_with_a_small_range_and_doubles_up_to_the_limit():
    from stallscope.data.remote import chunks

    n = 40
    plan = chunks(list(range(n)), [0] * n, [1024 * i for i in range(n)], [1024] * n, limit=8192, first=2048)
    assert [stop - start for _, start, stop, _ in plan] == [2048, 4096, 8192, 8192, 8192, 8192, 2048]  # 40 KB


def test_shuffle_buffer_gives_its_first_record_early_and_grows_to_its_size():
    taken: list[int] = []

    def records():
        for i in range(5_000):
            taken.append(i)
            yield i

    out = shuffled(records(), 1_000, random.Random(1), start=100)
    first = next(out)
    assert len(taken) == 100 and 0 <= first < 100  # not a whole buffer read before decoding starts
    held = []  # records read but not yet given, after each one given
    rest = []
    for record in out:
        rest.append(record)
        held.append(len(taken) - 1 - len(rest))
    assert sorted([first, *rest]) == list(range(5_000))  # each record once
    # full (size before each give) within the first 2 x size records, never more
    assert max(held) == 1_000 - 1 and held.index(1_000 - 1) < 2_000
    assert [first, *rest] != list(range(5_000))
