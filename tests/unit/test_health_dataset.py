"""Dataset scan and checks: magic bytes, walk bounds, headers, file system, layout, and run_doctor's validation."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from stallscope.health import run_doctor, validate_data_dir
from stallscope.health.dataset import (
    check_files,
    check_filesystem,
    check_formats,
    check_image_sizes,
    check_layout,
    check_page_cache,
    check_vs_ram,
)
from stallscope.health.dataset_scan import DatasetFacts, measure_residency, read_headers, sniff, walk
from stallscope.health.host import Host
from stallscope.health.storage_bench import BenchResult, Phase

PIL = pytest.importorskip("PIL.Image")


def image_bytes(fmt: str, size: tuple[int, int] = (64, 48)) -> bytes:
    buf = io.BytesIO()
    PIL.new("RGB", size, (120, 30, 200)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("head, fmt", [
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "jpeg"),
    (b"\x89PNG\r\n\x1a\n....", "png"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "webp"),
    (b"RIFF\x00\x00\x00\x00WAVEfmt ", "wav"),
    (b"\x00\x00\x00\x1cftypavif", "heif/avif"),
    (b"\x93NUMPY\x01\x00", "npy"),
    (b"\x80\x04\x95", "pickle"),
    (b"\x00" * 257 + b"ustar\x0000", "tar"),
    (b"\x00" * 16 + struct.pack("<I", 0xBEEFC0DE), "lmdb"),
    (b'{"label": 3}\n', "text"),
    (b"\x01\x02\x03\xfe", "unknown"),
    (b"", "empty"),
])
def test_sniff(head: bytes, fmt: str) -> None:
    assert sniff(head) == fmt


def dataset(root: Path, n_per_class: int = 5, classes: int = 3) -> Path:
    jpeg = image_bytes("JPEG")
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True)
        for i in range(n_per_class):
            (root / f"class_{c}" / f"img_{i}.jpg").write_bytes(jpeg)
    return root


def test_walk_counts_files_and_directories(tmp_path: Path) -> None:
    root = dataset(tmp_path / "ds")
    (root / "class_0" / "nested").mkdir()
    (root / "class_0" / "nested" / "x.bin").write_bytes(b"abc")
    facts = walk(str(root))
    assert len(facts.files) == 16 and facts.complete
    assert sorted(facts.files_per_dir.values()) == [1, 5, 5, 5]
    assert facts.total_bytes == 15 * len(image_bytes("JPEG")) + 3


def test_walk_is_bounded(tmp_path: Path) -> None:
    root = dataset(tmp_path / "ds")
    facts = walk(str(root), max_files=4)
    assert not facts.complete and "4 files" in facts.stop_reason
    ticks = iter(range(1000))
    timed = walk(str(root), seconds=0.5, clock=lambda: float(next(ticks)))
    assert not timed.complete and "after 0.5 s" in timed.stop_reason
    assert timed.files == [] and check_files(timed).status == "unknown"  # stopped in the top folder: no claim
    ticks = iter(range(1000))
    partial = walk(str(root), seconds=1.5, clock=lambda: float(next(ticks)))
    assert len(partial.files) == 5 and check_files(partial).value.startswith("at least 5 files")


def test_headers_find_misnamed_files_and_image_sizes(tmp_path: Path) -> None:
    root = dataset(tmp_path / "ds")
    (root / "class_0" / "fake.jpg").write_bytes(image_bytes("PNG", (640, 480)))
    facts = walk(str(root))
    read_headers(facts)
    assert facts.formats == Counter({"jpeg": 15, "png": 1})
    assert [Path(p).name for p, fmt in facts.suffix_mismatches] == ["fake.jpg"]
    formats = check_formats(facts)
    assert formats.status == "warn" and "fake.jpg is png" in formats.value
    sizes = check_image_sizes(facts)
    assert sizes.status == "pass" and sizes.data["p50"] == [64, 48] and sizes.data["sampled"] == 16


def test_large_images_warn() -> None:
    facts = DatasetFacts(root="/d", image_sizes=[(4000, 3000)] * 5 + [(64, 64)])
    check = check_image_sizes(facts)
    assert check.status == "warn" and check.data["median_pixels"] == 12_000_000


def test_image_sizes_without_images() -> None:
    assert check_image_sizes(DatasetFacts(root="/d")).status == "n/a"
    assert check_image_sizes(DatasetFacts(root="/d", image_error="no Pillow")).status == "unknown"


def test_residency_is_measured_and_bounded(tmp_path: Path) -> None:
    root = dataset(tmp_path / "ds")
    (root / "empty.bin").write_bytes(b"")
    facts = walk(str(root))
    measure_residency(facts)
    if facts.residency_error:
        pytest.skip(facts.residency_error)
    assert facts.residency_sampled_files == 16
    assert 0 <= facts.resident_bytes <= facts.residency_sampled_bytes == facts.total_bytes
    check = check_page_cache(facts)
    assert check.status == "pass" and "all files" in check.value


def test_residency_unknown_when_not_measured() -> None:
    check = check_page_cache(DatasetFacts(root="/d", residency_error="page-cache residency needs Linux"))
    assert check.status == "unknown" and "Linux" in check.value


def fake_files(n: int, size: int, per_dir: int = 1000) -> DatasetFacts:
    facts = DatasetFacts(root="/data/train")
    facts.files = [(f"/data/train/d{i // per_dir}/f{i}.jpg", size) for i in range(n)]
    facts.files_per_dir = Counter(f"/data/train/d{i // per_dir}" for i in range(n))
    return facts


def bench(random_rate_files: int, seq_bytes_per_s: float, cold: bool = True) -> BenchResult:
    resident = 0.0 if cold else 1.0
    return BenchResult(cap_bytes=10 << 20, seconds_budget=3.0,
                       random=Phase(random_rate_files, random_rate_files * 100_000, 1.0, resident),
                       cached=Phase(random_rate_files, random_rate_files * 100_000, 0.1, 1.0),
                       sequential=Phase(1, int(seq_bytes_per_s), 1.0, resident),
                       sequential_kind="large files, 1 MiB reads")


def test_layout_many_small_files_recommends_packing_with_measured_gain() -> None:
    facts = fake_files(20_000, 100_000)
    check = check_layout(facts, "local", bench(200, 200 * 100_000 * 5))
    assert check.status == "warn"
    assert check.data["packing_gain"] == pytest.approx(5.0)
    assert "stallscope pack" in check.fix and "5.0x" in check.fix


def test_layout_few_files_on_local_disk_passes() -> None:
    check = check_layout(fake_files(2_000, 100_000), "local", bench(2000, 2000 * 100_000, cold=False))
    assert check.status == "pass" and "not measured" in check.value


def test_layout_small_files_on_network_storage_warns_without_bench() -> None:
    check = check_layout(fake_files(500, 50_000), "network", None)
    assert check.status == "warn" and "many small files" in check.fix


def test_layout_huge_directory_warns() -> None:
    check = check_layout(fake_files(150_000, 5 << 20, per_dir=150_000), "local", None)
    assert check.status == "warn" and "huge directory" in check.fix


def test_filesystem_kinds(tmp_path: Path) -> None:
    root = dataset(tmp_path / "ds")
    facts = walk(str(root))
    host_root = tmp_path / "fake"
    (host_root / "proc").mkdir(parents=True)
    mounts = host_root / "proc" / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nsrv:/x {root.resolve()} nfs4 rw 0 0\n")
    host = Host(host_root, environ={})
    nfs = check_filesystem(host, facts)
    assert nfs.status == "warn" and nfs.data["fs_type"] == "nfs4" and nfs.data["kind"] == "network"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nbucket {root.resolve()} fuse.gcsfuse rw 0 0\n")
    assert check_filesystem(host, facts).data["kind"] == "network"
    mounts.write_text("overlay / overlay rw 0 0\n")
    overlay = check_filesystem(host, facts)
    assert overlay.status == "pass" and "lower layer" in overlay.value
    mounts.unlink()
    mounts.mkdir()
    unknown = check_filesystem(host, facts)
    assert unknown.status == "unknown" and "is a directory" in unknown.value


def test_vs_ram() -> None:
    facts = fake_files(1000, 1 << 20)
    assert check_vs_ram(facts, 64 << 30).status == "pass"
    assert check_vs_ram(facts, 1 << 30).status == "warn"
    assert check_vs_ram(facts, None).status == "unknown"


def test_empty_folder_fails(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert check_files(walk(str(tmp_path / "empty"))).status == "fail"


def test_validate_data_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        validate_data_dir(tmp_path / "missing")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        validate_data_dir(tmp_path / "f.txt")
    assert validate_data_dir(tmp_path) == tmp_path


def test_run_doctor_on_fake_machine_and_real_folder(tmp_path: Path) -> None:
    root = dataset(tmp_path / "ds")
    fake = tmp_path / "fake"
    (fake / "proc").mkdir(parents=True)
    (fake / "proc" / "meminfo").write_text("MemTotal: 1048576 kB\n")
    report = run_doctor(root, root=fake, environ={}, gpu=False, bench_seconds=1.0)
    ids = [c.id for c in report.checks]
    assert ids[:6] == ["cpu.usable", "memory", "shm", "nofile", "cpu.governor", "numa"]
    assert {"dataset.files", "dataset.layout", "storage.bench", "dataset.vs_ram"} <= set(ids)
    assert report.by_id("dataset.files").data["files"] == 15
    assert report.by_id("dataset.vs_ram").data["memory_bytes"] == 1 << 30
    assert report.by_id("dataset.filesystem").status == "unknown"  # the fake tree has no /proc/mounts
    bench_check = report.by_id("storage.bench")
    assert bench_check.data["bytes_read"] <= bench_check.data["cap_bytes"]


def test_run_doctor_without_dataset_marks_it_not_applicable(tmp_path: Path) -> None:
    report = run_doctor(root=tmp_path, environ={}, gpu=False)
    assert report.checks[-1].id == "dataset" and report.checks[-1].status == "n/a"


def test_quick_checks_do_not_import_torch() -> None:
    code = ("import sys; from stallscope.health import quick_checks; checks = quick_checks(); "
            "print(len(checks), 'torch' in sys.modules, 'torchvision' in sys.modules, 'cv2' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    n, torch_loaded, tv_loaded, cv2_loaded = out.stdout.split()
    assert int(n) >= 10 and (torch_loaded, tv_loaded, cv2_loaded) == ("False", "False", "False")


def test_unreadable_folder_is_a_clear_error_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Root can list any folder, so the listing itself is made to raise PermissionError."""
    import argparse
    import os

    from stallscope.cli import doctor_cmd

    real_scandir = os.scandir

    def scandir(path):
        if Path(path) == tmp_path:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(PermissionError, match="cannot be listed: permission denied"):
        validate_data_dir(tmp_path)
    parser = argparse.ArgumentParser()
    doctor_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["doctor", str(tmp_path)])
    assert args.handler(args) == 2
    assert "cannot be listed" in capsys.readouterr().err


def test_decode_sample_finds_truncated_and_corrupt_jpegs_whose_headers_are_fine(tmp_path: Path) -> None:
    pytest.importorskip("simplejpeg")  # Pillow alone decodes a zeroed scan into garbage without a word
    from stallscope.demo.dataset import DatasetSpec, make_dataset
    from stallscope.health.dataset import check_decode
    from stallscope.health.dataset_scan import decode_sample

    root = make_dataset(tmp_path / "photos", DatasetSpec(n_files=30, width=200, height=160, seed=3))
    files = sorted(root.rglob("*.jpg"))
    truncated, corrupt = files[3], files[7]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    blob = bytearray(corrupt.read_bytes())
    blob[len(blob) // 2: len(blob) // 2 + 2000] = b"\0" * 2000  # zeroed mid-file, as a bad sector reads
    corrupt.write_bytes(bytes(blob))
    facts = walk(str(root))
    read_headers(facts)
    assert check_image_sizes(facts).status == "pass" and facts.image_errors == 0  # the headers hide them
    decode_sample(facts)
    assert facts.decoded == 30
    assert sorted(Path(p).name for p, _ in facts.decode_failures) == sorted([truncated.name, corrupt.name])
    check = check_decode(facts)
    assert check.status == "warn" and check.value.startswith("28 of 30 sampled images decode in full")
    assert check.data["failed"] == 2 and "stallscope pack" in check.fix


def test_decode_sample_is_bounded_by_time() -> None:
    from stallscope.health.dataset_scan import decode_sample

    ticks = iter(range(100))
    facts = DatasetFacts(root="x", image_sampled=["/nonexistent/a.jpg"] * 10)
    decode_sample(facts, seconds=2.5, clock=lambda: float(next(ticks)))
    assert facts.decoded == 2  # started at 0, decoded at 1 and 2 s of the injected clock; 3 s is past the budget
    assert all("No such file" in why for _, why in facts.decode_failures)


def test_storage_bench_names_unreadable_files_instead_of_saying_none_could_be_read(tmp_path: Path) -> None:
    from stallscope.health.dataset import check_storage
    from stallscope.health.storage_bench import run_bench

    files = []
    for k in range(40):
        path = tmp_path / f"f{k}.bin"
        path.write_bytes(b"x" * 4096)
        files.append((str(path), 4096))
    gone = tmp_path / "removed-after-listing.jpg"
    one_bad = run_bench([(str(gone), 4096), *files], cap_bytes=1 << 20, seconds=5)
    check = check_storage(one_bad)
    assert "none of" not in check.value and "1 file(s) could not be read" in check.value
    assert "removed-after-listing.jpg" in check.value
    all_bad = check_storage(run_bench([(str(gone), 4096)], cap_bytes=1 << 20, seconds=5))
    assert all_bad.status == "unknown" and "none of the 1 files tried could be read" in all_bad.value
