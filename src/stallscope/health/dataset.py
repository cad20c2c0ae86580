"""Dataset checks: size and layout, formats, image sizes, file system, page cache, size vs RAM, storage speed.

The order matters and is fixed in ``dataset_checks``: walk, residency (before any read), headers, benchmark.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from stallscope.health.checks import FAIL, NA, PASS, WARN, Check, fmt_bytes, fmt_rate, not_applicable, unknown
from stallscope.health.dataset_scan import (
    DatasetFacts,
    decode_sample,
    measure_residency,
    percentile,
    read_headers,
    walk,
)
from stallscope.health.host import Host, SourceError, mount_for, parse_mounts
from stallscope.health.storage_bench import BenchResult, default_cap, run_bench

#: Files below this size are "small": per-file open/seek/metadata cost rivals the transfer itself.
SMALL_FILE = 1 << 20
#: At or above this many small files, a packed format (LMDB, WebDataset shards) pays off on most storage.
MANY_FILES = 10_000
#: A directory with more entries than this is slow to list and look up on network file systems.
HUGE_DIR = 100_000
#: Median image area above which decoding full resolution for a ~224 px model input wastes most decode time.
LARGE_IMAGE_PIXELS = 1_000_000
#: A fast GPU consumes this many images per second on a ResNet-50-class model; cold storage should keep up.
MIN_COLD_FILES_PER_S = 1000

NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "afs"})
PARALLEL_FS = frozenset({"lustre", "gpfs", "beegfs", "wekafs", "pvfs2", "orangefs"})
LOCAL_FS = frozenset({"ext4", "ext3", "ext2", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "apfs", "ntfs3"})
MEMORY_FS = frozenset({"tmpfs", "ramfs"})
OVERLAY_FS = frozenset({"overlay", "aufs", "fuse-overlayfs"})


@dataclass(frozen=True)
class BenchOptions:
    """Bounds of the storage micro-benchmark; ``seconds <= 0`` skips it."""

    seconds: float = 3.0
    fraction: float = 0.05
    max_bytes: int = 256 << 20


def _fs_kind(fs_type: str) -> str:
    if fs_type in NETWORK_FS or fs_type.startswith("fuse.") or fs_type == "fuse":
        return "network"
    if fs_type in PARALLEL_FS:
        return "parallel"
    if fs_type in MEMORY_FS:
        return "memory"
    if fs_type in OVERLAY_FS:
        return "overlay"
    if fs_type in LOCAL_FS:
        return "local"
    return "other"


def filesystem_of(host: Host, data_dir: str) -> tuple[str | None, str | None, str]:
    """(fs type, mount point, reason if unknown) of the mount holding ``data_dir``."""
    try:
        mounts = parse_mounts(host.read("/proc/mounts"))
    except SourceError as exc:
        return None, None, exc.reason
    mount = mount_for(os.path.realpath(data_dir), mounts)
    if mount is None:
        return None, None, "no mount in /proc/mounts holds the dataset"
    return mount.fs_type, mount.mount_point, ""


def check_files(facts: DatasetFacts) -> Check:
    title = "dataset files and sizes"
    why = "The count and size of files decide whether per-file costs (open, metadata, seek) or bytes dominate reads."
    n = len(facts.files)
    if n == 0 and not facts.complete:
        return unknown("dataset.files", title, f"the scan {facts.stop_reason} before finding a file", why=why)
    if n == 0:
        return Check("dataset.files", title, FAIL, f"no files under {facts.root}", ">= 1 file", why,
                     "Point DATA_DIR at the folder the DataLoader reads.", {"files": 0})
    sizes = sorted(size for _, size in facts.files)
    p10, p50, p90 = (percentile(sizes, q) for q in (10, 50, 90))
    prefix = "" if facts.complete else "at least "
    value = (f"{prefix}{n:,} files, {fmt_bytes(facts.total_bytes)}; size p10 {fmt_bytes(p10)}, median "
             f"{fmt_bytes(p50)}, p90 {fmt_bytes(p90)}")
    if not facts.complete:
        value += f" (scan {facts.stop_reason})"
    data = {"files": n, "total_bytes": facts.total_bytes, "size_p10": p10, "size_p50": p50, "size_p90": p90,
            "complete": facts.complete, "scan_s": round(facts.scan_s, 3), "unreadable_dirs": facts.unreadable_dirs,
            "not_regular": [{"path": path, "why": reason} for path, reason in facts.not_regular]}
    if facts.not_regular:
        path, reason = facts.not_regular[0]
        value += f"; {len(facts.not_regular)} not regular file(s) left out, e.g. {path}: {reason}"
        return Check("dataset.files", title, WARN, value, "only regular files", why,
                     "Move devices, FIFOs and sockets out of the dataset: a DataLoader reading one blocks or never "
                     "ends (stallscope pack skips them and names each).", data)
    return Check("dataset.files", title, PASS, value, "", why, "", data)


def check_formats(facts: DatasetFacts) -> Check:
    title = "file formats (magic bytes)"
    why = ("The decoder is picked by suffix but runs on the bytes; PNGs named .jpg, or a mix of formats, take "
           "slower paths or fail in a fast decoder that only speaks JPEG.")
    sampled = sum(facts.formats.values())
    if sampled == 0:
        return unknown("dataset.formats", title, "no file could be opened for its header", why=why)
    value = ", ".join(f"{fmt} {n}" for fmt, n in facts.formats.most_common()) + f" (of {sampled} sampled)"
    data = {"formats": dict(facts.formats), "sampled": sampled, "suffix_mismatches": len(facts.suffix_mismatches)}
    if facts.suffix_mismatches:
        path, fmt = facts.suffix_mismatches[0]
        value += f"; {len(facts.suffix_mismatches)} named for another format, e.g. {os.path.basename(path)} is {fmt}"
        return Check("dataset.formats", title, WARN, value, "content matches suffix", why,
                     "Convert the mismatched files to what their names say, or rename them.", data)
    return Check("dataset.formats", title, PASS, value, "content matches suffix", why, "", data)


def check_image_sizes(facts: DatasetFacts) -> Check:
    title = "image sizes (headers)"
    why = ("Decode cost grows with pixels, not with the model's input size: decoding a 12 MP photo to crop 224x224 "
           "spends most of the worker's time on pixels that are thrown away.")
    if facts.image_error:
        return unknown("dataset.image_sizes", title, facts.image_error, why=why)
    if not facts.image_sizes:
        return not_applicable("dataset.image_sizes", title, "no images among the sampled files")
    by_area = sorted(facts.image_sizes, key=lambda wh: wh[0] * wh[1])
    p10, p50, p90 = (by_area[int(round(q * (len(by_area) - 1)))] for q in (0.1, 0.5, 0.9))
    median_px = p50[0] * p50[1]
    value = (f"p10 {p10[0]}x{p10[1]}, median {p50[0]}x{p50[1]} ({median_px / 1e6:.2f} MP), p90 {p90[0]}x{p90[1]} "
             f"(of {len(by_area)} headers" + (f", {facts.image_errors} unreadable)" if facts.image_errors else ")"))
    data = {"sampled": len(by_area), "p10": list(p10), "p50": list(p50), "p90": list(p90),
            "median_pixels": median_px, "unreadable": facts.image_errors}
    threshold = f"median <= {LARGE_IMAGE_PIXELS / 1e6:g} MP"
    if median_px > LARGE_IMAGE_PIXELS:
        return Check("dataset.image_sizes", title, WARN, value, threshold, why,
                     "Pre-resize once (shorter side 256-320 px), or decode at reduced size: PIL Image.draft(), "
                     "simplejpeg min_height/min_width, PyTurboJPEG scaling_factor.", data)
    return Check("dataset.image_sizes", title, PASS, value, threshold, why, "", data)


def check_decode(facts: DatasetFacts) -> Check:
    title = "images decode (sample)"
    why = ("A truncated or corrupt file keeps an intact header: only a full decode finds it, and in training it "
           "stops the run (or feeds garbage pixels) when its turn comes, hours in.")
    if not facts.decoded:
        if facts.image_error:
            return unknown("dataset.decode", title, facts.image_error, why=why)
        return not_applicable("dataset.decode", title, "no images among the sampled files")
    bad = facts.decode_failures
    value = f"{facts.decoded - len(bad)} of {facts.decoded} sampled images decode in full"
    data = {"decoded": facts.decoded, "failed": len(bad), "examples": [{"path": p, "why": w} for p, w in bad[:5]]}
    if bad:
        path, reason = bad[0]
        share = len(bad) / facts.decoded
        return Check("dataset.decode", title, FAIL if share >= 0.5 else WARN,
                     f"{value}; e.g. {os.path.basename(path)}: {reason}", "all decode", why,
                     "Find every bad file before training: stallscope pack SRC OUT decodes each image once and names "
                     "the ones that fail (and skips them); or re-download / re-encode them.", data)
    return Check("dataset.decode", title, PASS, value, "all decode", why, "", data)


def check_filesystem(host: Host, facts: DatasetFacts) -> Check:
    title = "dataset file system"
    why = ("On network and FUSE file systems every file open is a round trip; small files turn a 10 GB/s link into "
           "a few thousand files per second.")
    fs_type, mount_point, reason = filesystem_of(host, facts.root)
    if fs_type is None:
        return unknown("dataset.filesystem", title, reason, why=why)
    kind = _fs_kind(fs_type)
    value = f"{fs_type} ({kind}) mounted at {mount_point}"
    data = {"fs_type": fs_type, "kind": kind, "mount_point": mount_point}
    small = bool(facts.files) and percentile(sorted(s for _, s in facts.files), 50) < SMALL_FILE
    if kind == "network" or (kind == "parallel" and small):
        return Check("dataset.filesystem", title, WARN, value, "local disk or packed shards on shared storage", why,
                     "Copy the dataset to local NVMe before training, or pack it "
                     "(stallscope pack SRC OUT --format wds) so each read is a large sequential one.", data)
    if kind == "overlay":
        value += "; reads pass through to the lower layer (dataset baked into the container image)"
    return Check("dataset.filesystem", title, PASS, value, "local disk or packed shards on shared storage", why, "",
                 data)


def check_page_cache(facts: DatasetFacts) -> Check:
    title = "dataset in page cache"
    why = ("Cached files are read from RAM; the first epoch, or every epoch of a dataset larger than RAM, reads "
           "from storage instead, at the cold rate below.")
    if facts.resident_bytes is None:
        return unknown("dataset.page_cache", title, facts.residency_error or "not measured", why=why)
    frac = facts.resident_fraction or 0.0
    sampled = facts.residency_sampled_files
    scope = "all files" if sampled >= len(facts.files) else f"{sampled:,} sampled files"
    value = (f"{frac:.0%} of the bytes cached ({fmt_bytes(facts.resident_bytes)} of "
             f"{fmt_bytes(facts.residency_sampled_bytes)}, {scope})")
    return Check("dataset.page_cache", title, PASS, value, "", why, "",
                 {"resident_fraction": frac, "resident_bytes": facts.resident_bytes,
                  "sampled_bytes": facts.residency_sampled_bytes, "sampled_files": sampled})


def check_vs_ram(facts: DatasetFacts, memory_bytes: int | None) -> Check:
    title = "dataset size vs RAM"
    why = ("A dataset that fits in half the memory stays in the page cache after the first epoch; a larger one never "
           "does.")
    if memory_bytes is None:
        return unknown("dataset.vs_ram", title, "memory size unknown (see the memory check)", why=why)
    total = facts.total_bytes
    ratio = total / memory_bytes if memory_bytes else float("inf")
    value = f"{fmt_bytes(total)} dataset, {fmt_bytes(memory_bytes)} memory ({ratio:.1%})"
    data = {"dataset_bytes": total, "memory_bytes": memory_bytes, "ratio": ratio}
    if ratio > 0.5:
        return Check("dataset.vs_ram", title, WARN, value, "<= 50% of memory", why,
                     "Every epoch reads storage: make storage fast (local NVMe, packed shards), or shrink the data "
                     "(pre-resized images, lower JPEG quality).", data)
    return Check("dataset.vs_ram", title, PASS, value, "<= 50% of memory", why, "", data)


def check_storage(bench: BenchResult | None, reason: str = "") -> Check:
    title = "storage micro-benchmark"
    why = ("Random whole-file reads are what a shuffled DataLoader does; the cold rate bounds the first epoch (and "
           "every epoch when the data does not fit in RAM).")
    if bench is None:
        return not_applicable("storage.bench", title, reason or "skipped")
    r, c, s = bench.random, bench.cached, bench.sequential
    cold_desc = (f"{fmt_rate(r.rate)} ({r.files_per_s or 0:,.0f} files/s, {r.resident_before or 0:.0%} cached before)")
    value = (f"random {cold_desc}; cached re-read {fmt_rate(c.rate)} ({c.files_per_s or 0:,.0f} files/s); "
             f"sequential {fmt_rate(s.rate)} ({bench.sequential_kind}); read {fmt_bytes(bench.bytes_read)} "
             f"of a {fmt_bytes(bench.cap_bytes)} cap")
    unreadable = max(r.errors, s.errors)  # a file both passes tried counts once
    if unreadable:
        value += f"; {unreadable} file(s) could not be read (e.g. {r.first_error or s.first_error})"
    data = bench.to_dict()
    threshold = f"cold random >= {MIN_COLD_FILES_PER_S:,} files/s"
    if r.files == 0:
        if r.errors:
            return unknown("storage.bench", title, f"none of the {r.errors} files tried could be read "
                           f"(e.g. {r.first_error})", why=why, **data)
        return unknown("storage.bench", title, f"no file was read within the {fmt_bytes(bench.cap_bytes)} cap",
                       why=why, **data)
    if not bench.cold_is_cold:
        return Check("storage.bench", title, NA, value + "; cold rate not measurable: files already cached "
                     "(drop caches to measure storage: sync; echo 1 > /proc/sys/vm/drop_caches)", threshold, why, "",
                     data)
    if (r.files_per_s or 0) < MIN_COLD_FILES_PER_S:
        return Check("storage.bench", title, WARN, value, threshold, why,
                     "Pack the dataset (stallscope pack SRC OUT --format lmdb|wds), or warm the page cache / use "
                     "local NVMe.",
                     data)
    return Check("storage.bench", title, PASS, value, threshold, why, "", data)


def check_layout(facts: DatasetFacts, fs_kind: str | None, bench: BenchResult | None) -> Check:
    title = "dataset layout (packing)"
    why = ("Many small files cost one open, one metadata lookup and one short read each; packing them into large "
           "shards turns that into sequential reads.")
    if not facts.files:
        return not_applicable("dataset.layout", title, "no files")
    per_dir = sorted(facts.files_per_dir.values())
    n, median = len(facts.files), percentile(sorted(s for _, s in facts.files), 50)
    value = (f"{n:,} files in {len(per_dir):,} directories (median {percentile(per_dir, 50):,.0f}, max "
             f"{per_dir[-1]:,} per directory); median file {fmt_bytes(median)}")
    gain = bench.packing_gain if bench else None
    if gain is not None and bench is not None:
        value += f"; sequential reads measured {gain:.1f}x the random-read rate ({bench.sequential_kind})"
    elif bench is not None:
        value += "; packing gain not measured (benchmark files were already cached)"
    data = {"files": n, "directories": len(per_dir), "max_files_per_dir": per_dir[-1], "median_file_bytes": median,
            "packing_gain": gain}
    small, many = median < SMALL_FILE, n >= MANY_FILES
    threshold = (f"not (>= {MANY_FILES:,} files under {fmt_bytes(SMALL_FILE)}, or on network storage); "
                 f"<= {HUGE_DIR:,} per dir")
    reasons = []
    if small and (many or fs_kind in ("network", "parallel")):
        reasons.append("many small files")
    if small and gain is not None and gain >= 2:
        reasons.append(f"cold sequential reads are {gain:.1f}x faster here")
    if per_dir[-1] > HUGE_DIR:
        reasons.append("a huge directory")
    if reasons:
        helps = f" (the benchmark suggests up to {gain:.1f}x on storage reads)" if gain and gain > 1 else ""
        return Check("dataset.layout", title, WARN, value, threshold, why,
                     f"Pack it: stallscope pack {facts.root} OUT --format lmdb|wds{helps}; because of "
                     f"{' and '.join(reasons)}.", data)
    return Check("dataset.layout", title, PASS, value, threshold, why, "", data)


def dataset_checks(host: Host, data_dir: str, memory_bytes: int | None,
                   bench: BenchOptions = BenchOptions()) -> tuple[list[Check], DatasetFacts, BenchResult | None]:
    facts = walk(data_dir)
    measure_residency(facts)
    read_headers(facts)
    decode_sample(facts)
    result: BenchResult | None = None
    reason = ""
    if bench.seconds <= 0:
        reason = "benchmark skipped (--no-bench)"
    elif not facts.files:
        reason = "no files to read"
    else:
        cap = default_cap(facts.total_bytes, bench.fraction, bench.max_bytes)
        result = run_bench(facts.files, cap, bench.seconds, avoid=set(facts.header_sampled))
    fs_check = check_filesystem(host, facts)
    checks = [check_files(facts), check_formats(facts), check_image_sizes(facts), check_decode(facts), fs_check,
              check_page_cache(facts), check_vs_ram(facts, memory_bytes), check_storage(result, reason),
              check_layout(facts, fs_check.data.get("kind"), result)]
    return checks, facts, result
