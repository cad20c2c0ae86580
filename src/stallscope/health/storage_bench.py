"""A bounded storage micro-benchmark on the dataset's own files: random whole-file reads, then sequential reads.

It reads at most ``cap_bytes`` in total (all phases together) and stops each phase at its share of the time
budget, so it is safe on a production dataset. Each file's page-cache residency is asked just before it is read,
so a "cold" figure measured on files that were already cached is labelled as such instead of passed off as disk
speed. Packing helps by turning many small reads into one sequential stream; the ratio of the sequential to the
random rate is the gain the benchmark can vouch for.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from stallscope.health import pagecache

CHUNK = 1 << 20
#: A file at least this large is read as a sequential stream; smaller ones are read in directory order instead.
LARGE_FILE = 4 << 20
#: At most this many cached files are passed over looking for uncached ones, so a cached dataset costs no time.
MAX_SKIPPED = 2000
#: Shares of the byte cap and time budget: random cold pass, cached re-read of the same files, sequential pass.
SHARES = {"random": 0.4, "cached": 0.4, "sequential": 0.2}


@dataclass(frozen=True)
class Phase:
    """One pass: ``resident_before`` is the share of its bytes already in the page cache before reading."""

    files: int
    bytes: int
    seconds: float
    resident_before: float | None
    errors: int = 0  # files that could not be read (permissions, I/O errors); not in the figures
    first_error: str | None = None

    @property
    def rate(self) -> float | None:
        return self.bytes / self.seconds if self.seconds > 0 and self.bytes > 0 else None

    @property
    def files_per_s(self) -> float | None:
        return self.files / self.seconds if self.seconds > 0 and self.files > 0 else None


@dataclass(frozen=True)
class BenchResult:
    cap_bytes: int
    seconds_budget: float
    random: Phase
    cached: Phase
    sequential: Phase
    sequential_kind: str

    @property
    def bytes_read(self) -> int:
        return self.random.bytes + self.cached.bytes + self.sequential.bytes

    @property
    def cold_is_cold(self) -> bool:
        """True when most of the random pass came from storage, so its rate describes the storage."""
        return self.random.resident_before is not None and self.random.resident_before < 0.5

    @property
    def packing_gain(self) -> float | None:
        """Sequential over random-read rate, only when both passes read storage rather than the cache."""
        seq_cold = self.sequential.resident_before is not None and self.sequential.resident_before < 0.5
        if not (self.cold_is_cold and seq_cold) or not self.random.rate or not self.sequential.rate:
            return None
        return self.sequential.rate / self.random.rate

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["bytes_read"] = self.bytes_read
        out["packing_gain"] = self.packing_gain
        for name in ("random", "cached", "sequential"):
            phase: Phase = getattr(self, name)
            out[name]["bytes_per_s"] = phase.rate
            out[name]["files_per_s"] = phase.files_per_s
        return out


def _residency(path: str) -> tuple[int, int] | None:
    try:
        return pagecache.resident_bytes(path)
    except (OSError, pagecache.ResidencyUnavailable):
        return None


def _read(path: str, limit: int, buf: bytearray, clock: Callable[[], float]) -> tuple[int, float]:
    """Read up to ``limit`` bytes of a file from its start as a loader would; returns (bytes, seconds)."""
    view = memoryview(buf)
    start = clock()
    total = 0
    with open(path, "rb", buffering=0) as fh:
        while total < limit:
            n = fh.readinto(view[: min(len(buf), limit - total)])
            if not n:
                break
            total += n
    return total, clock() - start


def _pass(files: Sequence[tuple[str, int]], cap: int, seconds: float, clock: Callable[[], float],
          buf: bytearray, prefer_cold: bool = False) -> tuple[Phase, list[tuple[str, int]]]:
    """Read files in the given order until the byte cap or the time budget is spent.

    With ``prefer_cold``, files mostly in the page cache are skipped (asking costs no read), so the pass measures
    storage where the dataset still has uncached files; if every file is cached, it reads them anyway and its
    ``resident_before`` says so.
    """
    started = clock()
    read_files: list[tuple[str, int]] = []
    total = 0
    elapsed = 0.0
    resident = known = 0
    skipped: list[tuple[str, int]] = []
    errors: list[str] = []
    for path, size in files:
        remaining = cap - total
        if remaining <= 0 or clock() - started >= seconds:
            break
        limit = min(size, remaining)
        if limit <= 0:
            continue
        res = _residency(path)
        if prefer_cold and len(skipped) < MAX_SKIPPED and res is not None and res[1] and res[0] >= 0.5 * res[1]:
            skipped.append((path, size))
            continue
        if res is not None:
            resident += min(res[0], limit)
            known += limit
        try:
            n, dt = _read(path, limit, buf, clock)
        except OSError as exc:
            errors.append(f"{os.path.basename(path)}: {exc.strerror or exc}")
            continue
        total += n
        elapsed += dt
        read_files.append((path, n))
    if prefer_cold and not read_files and skipped:
        phase, read_files = _pass(skipped, cap, max(0.0, seconds - (clock() - started)), clock, buf, prefer_cold=False)
        return Phase(phase.files, phase.bytes, phase.seconds, phase.resident_before, phase.errors + len(errors),
                     phase.first_error or (errors[0] if errors else None)), read_files
    return Phase(len(read_files), total, elapsed, resident / known if known else None, len(errors),
                 errors[0] if errors else None), read_files


def run_bench(files: Sequence[tuple[str, int]], cap_bytes: int, seconds: float = 3.0, *, seed: int = 0,
              avoid: set[str] | None = None, clock: Callable[[], float] = time.perf_counter) -> BenchResult:
    """Benchmark storage on ``files`` ((path, size) pairs) without reading more than ``cap_bytes`` in total.

    ``avoid`` names files the caller already touched (header reads), which the random pass skips if it can,
    since their first pages are now cached.
    """
    rng = random.Random(seed)
    buf = bytearray(CHUNK)
    avoid = avoid or set()
    candidates = [f for f in files if f[1] > 0]
    fresh = [f for f in candidates if f[0] not in avoid]
    pool = fresh if fresh else candidates
    shuffled = pool[:]
    rng.shuffle(shuffled)
    random_cap = int(cap_bytes * SHARES["random"])
    random_phase, random_files = _pass(shuffled, random_cap, seconds * SHARES["random"], clock, buf, prefer_cold=True)
    # The same files again: now from the page cache, so the difference is what storage costs per byte.
    cached_phase, _ = _pass(random_files, random_phase.bytes, seconds * SHARES["cached"], clock, buf)
    used = {p for p, _ in random_files}
    rest = [f for f in candidates if f[0] not in used]
    large = sorted((f for f in rest if f[1] >= LARGE_FILE), key=lambda f: -f[1])
    if large:
        seq_files, kind = large, "large files, 1 MiB reads"
    else:
        # Files whose headers were read have a cached first page: use them only after the untouched ones.
        seq_files = sorted(f for f in rest if f[0] not in avoid) + sorted(f for f in rest if f[0] in avoid)
        kind = "small files in directory order"
    seq_cap = max(0, cap_bytes - random_phase.bytes - cached_phase.bytes)
    seq_phase, _ = _pass(seq_files, seq_cap, seconds * SHARES["sequential"], clock, buf, prefer_cold=True)
    return BenchResult(cap_bytes, seconds, random_phase, cached_phase, seq_phase, kind)


def default_cap(total_bytes: int, fraction: float = 0.05, max_bytes: int = 256 << 20) -> int:
    """The byte cap for a dataset: a small fraction of it, never more than ``max_bytes``."""
    return int(min(max_bytes, max(0, total_bytes) * fraction))

