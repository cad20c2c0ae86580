"""Whether the recorder's changes are in place in this process, so a test that leaves them fails.

The recorder patches the modules of ``bootstrap.PATCHES``: their functions and their classes' methods
are replaced by functions whose code lives in ``stallscope/record`` (or that carry the
``__stallscope_wrapped__`` mark), and it adds global optimizer hooks. A unit test that installs any of
these, or configures ``events``, must undo it, or every later test in the process runs against a
patched torch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from stallscope.recorder import bootstrap, events

RECORD_DIR = str(Path(bootstrap.__file__).resolve().parent)


def _is_recorder_code(value: Any) -> bool:
    """A plain function whose code is the recorder's (a patch, a wrapper, a hook)."""
    if type(value) in (staticmethod, classmethod):
        value = value.__func__
    if type(value).__name__ != "function":
        return False
    return value.__code__.co_filename.startswith(RECORD_DIR) or bool(vars(value).get("__stallscope_wrapped__"))


def installed() -> list[str]:
    """Every recorder patch and hook installed now, and whether the recorder is configured."""
    found = ["events configured"] if events.enabled() else []
    for module_name in bootstrap.PATCHES:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name, value in list(vars(module).items()):
            if type(value) is type and vars(value).get("__module__") == module_name:  # its own classes
                found += [f"{module_name}.{name}.{attr}" for attr, member in list(vars(value).items())
                          if _is_recorder_code(member)]
            elif _is_recorder_code(value):
                found.append(f"{module_name}.{name}")
    optimizer = sys.modules.get("torch.optim.optimizer")
    for hooks in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        for hook in getattr(optimizer, hooks, {}).values() if optimizer is not None else ():
            if _is_recorder_code(hook):
                found.append(f"torch.optim.optimizer.{hooks}")
    return found
