"""Where the images are: an ImageFolder tree or a file list of ``path,label`` lines.

Both the datasets and ``stallscope pack`` start from the same (path, label) list, built in a
deterministic order, so a packed dataset's record ``i`` is the folder dataset's sample ``i``.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path

from stallscope.data.files import not_regular, read_regular

#: torchvision's IMG_EXTENSIONS, lower case.
IMAGE_EXTENSIONS: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
)


class SourceError(ValueError):
    """The source is missing, empty or malformed; the message says which and why."""


@dataclass(frozen=True)
class SourceList:
    """An ordered list of (path, label) with the class names the labels index."""

    root: Path
    samples: tuple[tuple[Path, int], ...]
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.samples)


def find_classes(root: Path) -> tuple[str, ...]:
    """Sorted sub-folder names, as torchvision's ``ImageFolder`` labels them."""
    return tuple(sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith(".")))


def list_image_folder(root: str | os.PathLike[str], extensions: tuple[str, ...] = IMAGE_EXTENSIONS) -> SourceList:
    """(path, class index) for every image under ``root/<class>/``, sorted like torchvision's."""
    root = Path(root)
    if not root.exists():
        raise SourceError(f"{root}: no such folder")
    if not root.is_dir():
        raise SourceError(f"{root}: not a folder (give an ImageFolder tree root/<class>/<image>, or a file list)")
    try:
        classes = find_classes(root)
    except OSError as exc:
        raise SourceError(f"{root}: cannot read this folder ({exc.strerror})") from exc
    if not classes:
        raise SourceError(f"{root}: no class folders (expected root/<class>/<image>)")
    exts = tuple(e.lower() for e in extensions)
    samples: list[tuple[Path, int]] = []

    def unreadable(exc: OSError) -> None:  # os.walk would skip the folder, and every image in it, without a word
        raise SourceError(f"{exc.filename}: cannot read this folder ({exc.strerror}); its images would be left out: "
                          f"fix its permissions, or move it out of {root}")

    for label, name in enumerate(classes):
        # the folders each folder is inside: a link back to one of them (or to the root) is a loop, not followed
        above: dict[str, frozenset[tuple[int, int] | None]] = {str(root / name): frozenset({_folder_id(root)})}
        for dirpath, dirnames, filenames in os.walk(root / name, onerror=unreadable, followlinks=True):
            here = above.pop(dirpath, frozenset()) | {_folder_id(dirpath)}
            dirnames[:] = sorted(d for d in dirnames if (_folder_id(os.path.join(dirpath, d)) or ()) not in here)
            above.update((os.path.join(dirpath, d), here) for d in dirnames)
            # every file named like an image, regular or not: a device, FIFO or socket is named when it is read
            samples.extend((Path(dirpath) / filename, label) for filename in sorted(filenames)
                           if filename.lower().endswith(exts))
    if not samples:
        raise SourceError(f"{root}: class folders hold no images with extensions {', '.join(exts)}")
    return SourceList(root, tuple(samples), classes)


def _folder_id(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """The folder's identity (device, inode); None where it cannot be looked at."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def regular_only(source: SourceList) -> tuple[SourceList, list[tuple[Path, str]]]:
    """``source`` less its devices, FIFOs, sockets and folders, and those left out with the reason for each:
    for a dataset, which would block or never end on reading one hours into training."""
    kept: list[tuple[Path, int]] = []
    left_out: list[tuple[Path, str]] = []
    for path, label in source.samples:
        reason = not_regular(path)
        if reason is None:
            kept.append((path, label))
        else:
            left_out.append((path, reason))
    if not left_out:
        return source, []
    return SourceList(source.root, tuple(kept), source.classes), left_out


def read_file_list(list_path: str | os.PathLike[str]) -> SourceList:
    """Parse ``path,label`` lines (CSV; relative paths are relative to the list's folder).

    Labels are integers used as they are, or names mapped to indices in sorted order. Blank
    lines and lines starting with ``#`` are ignored, and so is a header line (``path,label``, ``filename,class``):
    a first line whose path is one word, no file of that name beside the list.
    """
    list_path = Path(list_path)
    try:
        raw = read_regular(list_path)
    except FileNotFoundError:
        raise SourceError(f"{list_path}: no such file list") from None
    except OSError as exc:
        raise SourceError(f"{list_path}: cannot read this file list ({exc.strerror or exc})") from exc
    base = list_path.parent
    rows: list[tuple[Path, str]] = []
    with io.TextIOWrapper(io.BytesIO(raw), newline="") as fh:  # the encoding open() would have used
        for lineno, row in enumerate(csv.reader(fh), start=1):
            if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
                continue
            if len(row) < 2:
                raise SourceError(f"{list_path}:{lineno}: expected 'path,label', got {','.join(row)!r}")
            path = Path(row[0].strip())
            if not rows and _is_header(row[0].strip(), base):
                continue
            rows.append((path if path.is_absolute() else base / path, row[1].strip()))
    if not rows:
        raise SourceError(f"{list_path}: the file list is empty")
    if all(label.lstrip("-").isdigit() for _, label in rows):
        labels = [int(label) for _, label in rows]
        if min(labels) < 0:
            raise SourceError(f"{list_path}: labels must be non-negative integers")
        classes = tuple(str(i) for i in range(max(labels) + 1))
        return SourceList(base, tuple((p, lab) for (p, _), lab in zip(rows, labels)), classes)
    classes = tuple(sorted({label for _, label in rows}))
    index = {name: i for i, name in enumerate(classes)}
    return SourceList(base, tuple((p, index[label]) for p, label in rows), classes)


def _is_header(first: str, base: Path) -> bool:
    """Whether a file list's first path is a column's name: one word (no folder, no suffix), naming no file."""
    return first.replace("_", "").isalnum() and not (base / first).exists()


def open_source(src: str | os.PathLike[str]) -> SourceList:
    """A folder is an ImageFolder tree; a file is a ``path,label`` list."""
    path = Path(src)
    if path.is_file():
        return read_file_list(path)
    reason = None if path.is_dir() else not_regular(path)
    if reason:
        raise SourceError(f"{path}: {reason}; give an ImageFolder tree (root/<class>/<image>) or a file list")
    return list_image_folder(path)
