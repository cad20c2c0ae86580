"""Host-to-device copies (``Tensor.to``/``Tensor.cuda``) once CUDA is in use.

Installed only after the script itself initialises CUDA, so we never touch CUDA first (which
would break a script that forks workers before using the GPU) and CPU-only runs pay nothing.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from stallscope.recorder import cuda_timing, events

_perf = time.perf_counter_ns
_installed = False


def _wrap_copy(original: Any, name: str) -> Any:
    @functools.wraps(original)
    def copy(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.device.type != "cpu":
            return original(self, *args, **kwargs)
        t0 = _perf()
        nbytes = self.numel() * self.element_size()
        if name == "cuda" or _targets_cuda(args, kwargs):
            result = cuda_timing.time_copy(lambda: original(self, *args, **kwargs), nbytes)
        else:
            result = original(self, *args, **kwargs)
        if result is not self and result.device.type != "cpu":
            events.emit("h2d", t0, _perf(), nbytes, bool(self.is_pinned()), _non_blocking(name, args, kwargs), name)
        return result

    return copy


def _non_blocking(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The copy's ``non_blocking``, by keyword or in its place: ``.cuda(device, non_blocking)``, and
    ``.to(device, dtype, non_blocking)`` as ``Module.to`` calls it (``.to(other_tensor, non_blocking)`` too)."""
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    if name == "cuda":
        return len(args) > 1 and bool(args[1])
    flags = [a for a in args[1:] if isinstance(a, bool)]  # after the device (or tensor): dtype, then the flag
    return bool(flags[0]) if flags else False


def _targets_cuda(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` names a CUDA device (dtype-only calls stay on the host)."""
    target = kwargs.get("device", args[0] if args else None)
    if target is None:
        return False
    if isinstance(target, int):
        return True
    if isinstance(target, str):
        return target.startswith("cuda")
    device = getattr(target, "device", target)  # a tensor argument: its device
    return getattr(device, "type", None) == "cuda"


def install_after_cuda_init(torch_cuda: Any) -> None:
    original_lazy_init = torch_cuda._lazy_init

    @functools.wraps(original_lazy_init)
    def _lazy_init() -> None:
        global _installed
        original_lazy_init()
        if not _installed:
            _installed = True
            import torch

            # torch's own methods, wrapped in place: the script's calls are the ones measured
            torch.Tensor.to = _wrap_copy(torch.Tensor.to, "to")  # type: ignore[method-assign]
            torch.Tensor.cuda = _wrap_copy(torch.Tensor.cuda, "cuda")  # type: ignore[method-assign]
            events.emit("cuda_init", _perf(), torch.cuda.get_device_name(torch.cuda.current_device()))
            if torch.utils.data.get_worker_info() is None:
                cuda_timing.enable(torch.cuda)

    torch_cuda._lazy_init = _lazy_init
