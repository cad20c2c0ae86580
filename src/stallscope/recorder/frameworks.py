"""What training frameworks decide about DataLoaders, recorded where the user decides it.

A Hugging Face Trainer user never writes ``DataLoader(...)``: its settings come from
``TrainingArguments(dataloader_num_workers=..., ...)``. So the place that call is made is recorded
(``framework_args``), for advice that names the user's own line in the Trainer's words.
"""

from __future__ import annotations

import os
import sys
import time
from types import FrameType
from typing import Any

from stallscope.recorder import events

#: TrainingArguments fields that become DataLoader arguments.
TRAINER_LOADER_FIELDS = ("dataloader_num_workers", "dataloader_persistent_workers", "dataloader_prefetch_factor",
                         "dataloader_pin_memory")


def _caller_outside(*parts: str) -> str:
    """file:line of the first frame outside the given library folders, the recorder and generated code."""
    frame: FrameType | None = sys._getframe(2)
    skip = (*parts, f"{os.sep}stallscope{os.sep}record")
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<") and not any(part in filename for part in skip):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def patch_training_args(module: Any) -> None:
    """Record where the script builds its ``TrainingArguments`` and the DataLoader settings it gave."""
    cls = module.TrainingArguments
    original = cls.__post_init__

    def __post_init__(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        events.emit("framework_args", "transformers", time.perf_counter_ns(),
                    _caller_outside(f"{os.sep}transformers{os.sep}"),
                    {name: getattr(self, name, None) for name in TRAINER_LOADER_FIELDS})
        return result

    cls.__post_init__ = __post_init__
