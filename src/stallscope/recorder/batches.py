"""What a batch is made of, looked at once per iterator: size in bytes, tensor count, pinnability.

Done on the first batch only, so the per-batch hot path stays an append. The answers feed the
pitfall checks: /dev/shm headroom (bytes in flight), float32 batches that could travel as uint8,
and custom batch types that ``pin_memory`` silently leaves in pageable memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def describe_batch(batch: Any) -> dict[str, Any]:
    stats = {"tensors": 0, "nbytes": 0, "dtypes": {}, "unpinnable": [], "type": type(batch).__name__}
    _walk(batch, stats, depth=0)
    stats["pinnable"] = not stats["unpinnable"]
    return stats


def _walk(obj: Any, stats: dict[str, Any], depth: int) -> None:
    if depth > 6:
        return
    numel = getattr(obj, "numel", None)
    if callable(numel) and hasattr(obj, "element_size") and hasattr(obj, "dtype"):
        nbytes = obj.numel() * obj.element_size()
        stats["tensors"] += 1
        stats["nbytes"] += nbytes
        dtype = str(obj.dtype).replace("torch.", "")
        stats["dtypes"][dtype] = stats["dtypes"].get(dtype, 0) + nbytes
        return
    if isinstance(obj, (str, bytes, int, float, bool)) or obj is None:
        return
    if isinstance(obj, Mapping):
        for value in obj.values():
            _walk(value, stats, depth + 1)
        return
    if isinstance(obj, Sequence):
        for value in list(obj)[:10_000]:
            _walk(value, stats, depth + 1)
        return
    if hasattr(obj, "pin_memory"):
        return
    # torch's pin_memory returns such objects unchanged: whatever tensors they hold stay pageable.
    held = [v for v in vars(obj).values()] if hasattr(obj, "__dict__") else []
    inner: dict[str, Any] = {"tensors": 0, "nbytes": 0, "dtypes": {}, "unpinnable": []}
    for value in held:
        _walk(value, inner, depth + 1)
    stats["tensors"] += inner["tensors"]
    stats["nbytes"] += inner["nbytes"]
    for k, v in inner["dtypes"].items():
        stats["dtypes"][k] = stats["dtypes"].get(k, 0) + v
    stats["unpinnable"].append(type(obj).__name__)
