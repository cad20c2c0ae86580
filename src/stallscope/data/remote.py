"""A pack in an object store: the folder ``stallscope pack --format wds`` wrote, uploaded as it is (``aws s3 sync OUT
s3://bucket/prefix``), read by ranged GETs at the offsets its index names.

The iterable dataset reads each worker's records in storage order, so its reads are a few large ranges: runs of
consecutive records cut into chunks of at most ``CHUNK_BYTES``, ``PREFETCH`` of them in flight on threads while the
worker decodes the one before. The map-style dataset reads one record per GET (each sample pays the store's latency:
fine beside a slow model, latency-bound beside a fast one, which ``stallscope run`` then shows).

The client is boto3's (the ``s3`` extra), made once per process (a client must not cross a fork), with the endpoint
and keys from boto3's usual sources (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, the config files).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from stallscope.data.index import INDEX_NAME, PackFormatError, PackIndex

#: Bytes per ranged GET at most: large enough that the store's latency is paid rarely, small enough that a worker
#: holds a few of them at once.
CHUNK_BYTES = 8 << 20
#: The first range of a worker's pass is this small, and each next one twice the last up to ``CHUNK_BYTES``: its
#: first batch waits for one small GET, not for a whole chunk.
FIRST_CHUNK_BYTES = 512 << 10
#: Bytes between two records read through rather than split on (a tar header and its padding are about 1 KB).
GAP_BYTES = 64 << 10
#: Ranged GETs in flight per reading worker: one being decoded, the rest arriving behind it.
PREFETCH = 3


def is_remote(path: object) -> bool:
    return isinstance(path, str) and path.startswith("s3://")


def split_url(url: str) -> tuple[str, str]:
    """(bucket, key prefix without a trailing slash) of ``s3://bucket/prefix``."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not bucket:
        raise PackFormatError(f"{url}: not an s3://bucket/prefix address")
    return bucket, prefix.rstrip("/")


class RemotePack:
    """Ranged reads of one pack's shards; holds no client across a fork or a pickle."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.bucket, self.prefix = split_url(url)
        self._pid = -1
        self._client: Any = None

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    @property
    def client(self) -> Any:
        if self._pid != os.getpid():
            try:
                import boto3
                import botocore.config
            except ImportError:
                raise PackFormatError(f"{self.url}: reading a pack from S3 needs boto3: pip install "
                                      "'stallscope[s3]'") from None
            config = botocore.config.Config(max_pool_connections=max(10, PREFETCH))
            self._client, self._pid = boto3.client("s3", config=config), os.getpid()
        return self._client

    def index(self) -> PackIndex:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(INDEX_NAME))["Body"].read()
        except Exception as exc:  # noqa: BLE001 (botocore's errors name the cause: no such key, no credentials)
            raise PackFormatError(f"{self.url}: cannot read {INDEX_NAME} ({type(exc).__name__}: {exc}); "
                                  "upload the whole folder `stallscope pack` wrote") from None
        return PackIndex.from_json(body.decode(), self.url)

    def read(self, shard: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of one shard."""
        answer = self.client.get_object(Bucket=self.bucket, Key=self._key(shard), Range=f"bytes={start}-{stop - 1}")
        return answer["Body"].read()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": -1, "_client": None}


def chunks(positions: Sequence[int], shards: Sequence[int] | np.ndarray, offsets: Sequence[int] | np.ndarray,
           sizes: Sequence[int] | np.ndarray, limit: int = CHUNK_BYTES,
           first: int | None = None) -> list[tuple[int, int, int, list[int]]]:
    """``positions`` in order as ranged reads: (shard, start, stop, positions), each a run of records lying one after
    another in one shard, at most ``limit`` bytes unless a single record is larger; the first at most ``first``
    (default: ``limit``), each next one up to twice the one before."""
    out: list[tuple[int, int, int, list[int]]] = []
    cap = min(limit, first or limit)
    for i in positions:
        shard, offset, size = int(shards[i]), int(offsets[i]), int(sizes[i])
        if out:
            last_shard, start, stop, members = out[-1]
            if last_shard == shard and stop <= offset <= stop + GAP_BYTES and offset + size - start <= cap:
                out[-1] = (shard, start, offset + size, [*members, i])
                continue
            cap = min(limit, 2 * cap)
        out.append((shard, offset, offset + size, [i]))
    return out


def stream(pack: RemotePack, shard_names: Sequence[str], plan: list[tuple[int, int, int, list[int]]],
           offsets: Sequence[int] | np.ndarray, sizes: Sequence[int] | np.ndarray,
           prefetch: int = PREFETCH) -> Iterator[tuple[int, bytes]]:
    """(position, record bytes) in ``plan``'s order, ``prefetch`` ranged GETs in flight ahead of the reader."""
    if not plan:
        return
    pool = ThreadPoolExecutor(max(1, prefetch), thread_name_prefix="stallscope-s3")
    pending: deque[tuple[Future[bytes], tuple[int, int, int, list[int]]]] = deque()
    upcoming = iter(plan)
    try:
        for item in upcoming:
            pending.append((pool.submit(pack.read, shard_names[item[0]], item[1], item[2]), item))
            if len(pending) >= prefetch:
                break
        while pending:
            future, (_, start, _, members) = pending.popleft()
            nxt = next(upcoming, None)
            if nxt is not None:
                pending.append((pool.submit(pack.read, shard_names[nxt[0]], nxt[1], nxt[2]), nxt))
            data = future.result()
            for i in members:
                lo = int(offsets[i]) - start
                yield i, data[lo:lo + int(sizes[i])]
    finally:
        for future, _ in pending:
            future.cancel()
        pool.shutdown(wait=False)
