"""What the training step is configured to compute with, recorded once each: the optimizer's shape and kernels, the
model's numerics on its first call, and DDP's settings with what its unused-parameter search costs.

These are the facts the compute findings rest on (``analysis/compute_findings.py``): an optimizer that walks
thousands of tensors one by one, mixed precision or TF32 off on a device that has the units for them, a
``find_unused_parameters=True`` that never found one. Each is read once (per optimizer, per root module, per DDP
model) so the step pays nothing after the first; DDP's ``_post_forward`` is timed on every step, since its graph
search with ``find_unused_parameters`` is a per-step cost.
"""

from __future__ import annotations

import atexit
import functools
import time
import weakref
from typing import Any

from stallscope.recorder import events

_perf = time.perf_counter_ns
_optimizers_seen: set[int] = set()
_roots_seen: set[int] = set()
#: DDP models -> [post_forward ns and calls after the warm-up, all calls, reported]
_ddp_models: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()
#: Every DDP model's row and its settings taken at its first forward: reported at exit where the model was freed
#: first (a short run whose model lived inside a function), without holding the model itself alive.
_ddp_rows: list[tuple[list[int], dict[str, Any]]] = []
#: A DDP model's settings and costs go out after this many forwards (its logging data is filled at iteration 10).
DDP_REPORT_AFTER = 30
#: Its first forwards are left out of the cost: DDP builds and rebuilds its buckets there.
DDP_WARM_UP = 5


def on_optimizer_step(optimizer: Any) -> None:
    """At an optimizer's first step: its kind, how many tensors it updates, and its kernels (foreach, fused)."""
    key = id(optimizer)
    if key in _optimizers_seen:
        return
    _optimizers_seen.add(key)
    try:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        with_grad = [p for p in params if getattr(p, "grad", None) is not None]
        defaults = getattr(optimizer, "defaults", {}) or {}
        info = {"tensors": len(params), "tensors_with_grad": len(with_grad),
                "numel": int(sum(p.numel() for p in params)), "groups": len(optimizer.param_groups),
                "foreach": defaults.get("foreach"), "fused": defaults.get("fused"),
                "device": params[0].device.type if params else None}
        events.emit("optimizer_info", key & 0xFFFFFF, type(optimizer).__name__, _perf(), info)
        if info["device"] == "cuda" and not _allocator_registered:
            _register_allocator()
    except Exception:  # noqa: BLE001, S110 - a fact lost; never into the script
        pass


_allocator_registered = False


def _register_allocator() -> None:
    global _allocator_registered
    _allocator_registered = True
    atexit.register(_report_allocator)


def _report_allocator() -> None:
    """At exit of a process that stepped an optimizer on CUDA: the caching allocator's counters (its peaks, the
    retries after a failed cudaMalloc, the device allocations and frees) and the configuration it ran with."""
    try:
        import os

        import torch

        if not torch.cuda.is_initialized():
            return
        stats = torch.cuda.memory_stats()
        info = {"reserved_peak": stats.get("reserved_bytes.all.peak", 0),
                "allocated_peak": stats.get("allocated_bytes.all.peak", 0),
                "reserved_now": stats.get("reserved_bytes.all.current", 0),
                "allocated_now": stats.get("allocated_bytes.all.current", 0),
                "retries": stats.get("num_alloc_retries", 0), "ooms": stats.get("num_ooms", 0),
                "device_allocs": stats.get("num_device_alloc", 0), "device_frees": stats.get("num_device_free", 0),
                "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
        events.emit("allocator_info", _perf(), info)
    except Exception:  # noqa: BLE001, S110 - a fact lost; never into the script
        pass


def on_first_call(module: Any, args: Any) -> None:
    """At a root module's first forward: the numerics it runs with (autocast, dtypes, TF32, cuDNN autotuning, the
    input's memory format) and whether it has convolutions (where channels_last and cuDNN autotuning matter)."""
    key = id(module)
    if key in _roots_seen:
        return
    _roots_seen.add(key)
    try:
        import torch

        first = next(module.parameters(), None)
        device = first.device.type if first is not None else "cpu"
        image = next((a for a in args if isinstance(a, torch.Tensor) and a.dim() == 4), None)
        convs = sum(1 for m in module.modules() if isinstance(m, torch.nn.modules.conv._ConvNd))
        info = {
            "module": type(module).__name__, "device": device,
            "param_dtype": str(first.dtype).removeprefix("torch.") if first is not None else None,
            "autocast": bool(torch.is_autocast_enabled(device)) if device in ("cuda", "cpu") else None,
            "grad_enabled": torch.is_grad_enabled(),
            "matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "convolutions": convs,
            "input_channels_last": (bool(image.is_contiguous(memory_format=torch.channels_last))
                                    and not image.is_contiguous()) if image is not None else None,
            "input_shape": list(image.shape) if image is not None else None,
        }
        if device == "cuda" and first is not None:
            major, minor = torch.cuda.get_device_capability(first.device)
            info["capability"] = f"{major}.{minor}"
        events.emit("model_info", _perf(), info)
    except Exception:  # noqa: BLE001, S110 - a fact lost; never into the script
        pass


def patch_ddp(module: Any) -> None:
    """Time DDP's ``_post_forward`` (with ``find_unused_parameters`` it searches the autograd graph there, every
    step) and, after ``DDP_REPORT_AFTER`` forwards or at exit, write the model's DDP settings beside that cost."""
    DDP = module.DistributedDataParallel
    original = getattr(DDP, "_post_forward", None)
    if original is None or getattr(original, "__stallscope_wrapped__", False):
        return

    @functools.wraps(original)
    def _post_forward(self: Any, output: Any) -> Any:
        start = _perf()
        try:
            return original(self, output)
        finally:
            row = _ddp_models.get(self)
            if row is None:
                row = _ddp_models[self] = [0, 0, 0, 0]  # ns and calls after the warm-up, all calls, reported
                _ddp_rows.append((row, _settings(self)))
            row[2] += 1
            if row[2] > DDP_WARM_UP:
                row[0] += _perf() - start
                row[1] += 1
            if row[2] == DDP_REPORT_AFTER:
                _report(self, row)

    _post_forward.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    DDP._post_forward = _post_forward
    atexit.register(_report_all)


def _settings(model: Any) -> dict[str, Any]:
    """What a DDP model is, read from it once (at its first forward): nothing here changes as it trains."""
    try:
        params = [p for p in model.module.parameters() if p.requires_grad]
        return {"find_unused_parameters": bool(getattr(model, "find_unused_parameters", False)),
                "static_graph": bool(getattr(model, "static_graph", False)),
                "bucket_cap_bytes": getattr(model, "bucket_bytes_cap", None),
                "gradient_as_bucket_view": bool(getattr(model, "gradient_as_bucket_view", False)),
                "parameters": len(params), "parameter_bytes": int(sum(p.numel() * p.element_size() for p in params)),
                "device": params[0].device.type if params else None,
                "gradient_dtype": str(params[0].dtype).removeprefix("torch.") if params else None,
                "comm_hook": _comm_hook_name(model)}
    except Exception:  # noqa: BLE001 - a fact lost; never into the script
        return {}


def _report(model: Any, row: list[int], settings: dict[str, Any] | None = None) -> None:
    """Write a DDP model's settings beside its ``_post_forward`` cost: from the model where it is still alive (its
    logging data included), else (``model`` None, at exit) from its first forward's (a hook registered after that
    is then not seen)."""
    try:
        data: dict[str, Any] = {}
        if model is not None:
            import torch.distributed as dist

            # DDP's logger only while its process group lives: at exit, after destroy_process_group, the reducer's
            # C++ side is not ours to touch (an abort there would end the rank)
            alive = dist.is_available() and dist.is_initialized()
            data = model._get_ddp_logging_data() if alive and hasattr(model, "_get_ddp_logging_data") else {}
            settings = _settings(model)
        info = {**(settings or {}), "unused_parameter_size": data.get("unused_parameter_size"),
                "bucket_cap_bytes": data.get("bucket_cap_bytes", (settings or {}).get("bucket_cap_bytes")),
                "post_forward_ns": row[0], "post_forward_calls": row[1]}
        row[3] = 1
        events.emit("ddp_info", _perf(), info)
    except Exception:  # noqa: BLE001, S110 - a fact lost; never into the script
        pass


def _comm_hook_name(model: Any) -> str | None:
    """The communication hook registered on a DDP model (``register_comm_hook``: compression, PowerSGD), by name."""
    hooks = getattr(model, "_comm_hooks", None) or []
    try:
        return str(getattr(hooks[0][0], "__name__", type(hooks[0][0]).__name__)) if hooks else None
    except (IndexError, TypeError):
        return None


def _report_all() -> None:
    for model, row in list(_ddp_models.items()):
        if not row[3]:
            _report(model, row)
    for row, settings in _ddp_rows:  # models freed before the exit, with fewer forwards than DDP_REPORT_AFTER
        if not row[3]:
            _report(None, row, settings)
