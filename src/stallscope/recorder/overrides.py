"""``--set name=value`` applied inside the job: DataLoader keyword arguments changed at construction, code
untouched. The vocabulary (names, types, parsing) is ``stallscope.settings``'s."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from stallscope.settings import PROCESS_SETTINGS


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
