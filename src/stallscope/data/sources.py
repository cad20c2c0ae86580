"""Where the images are: an ImageFolder tree or a file list of ``path,label`` lines.

Both the datasets and ``stallscope pack`` start from the same (path, label) list, built in a
deterministic order, so a packed dataset's record ``i`` is the folder dataset's sample ``i``.
"""

from __future__ import annotations

import csv
import os
import stat
from dataclasses import dataclass
from pathlib import Path

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
        for dirpath, dirnames, filenames in os.walk(root / name, onerror=unreadable, followlinks=True):
            dirnames.sort()
            for filename in sorted(filenames):
                if filename.lower().endswith(exts) and not _special(Path(dirpath) / filename):
                    samples.append((Path(dirpath) / filename, label))
    if not samples:
        raise SourceError(f"{root}: class folders hold no images with extensions {', '.join(exts)}")
    return SourceList(root, tuple(samples), classes)


def _special(path: Path) -> bool:
    """A FIFO, socket or device named like an image: reading one would block or never end, so it is not
    listed (a dangling link is listed, and reported as unreadable when read)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def read_file_list(list_path: str | os.PathLike[str]) -> SourceList:
    """Parse ``path,label`` lines (CSV; relative paths are relative to the list's folder).

    Labels are integers used as they are, or names mapped to indices in sorted order. Blank
    lines and lines starting with ``#`` are ignored, and so is a header line (``path,label``, ``filename,class``):
    a first line whose path is one word, no file of that name beside the list.
    """
    list_path = Path(list_path)
    if not list_path.is_file():
        raise SourceError(f"{list_path}: no such file list")
    base = list_path.parent
    rows: list[tuple[Path, str]] = []
    with open(list_path, newline="") as fh:
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
    return list_image_folder(path)
