"""The crop a training's transform takes, read from the dataset when its DataLoader is built.

Why: ``pack --max-side auto`` sizes each image for that crop (``data/crop_fit.py``); the decode advice names the
command with the run's own values rather than torchvision's defaults. Read by attribute, never by calling the
transform: torchvision's ``RandomResizedCrop`` (v1 and v2), timm's ``RandomResizedCropAndInterpolation``,
stallscope's own crops, and an evaluation's ``Resize`` followed by ``CenterCrop``.
"""

from __future__ import annotations

import inspect
from typing import Any

#: How deep to look through wrappers (Subset, ConcatDataset, Compose, StandardTransform) for the transform.
_MAX_DEPTH = 6


def _attr(obj: Any, name: str) -> Any:
    """``obj.name`` as stored on the object or its class, never through a property or ``__getattr__``: reading a
    user's dataset must not run its code (a lazy attribute that opens a database before the workers fork)."""
    value = inspect.getattr_static(obj, name, None)
    if (inspect.isdatadescriptor(value) or inspect.ismethoddescriptor(value) or inspect.isfunction(value)
            or isinstance(value, (staticmethod, classmethod))):
        return None  # a property, a method, a function: not a stored transform
    return value


def _pair(size: Any) -> tuple[int, int] | None:
    """(height, width) from an int or a one- or two-element sequence, as torchvision takes it."""
    if isinstance(size, int) and size > 0:
        return size, size
    if isinstance(size, (list, tuple)) and len(size) in (1, 2) and all(isinstance(v, int) and v > 0 for v in size):
        return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])
    return None


def _range(value: Any) -> tuple[float, float] | None:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        low, high = float(value[0]), float(value[1])
        return (low, high) if 0 < low <= high else None
    return None


def _random_resized(step: Any) -> dict[str, Any] | None:
    if "RandomResizedCrop" not in type(step).__name__:
        return None
    size, scale, ratio = _pair(_attr(step, "size")), _range(_attr(step, "scale")), _range(_attr(step, "ratio"))
    if size is None or scale is None or ratio is None:
        return None
    return {"kind": "RandomResizedCrop", "size": list(size), "scale": list(scale), "ratio": list(ratio)}


def _steps(transform: Any) -> list[Any]:
    """A transform's steps in order: a Compose's list, else the transform itself."""
    inner = _attr(transform, "transforms")
    return list(inner) if isinstance(inner, (list, tuple)) else [transform]


def crop_of_transform(transform: Any) -> dict[str, Any] | None:
    """The crop of one transform (a pipeline of steps), or None where it takes none this can read."""
    steps = _steps(transform)
    for i, step in enumerate(steps):
        if (found := _random_resized(step)) is not None:
            return found
        name = type(step).__name__
        if name == "ResizeCenterCrop" and isinstance(_attr(step, "resize"), int):  # stallscope's own
            return {"kind": "Resize", "resize_shorter": _attr(step, "resize")}
        if name == "Resize" and isinstance(_attr(step, "size"), (int, list, tuple)):
            size = _attr(step, "size")
            shorter = size if isinstance(size, int) else size[0] if len(size) == 1 else None
            if shorter and any(type(later).__name__ == "CenterCrop" for later in steps[i + 1:]):
                return {"kind": "Resize", "resize_shorter": int(shorter)}
    return None


def training_crop(dataset: Any, depth: int = 0) -> dict[str, Any] | None:
    """The crop the dataset's transform takes, looking through the usual wrappers; None where none is found."""
    if dataset is None or depth > _MAX_DEPTH:
        return None
    for name in ("crop", "transform", "transforms"):  # FastImageFolder's crop; torchvision's and timm's transform
        inner = _attr(dataset, name)
        if inner is not None and (found := crop_of_transform(inner)) is not None:
            return found
    inner = _attr(dataset, "transform")  # a StandardTransform or a wrapper holding the Compose
    if inner is not None and inner is not dataset and (found := training_crop(inner, depth + 1)) is not None:
        return found
    for name in ("dataset", "datasets"):  # Subset, ConcatDataset, framework wrappers
        inner = _attr(dataset, name)
        inner = inner[0] if isinstance(inner, (list, tuple)) and inner else inner
        if inner is not None and inner is not dataset and not isinstance(inner, (list, tuple)):
            found = training_crop(inner, depth + 1)
            if found is not None:
                return found
    return None
