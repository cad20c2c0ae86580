"""Datasets over a finished pack: map-style (random access) and iterable (sequential reads).

Both open their storage lazily in the process that reads: an LMDB environment or a file
descriptor inherited through ``fork`` shares locks and file offsets with the parent, and
neither can be pickled for ``spawn``. The pid check reopens after any fork.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from stallscope.data._decoding import DecodingMixin, MapDecodingMixin
from stallscope.data._lmdb import lmdb_env
from stallscope.data.crops import CropSpec
from stallscope.data.decoders import Decoder
from stallscope.data.index import PackFormatError, PackIndex, load_index
from stallscope.data.remote import FIRST_CHUNK_BYTES, RemotePack, chunks, is_remote, stream

T = TypeVar("T")


class _PackReader:
    """Byte access to records by position; holds no open handle across a fork or a pickle."""

    def __init__(self, path: Path, index: PackIndex, remote: RemotePack | None = None) -> None:
        self.path = path
        self.remote = remote
        self.format = index.format
        self.keys = [r.key.encode("ascii") for r in index.records]
        self.shard_names = list(index.shards)
        self.shards = np.array([r.shard for r in index.records], dtype=np.int32)
        self.offsets = np.array([r.offset for r in index.records], dtype=np.int64)
        self.sizes = np.array([r.size for r in index.records], dtype=np.int64)
        self._pid = -1
        self._env: Any = None  # lmdb's Environment and Transaction, once open in this process
        self._txn: Any = None
        self._fds: dict[int, int] = {}

    def _ensure_open(self) -> None:
        if self._pid == os.getpid():
            return
        self._env, self._txn, self._fds = None, None, {}  # inherited handles are the parent's: drop
        if self.format == "lmdb":
            self._env = lmdb_env(self.path)
            self._txn = self._env.begin(buffers=False)
        self._pid = os.getpid()

    def read(self, i: int) -> bytes:
        self._ensure_open()
        if self._txn is not None:
            data = self._txn.get(self.keys[i])
            if data is None:
                raise KeyError(f"{self.path}: record {self.keys[i].decode()} missing (run stallscope pack --verify)")
            return data
        shard = int(self.shards[i])
        if self.remote is not None:
            offset = int(self.offsets[i])
            return self.remote.read(self.shard_names[shard], offset, offset + int(self.sizes[i]))
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds[shard] = os.open(self.path / self.shard_names[shard], os.O_RDONLY)
        return os.pread(fd, int(self.sizes[i]), int(self.offsets[i]))

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_pid=-1, _env=None, _txn=None, _fds={})
        return state


class PackedImageDataset(MapDecodingMixin, Dataset):
    """Map-style dataset over a pack made by ``stallscope pack`` (LMDB or WebDataset shards).

    Yields ``(uint8 CHW tensor, label)`` like :class:`FastImageFolder`; sample ``i`` is the
    ``i``-th usable source image. Shards are read with ``pread`` at the offsets in the index,
    so random access needs no tar parsing. ``recycle_batches`` as in :class:`FastImageFolder`.
    """

    def __init__(self, path: str | os.PathLike[str], crop: CropSpec | None = None,
                 decoder: str | Decoder = "auto", dct_scaling: bool = True, recycle_batches: bool = True) -> None:
        self._init_decoding(crop, decoder, dct_scaling)
        self.recycle_batches = recycle_batches
        remote = RemotePack(str(path)) if is_remote(path) else None
        self.path: Path | str = str(path) if remote is not None else Path(path)
        index = remote.index() if remote is not None else load_index(self.path)
        if remote is not None and index.format != "wds":
            raise PackFormatError(f"{path}: an {index.format} pack is one database file, not shards to read by "
                                  "range: pack with --format wds for an object store")
        self.format = index.format
        self.classes = list(index.classes)
        self.targets = [r.label for r in index.records]
        self.sources = [r.source for r in index.records]
        self._reader = _PackReader(Path(self.path), index, remote)

    def __len__(self) -> int:
        return len(self.targets)

    def raw(self, index: int) -> tuple[bytes, int]:
        """The stored bytes and label of record ``index`` (no decoding)."""
        return self._reader.read(index), self.targets[index]

    def _read(self, index: int) -> tuple[bytes, int, str]:
        return self._reader.read(index), self.targets[index], f"{self.path} record {index} ({self.sources[index]})"

    def __repr__(self) -> str:
        return f"PackedImageDataset({str(self.path)!r}, {self.format}, {len(self)} images)"


def _worker_split(n: int, rank: int, world: int) -> tuple[int, int]:
    """This reader's share of ``n`` consecutive items: (start, stop)."""
    info = get_worker_info()
    workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
    parts, part = world * workers, rank * workers + worker
    return n * part // parts, n * (part + 1) // parts


#: Records a shuffle buffer holds before it gives its first one: decoding starts after these, not after a whole
#: buffer (read from an object store, a whole buffer is a pause at every epoch's start while nothing is decoded); the
#: first ranged GETs in flight (``remote.FIRST_CHUNK_BYTES``, doubling) hold this many records of a few tens of KB
#: (docs/calibration.md, data-shuffle-start).
SHUFFLE_START = 32


def shuffled(records: Iterator[T], size: int, rng: random.Random, start: int = SHUFFLE_START) -> Iterator[T]:
    """``records`` through a shuffle buffer of ``size``: the first comes out once ``min(start, size)`` are in, and
    until it is full the buffer takes two records for each it gives, so it grows to ``size`` within the first
    ``2 * size`` records (the order stays random from the first record; only the early ones are drawn from fewer)."""
    buffer: list[T] = []
    start = min(start, size)
    for record in records:
        buffer.append(record)
        if len(buffer) < size:
            buffer.extend(itertools.islice(records, 1))
        if len(buffer) >= start:
            j = rng.randrange(len(buffer))
            buffer[j], buffer[-1] = buffer[-1], buffer[j]
            yield buffer.pop()
    rng.shuffle(buffer)
    yield from buffer


class PackedImageIterable(DecodingMixin, IterableDataset):
    """Iterable variant: each worker (and rank) reads its own contiguous span sequentially.

    Sequential reads are what object stores and spinning disks want (from ``s3://bucket/prefix``, a few large
    ranged GETs in flight ahead of the decoding: ``data/remote.py``); randomness comes from
    shuffling the order of blocks (shards, or runs of ``block`` LMDB records) and a shuffle
    buffer. Call ``set_epoch(e)`` each epoch for a new order. Every record is yielded exactly
    once per epoch across all workers and ranks.
    """

    def __init__(self, path: str | os.PathLike[str], crop: CropSpec | None = None,
                 decoder: str | Decoder = "auto", dct_scaling: bool = True, shuffle: bool = True,
                 shuffle_buffer: int = 1000, block: int = 1000, seed: int = 0, rank: int = 0,
                 world_size: int = 1) -> None:
        self._init_decoding(crop, decoder, dct_scaling)
        self._map = PackedImageDataset(path, crop, decoder, dct_scaling)
        self.shuffle, self.shuffle_buffer, self.seed = shuffle, max(1, shuffle_buffer), seed
        self.rank, self.world_size, self.epoch = rank, world_size, 0
        index_shards = self._map._reader.shards
        if self._map.format == "wds":
            bounds = np.flatnonzero(np.diff(index_shards)) + 1
            starts = [0, *bounds.tolist()]
            ends = [*bounds.tolist(), len(index_shards)]
        else:
            starts = list(range(0, len(self._map), block))
            ends = [min(s + block, len(self._map)) for s in starts]
        self._blocks = list(zip(starts, ends))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self._map)

    def _positions(self) -> Iterator[int]:
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        blocks = list(self._blocks)
        if self.shuffle:
            rng.shuffle(blocks)
        order = [i for start, stop in blocks for i in range(start, stop)]
        start, stop = _worker_split(len(order), self.rank, self.world_size)
        return iter(order[start:stop])

    def _decoded(self, i: int, data: bytes, label: int) -> tuple[torch.Tensor, int]:
        return self._decode_sample(data, f"{self._map.path} record {i} ({self._map.sources[i]})"), label

    def _records(self, positions: Iterator[int]) -> Iterator[tuple[int, bytes, int]]:
        """(position, stored bytes, label) in ``positions``' order: from the local pack one read each, from an object
        store in ranged reads running ahead."""
        reader, targets = self._map._reader, self._map.targets
        if reader.remote is None:
            for i in positions:
                yield i, *self._map.raw(i)
            return
        plan = chunks(list(positions), reader.shards, reader.offsets, reader.sizes, first=FIRST_CHUNK_BYTES)
        for i, data in stream(reader.remote, reader.shard_names, plan, reader.offsets, reader.sizes):
            yield i, data, targets[i]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        records = self._records(self._positions())
        if not self.shuffle:
            for i, data, label in records:
                yield self._decoded(i, data, label)
            return
        info = get_worker_info()
        rng = random.Random(hash((self.seed, self.epoch, self.rank, info.id if info else 0)))
        for i, data, label in shuffled(records, self.shuffle_buffer, rng):
            yield self._decoded(i, data, label)
