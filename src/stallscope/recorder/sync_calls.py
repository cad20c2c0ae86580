"""Inside the profiler window, the calls by which the host reads values back from the device, timed at the user's
lines: ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, ``.to()``, a tensor's truth value (``if loss:``), its
printing, ``nonzero`` and boolean-mask indexing, ``torch.cuda.synchronize()``.

The profiler names the wait (``cudaStreamSynchronize`` under ``aten::_local_scalar_dense``) but not the line; these
few methods are wrapped only while the window is open (``op_window.py`` installs and removes them) and, in the main
thread, each call's wall time goes to the innermost frame of the user's own code that made it (not torch's, not an
installed package's, not the standard library's), with the tensor's device. The analysis keeps the CUDA ones: on the
CPU these calls wait for nothing. A call made inside another wrapped one is the outer one's; under ``torch.compile``
tracing the wrappers step aside. Nothing here raises into the script.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from typing import Any

from stallscope.constants import is_user_file

_perf = time.perf_counter_ns
#: Tensor methods that read back from the device (or, for ``__getitem__``, may: a boolean mask).
_METHODS = ("item", "tolist", "cpu", "numpy", "to", "__bool__", "nonzero", "__repr__", "__format__", "__getitem__")
_CALL_NAMES = {"__bool__": "bool(tensor)", "__repr__": "print(tensor)", "__format__": "f\"{tensor}\"",
               "__getitem__": "tensor[mask]"}
#: Sites kept per window (by time).
TOP_SITES = 20
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_installed: list[tuple[Any, str, Any, bool]] = []  # (owner, name, original, the owner's own attribute)
_rows: dict[tuple[str, str, int, str, str], list[int]] = {}  # (call, file, line, function, device) -> [calls, ns]
_depth = 0
_main = threading.main_thread().ident


def install() -> None:
    """Wrap the reading-back calls (the window opens)."""
    global _depth
    if _installed:
        return
    _rows.clear()
    _depth = 0
    try:
        import torch

        for name in _METHODS:
            original = getattr(torch.Tensor, name, None)
            if original is not None:
                _installed.append((torch.Tensor, name, original, name in torch.Tensor.__dict__))
                setattr(torch.Tensor, name, _wrapped(_CALL_NAMES.get(name, f".{name}()"), original,
                                                     keep=_KEEP.get(name)))
        if torch.cuda.is_available():
            original = torch.cuda.synchronize
            _installed.append((torch.cuda, "synchronize", original, True))
            torch.cuda.synchronize = _wrapped("torch.cuda.synchronize()", original, tensor=False)
    except Exception:  # noqa: BLE001 - nothing wrapped: the waits go unplaced
        uninstall()


def uninstall() -> list[list[Any]]:
    """Put the originals back (the window closes); the sites timed, costliest first: ``[call, file, line,
    function, device, calls, ns]``."""
    while _installed:
        owner, name, original, own = _installed.pop()
        try:
            if own:
                setattr(owner, name, original)
            else:  # inherited (torch.Tensor's from TensorBase): ours goes, theirs shows through again
                delattr(owner, name)
        except Exception:  # noqa: BLE001, S110 - never into the script
            pass
    rows = sorted(_rows.items(), key=lambda kv: -kv[1][1])[:TOP_SITES]
    _rows.clear()
    return [[*key, calls, ns] for key, (calls, ns) in rows]


def _mask(args: tuple[Any, ...], result: Any) -> bool:
    """``tensor[index]`` reads back only for a boolean mask (its size is the count of its true values)."""
    dtype = getattr(args[1], "dtype", None) if len(args) > 1 else None
    return str(dtype) == "torch.bool"


def _to_host(args: tuple[Any, ...], result: Any) -> bool:
    """``.to(...)`` reads back only when a device's tensor lands on the host."""
    return args[0].device.type != "cpu" and getattr(getattr(result, "device", None), "type", None) == "cpu"


#: Calls that read back only in some uses: which (the call's arguments and result).
_KEEP = {"__getitem__": _mask, "to": _to_host}


def _wrapped(call: str, original: Any, tensor: bool = True, keep: Any = None) -> Any:
    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        global _depth
        if _depth or threading.get_ident() != _main or _compiling():
            return original(*args, **kwargs)
        _depth = 1
        start = _perf()
        result = None
        try:
            result = original(*args, **kwargs)
            return result
        finally:
            spent = _perf() - start
            _depth = 0
            try:
                if keep is None or keep(args, result):
                    _count(call, spent, args[0].device.type if tensor and args else "cuda")
            except Exception:  # noqa: BLE001, S110 - this call goes unplaced
                pass

    timed.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return timed


def _count(call: str, spent: int, device: str) -> None:
    frame: Any = sys._getframe(2)
    while frame is not None and _not_users(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return
    code = frame.f_code
    key = (call, code.co_filename, frame.f_lineno or 0, getattr(code, "co_qualname", code.co_name), device)
    row = _rows.get(key)
    if row is None:
        row = _rows[key] = [0, 0]
    row[0] += 1
    row[1] += spent


@functools.lru_cache(maxsize=1024)
def _not_users(path: str) -> bool:
    return not is_user_file(path) or path.startswith(_OWN)


def _compiling() -> bool:
    dynamo = sys.modules.get("torch._dynamo")
    try:
        return bool(dynamo is not None and dynamo.is_compiling())
    except Exception:  # noqa: BLE001
        return False
