"""stallscope: find out why a PyTorch training job starves its GPU, and prove the fix.

The library twins of the CLI verbs are importable from here; they load their modules on first
use, so ``import stallscope`` stays cheap (the recorder imports it in every process of a job).
No public name is also a subpackage's name (the recorder's hot path is ``stallscope.recorder``), so
``stallscope.record`` is the in-process recording function whatever was imported before.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> (module, attribute)
_EXPORTS: dict[str, tuple[str, str]] = {
    "Session": ("stallscope.session", "Session"),
    "analyze": ("stallscope.analysis", "analyze"),
    "bench": ("stallscope.tuning", "bench"),
    "doctor": ("stallscope.health", "run_doctor"),
    "load_session": ("stallscope.session", "Session.load"),
    "load_ipython_extension": ("stallscope.inprocess", "load_ipython_extension"),
    "pack": ("stallscope.data", "pack"),
    "plan": ("stallscope.analysis.plan", "plan_run"),
    "race_decoders": ("stallscope.tuning", "race_decoders"),
    "record": ("stallscope.inprocess", "record"),
    "Recording": ("stallscope.inprocess", "Recording"),
    "RunResult": ("stallscope.api", "RunResult"),
    "run": ("stallscope.api", "run"),
    "tune": ("stallscope.tuning", "tune"),
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'stallscope' has no attribute {name!r}")
    module_name, attribute = _EXPORTS[name]
    value: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value
