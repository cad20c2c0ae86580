"""``--set name=value``: DataLoader keyword arguments changed at construction, code untouched."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

#: Arguments one may override. Object-valued ones (dataset, sampler, collate_fn...) are not values
#: one can type on a command line, so they are refused with a clear message.
SETTABLE: dict[str, str] = {
    "num_workers": "int",
    "batch_size": "int",
    "pin_memory": "bool",
    "prefetch_factor": "int",
    "persistent_workers": "bool",
    "drop_last": "bool",
    "timeout": "float",
    "in_order": "bool",
    "multiprocessing_context": "str",
    "shuffle": "bool",
    "pin_memory_device": "str",
    # Not a DataLoader argument: how tensors travel from workers (torch.multiprocessing sharing strategy).
    "sharing_strategy": "str",
}

#: Overrides that the recorder applies itself instead of passing them to DataLoader.__init__.
PROCESS_SETTINGS = ("sharing_strategy",)


class OverrideError(ValueError):
    pass


def _parse_value(name: str, kind: str, text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("none", "null"):
        return None
    if kind == "bool":
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise OverrideError(f"--set {name}={text}: expected true or false")
    if kind == "int":
        try:
            value = int(text)
        except ValueError:
            raise OverrideError(f"--set {name}={text}: expected an integer") from None
        if value < 0:
            raise OverrideError(f"--set {name}={text}: must not be negative")
        return value
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            raise OverrideError(f"--set {name}={text}: expected a number") from None
    return text


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Parse ``["num_workers=4", "pin_memory=true"]``; raise OverrideError with a helpful message."""
    parsed: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise OverrideError(f"--set {item!r}: expected name=value, for example --set num_workers=4")
        name, text = item.split("=", 1)
        name = name.strip()
        if name not in SETTABLE:
            known = ", ".join(sorted(SETTABLE))
            raise OverrideError(f"--set {name}: not a DataLoader argument that can be set; choose from {known}")
        parsed[name] = _parse_value(name, SETTABLE[name], text)
    if parsed.get("sharing_strategy") not in (None, "file_system", "file_descriptor"):
        raise OverrideError("--set sharing_strategy: choose file_system or file_descriptor")
    if parsed.get("prefetch_factor") == 0:
        raise OverrideError("--set prefetch_factor=0: must be at least 1")
    return parsed


def encode(overrides: Mapping[str, Any]) -> str:
    return json.dumps(dict(overrides))


def decode(text: str | None) -> dict[str, Any]:
    return json.loads(text) if text else {}


def apply_overrides(init: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    overrides: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, Any]]:
    """Return (args, kwargs, applied) for calling ``DataLoader.__init__(self, *args, **kwargs)``.

    ``applied`` maps each changed argument to ``[before, after]`` and notes what had to follow
    (prefetch_factor and persistent_workers are only legal with workers), so the session says
    exactly what ran.
    """
    if not overrides:
        return args, kwargs, {}
    bound = inspect.signature(init).bind(None, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(arguments)))  # self
    params = inspect.signature(init).parameters
    defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    applied: dict[str, Any] = {}

    def current(name: str) -> Any:
        return arguments.get(name, defaults.get(name))

    for name, value in overrides.items():
        if name in PROCESS_SETTINGS:
            continue
        if name not in params:
            applied[name] = {"skipped": "this torch version's DataLoader has no such argument"}
            continue
        if name == "batch_size" and (current("batch_sampler") is not None or current("batch_size") is None):
            applied[name] = {"skipped": "the script uses its own batch_sampler or no batching"}
            continue
        if name == "shuffle" and (current("sampler") is not None or current("batch_sampler") is not None):
            applied[name] = {"skipped": "the script passes its own sampler"}
            continue
        applied[name] = [current(name), value]
        arguments[name] = value

    workers = current("num_workers") or 0
    if workers == 0:
        for name, neutral in (("prefetch_factor", None), ("persistent_workers", False),
                              ("multiprocessing_context", None)):
            if current(name) not in (None, False):
                was = current(name)
                arguments[name] = neutral
                applied[name] = {"adjusted": [was, neutral], "why": "only valid with num_workers > 0"}
    return (), arguments, applied
