"""Facts about a dataset folder: files and sizes, directory fan-out, formats by magic bytes, image sizes from headers,
and page-cache residency.

The walk is bounded by time and file count so a million-file dataset on NFS cannot stall the doctor; when it
stops early the facts say so. Residency is asked before any file is opened for reading, because reading headers
would warm the very cache it measures.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from stallscope.data.files import describe, not_regular, open_regular, read_regular
from stallscope.health import pagecache

#: (format, offset, magic); checked in order, first match wins.
MAGIC: tuple[tuple[str, int, bytes], ...] = (
    ("jpeg", 0, b"\xff\xd8\xff"),
    ("png", 0, b"\x89PNG\r\n\x1a\n"),
    ("gif", 0, b"GIF8"),
    ("tiff", 0, b"II*\x00"),
    ("tiff", 0, b"MM\x00*"),
    ("jpeg2000", 0, b"\x00\x00\x00\x0cjP  "),
    ("hdf5", 0, b"\x89HDF\r\n\x1a\n"),
    ("npy", 0, b"\x93NUMPY"),
    ("zip", 0, b"PK\x03\x04"),
    ("gzip", 0, b"\x1f\x8b"),
    ("zstd", 0, b"\x28\xb5\x2f\xfd"),
    ("parquet", 0, b"PAR1"),
    ("flac", 0, b"fLaC"),
    ("ogg", 0, b"OggS"),
    ("mp3", 0, b"ID3"),
    ("lmdb", 16, b"\xde\xc0\xef\xbe"),
    ("tar", 257, b"ustar"),
    ("bmp", 0, b"BM"),
)
IMAGE_FORMATS = frozenset({"jpeg", "png", "gif", "webp", "tiff", "bmp", "jpeg2000", "heif/avif"})
SUFFIX_FORMAT = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png", ".gif": "gif", ".webp": "webp", ".tif": "tiff",
                 ".tiff": "tiff", ".bmp": "bmp", ".npy": "npy", ".tar": "tar", ".zip": "zip", ".npz": "zip",
                 ".parquet": "parquet", ".h5": "hdf5", ".hdf5": "hdf5", ".flac": "flac", ".mp3": "mp3",
                 ".json": "text", ".txt": "text", ".csv": "text"}
HEADER_BYTES = 512


def sniff(head: bytes) -> str:
    """The format of a file from its first bytes; never from its name."""
    if not head:
        return "empty"
    if head[:4] == b"RIFF" and len(head) >= 12:
        return {b"WEBP": "webp", b"WAVE": "wav", b"AVI ": "avi"}.get(head[8:12], "riff")
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        return "heif/avif" if brand in (b"avif", b"avis", b"heic", b"heix", b"mif1") else "mp4"
    for name, offset, magic in MAGIC:
        if head[offset:offset + len(magic)] == magic:
            return name
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "pickle"
    try:
        text = head.decode("utf-8")
        if all(ch.isprintable() or ch in "\r\n\t" for ch in text):
            return "text"
    except UnicodeDecodeError:
        pass
    return "unknown"


def percentile(sorted_values: list[float] | list[int], q: float) -> float:
    """Nearest-rank percentile of already sorted values (``q`` in 0..100)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(0, min(len(sorted_values) - 1, int(round(q / 100 * (len(sorted_values) - 1)))))
    return float(sorted_values[rank])


@dataclass
class DatasetFacts:
    root: str
    files: list[tuple[str, int]] = field(default_factory=list)
    files_per_dir: dict[str, int] = field(default_factory=dict)
    complete: bool = True
    stop_reason: str | None = None
    unreadable_dirs: int = 0
    scan_s: float = 0.0
    resident_bytes: int | None = None
    residency_sampled_bytes: int = 0
    residency_sampled_files: int = 0
    residency_error: str | None = None
    formats: Counter[str] = field(default_factory=Counter)
    suffix_mismatches: list[tuple[str, str]] = field(default_factory=list)
    header_sampled: list[str] = field(default_factory=list)
    image_sizes: list[tuple[int, int]] = field(default_factory=list)
    image_errors: int = 0
    image_error: str | None = None
    image_sampled: list[str] = field(default_factory=list)  # sampled files whose bytes are an image
    not_regular: list[tuple[str, str]] = field(default_factory=list)  # (path, why): devices, FIFOs, sockets: not read
    decoded: int = 0  # sampled images decoded in full
    decode_failures: list[tuple[str, str]] = field(default_factory=list)  # (path, why) of those that did not

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)

    @property
    def resident_fraction(self) -> float | None:
        if self.resident_bytes is None or self.residency_sampled_bytes == 0:
            return None
        return self.resident_bytes / self.residency_sampled_bytes


def walk(root: str, max_files: int = 2_000_000, seconds: float = 5.0,
         clock: Callable[[], float] = time.perf_counter) -> DatasetFacts:
    """Every regular file under ``root`` (symlinks followed, directories once), within a file and time budget;
    devices, FIFOs and sockets are named apart (a loader reading one would never end, or wait for ever)."""
    facts = DatasetFacts(root=root)
    start = clock()
    stack = [root]
    seen_dirs: set[tuple[int, int]] = set()
    while stack:
        d = stack.pop()
        try:
            st = os.stat(d)
            if (st.st_dev, st.st_ino) in seen_dirs:
                continue
            seen_dirs.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(d))
        except OSError:
            facts.unreadable_dirs += 1
            continue
        count = 0
        for i, entry in enumerate(sorted(entries, key=lambda e: e.name)):
            if i % 4096 == 4095 and clock() - start > seconds:
                break  # one huge directory on slow storage must not outlast the budget either
            try:
                if entry.is_dir():
                    stack.append(entry.path)
                elif entry.is_file():
                    facts.files.append((entry.path, entry.stat().st_size))
                    count += 1
                elif (reason := not_regular(entry.path)) is not None:
                    facts.not_regular.append((entry.path, reason))
            except OSError:
                continue
        if count:
            facts.files_per_dir[d] = count
        if len(facts.files) >= max_files:
            facts.complete, facts.stop_reason = False, f"stopped at {max_files:,} files"
            break
        if clock() - start > seconds:
            facts.complete, facts.stop_reason = False, f"stopped after {seconds:g} s"
            break
    facts.scan_s = clock() - start
    return facts


def measure_residency(facts: DatasetFacts, max_files: int = 5000, seed: int = 0) -> None:
    """Page-cache residency over all files, or a random sample of ``max_files`` (bytes-weighted)."""
    reason = pagecache.available()
    if reason:
        facts.residency_error = reason
        return
    files = facts.files if len(facts.files) <= max_files else random.Random(seed).sample(facts.files, max_files)
    resident = sampled = 0
    errors: Counter[str] = Counter()
    for path, _ in files:
        try:
            r, size = pagecache.resident_bytes(path)
        except (OSError, pagecache.ResidencyUnavailable) as exc:
            errors[type(exc).__name__] += 1
            continue
        resident += r
        sampled += size
        facts.residency_sampled_files += 1
    if facts.residency_sampled_files == 0 and files:
        facts.residency_error = f"no file could be mapped ({dict(errors)})"
        return
    facts.resident_bytes, facts.residency_sampled_bytes = resident, sampled


def read_headers(facts: DatasetFacts, max_files: int = 256, max_images: int = 200, seed: int = 1) -> None:
    """Formats by magic bytes and image sizes from headers, on a random sample."""
    files = facts.files if len(facts.files) <= max_files else random.Random(seed).sample(facts.files, max_files)
    images: list[str] = []
    for path, _ in files:
        try:
            head = read_regular(path, HEADER_BYTES)
        except OSError:
            facts.formats["unreadable"] += 1
            continue
        fmt = sniff(head)
        facts.formats[fmt] += 1
        facts.header_sampled.append(path)
        if fmt in IMAGE_FORMATS and len(images) < max_images:
            images.append(path)
            facts.image_sampled.append(path)
        expected = SUFFIX_FORMAT.get(os.path.splitext(path)[1].lower())
        if expected is not None and expected != fmt:
            facts.suffix_mismatches.append((path, fmt))
    if not images:
        return
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        facts.image_error = "Pillow is not installed: image sizes need its header parser"
        return
    for path in images:
        try:
            with open_regular(path) as fh, Image.open(fh) as im:  # reads the header only; pixels are decoded lazily
                facts.image_sizes.append(im.size)
        except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError):
            facts.image_errors += 1


def decode_sample(facts: DatasetFacts, max_images: int = 48, seconds: float = 2.0,
                  clock: Callable[[], float] = time.perf_counter) -> None:
    """Decode sampled images in full, as pack does: a header can be intact in a truncated or corrupt file,
    which then fails (or yields garbage) in a training run hours later. Bounded by count and time."""
    try:
        from stallscope.data.headers import HeaderError, read_header
        from stallscope.data.packing.prepare import full_decode_check
    except ImportError as exc:  # Pillow missing: the image checks say so already
        facts.image_error = facts.image_error or f"cannot decode images: {exc}"
        return
    started = clock()
    for path in facts.image_sampled[:max_images]:
        if clock() - started > seconds:
            break
        try:
            data = read_regular(path)
            problem = _decode_problem(data, read_header(data).is_jpeg, full_decode_check)
        except OSError as exc:
            problem = describe(exc)
        except HeaderError as exc:
            problem = str(exc)
        if problem:
            facts.decode_failures.append((path, problem))
        facts.decoded += 1


def _decode_problem(data: bytes, is_jpeg: bool, full_decode_check: Callable[[bytes, bool], None]) -> str | None:
    """Why the image does not decode cleanly, or None. Stricter than pack: libjpeg's data errors (zeroed or
    garbled scans, which Pillow decodes into garbage pixels without a word) count as problems here."""
    data_error = None
    if is_jpeg:
        try:
            import simplejpeg

            simplejpeg.decode_jpeg(data, strict=True)
            return None
        except ImportError:
            pass
        except ValueError as exc:
            data_error = str(exc)
    try:
        full_decode_check(data, is_jpeg)
    except Exception as exc:  # noqa: BLE001 - any decoder failure means the file is unusable
        return f"does not decode: {exc}"
    return f"decodes with data errors ({data_error})" if data_error else None
