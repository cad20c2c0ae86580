"""The storage micro-benchmark: it never reads past its cap or budget, and cold differs from cached after a drop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stallscope.health import pagecache
from stallscope.health.dataset_scan import walk
from stallscope.health.storage_bench import LARGE_FILE, default_cap, run_bench


def files_of(root: Path, n: int, size: int, name: str = "f") -> list[tuple[str, int]]:
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        path = root / f"{name}{i:04d}.bin"
        path.write_bytes(os.urandom(size))
        out.append((str(path), size))
    return out


def test_default_cap_is_a_fraction_with_a_ceiling() -> None:
    assert default_cap(100 << 20) == 5 << 20
    assert default_cap(100 << 30) == 256 << 20
    assert default_cap(100 << 20, fraction=0.1, max_bytes=1 << 20) == 1 << 20


@pytest.mark.parametrize("cap", [0, 1, 50_000, 333_333, 10 << 20])
def test_never_reads_more_than_the_cap(tmp_path: Path, cap: int) -> None:
    files = files_of(tmp_path, 40, 20_000) + files_of(tmp_path / "big", 1, 300_000, "big")
    result = run_bench(files, cap, seconds=10.0)
    assert result.bytes_read <= cap
    assert result.cached.bytes == result.random.bytes  # the same files, read again
    if cap >= 10 << 20:
        assert result.bytes_read == 40 * 20_000 + 300_000 + result.cached.bytes  # everything once, random files twice


def test_stops_at_its_time_budget(tmp_path: Path) -> None:
    files = files_of(tmp_path, 10, 1000)
    ticks = iter(range(10_000))
    result = run_bench(files, 1 << 30, seconds=0.5, clock=lambda: float(next(ticks)))
    assert result.bytes_read == 0 and result.random.files == 0


def test_sequential_pass_prefers_large_files(tmp_path: Path) -> None:
    files = files_of(tmp_path, 3, 1000) + files_of(tmp_path / "big", 1, LARGE_FILE, "big")
    result = run_bench(files, 1 << 30, seconds=10.0, avoid={p for p, _ in files[:3]})
    assert result.random.files == 1 and result.random.bytes == LARGE_FILE  # the only file not avoided
    assert result.sequential_kind.startswith("small files") and result.sequential.files == 3
    result = run_bench(files, 1 << 30, seconds=10.0, avoid={files[-1][0]})
    assert result.sequential_kind.startswith("large files") and result.sequential.bytes == LARGE_FILE


def test_result_serializes_with_rates(tmp_path: Path) -> None:
    result = run_bench(files_of(tmp_path, 20, 4096), 1 << 20, seconds=5.0)
    raw = result.to_dict()
    assert raw["bytes_read"] == result.bytes_read <= raw["cap_bytes"]
    assert raw["random"]["files"] == result.random.files and raw["random"]["bytes_per_s"] > 0


def _drop_caches() -> None:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("1\n")
    except OSError as exc:
        pytest.skip(f"cannot drop the page cache here: {exc}")


def test_cold_and_cached_figures_differ_after_dropping_the_cache(tmp_path: Path) -> None:
    if pagecache.available():
        pytest.skip(pagecache.available())
    files = files_of(tmp_path / "ds", 200, 64 << 10)
    facts = walk(str(tmp_path / "ds"))
    _drop_caches()
    resident_after_drop = sum(pagecache.resident_bytes(p)[0] for p, _ in files)
    if resident_after_drop > 0.5 * sum(s for _, s in files):
        pytest.skip("the page cache kept the files after drop_caches (tmpfs or a memory-backed tmp_path)")
    result = run_bench(facts.files, 4 << 20, seconds=10.0)
    assert result.bytes_read <= 4 << 20
    assert result.cold_is_cold and result.random.resident_before < 0.5
    assert result.cached.resident_before == pytest.approx(1.0)
    assert result.cached.rate > result.random.rate
