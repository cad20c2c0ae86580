"""Experiment-tracker runs the script starts, recorded so results go to the script's own run.

``stallscope run --log-to mlflow`` logs after the script has ended, from the launcher: to attach to the run
the script itself was logging to, the launcher needs its id and where it lives. So the calls that start a run
(``mlflow.start_run``, ``wandb.init``, a TensorBoard ``SummaryWriter``) emit one ``tracker_run`` event each.
The wrappers return what the real call returned, and recording can never make that call fail.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from stallscope.recorder import events


def _record(tracker: str, describe: Callable[[], dict[str, Any]]) -> None:
    with contextlib.suppress(Exception):  # the script's own call has succeeded; recording it is optional
        events.emit("tracker_run", tracker, time.perf_counter_ns(), describe())


def _after(original: Callable[..., Any], tracker: str, describe: Callable[[Any], dict[str, Any]]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        _record(tracker, lambda: describe(result))
        return result

    wrapper.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def patch_mlflow(module: Any) -> None:
    """Wrap ``mlflow.start_run``, also where MLflow starts a run itself (``mlflow.log_metric`` without one)."""
    fluent: Any = sys.modules.get("mlflow.tracking.fluent")
    original = getattr(module, "start_run", None)
    if original is None or getattr(original, "__stallscope_wrapped__", False):
        return

    def describe(active: Any) -> dict[str, Any]:
        return {"run_id": active.info.run_id, "experiment_id": active.info.experiment_id,
                "uri": module.get_tracking_uri(), "cwd": os.getcwd()}

    wrapper = _after(original, "mlflow", describe)
    module.start_run = wrapper
    if fluent is not None and getattr(fluent, "start_run", None) is original:
        fluent.start_run = wrapper


def patch_wandb(module: Any) -> None:
    """Wrap ``wandb.init``: the run's id, project, entity, root folder and mode (online, offline)."""
    original = getattr(module, "init", None)
    if original is None or getattr(original, "__stallscope_wrapped__", False):
        return

    def describe(run: Any) -> dict[str, Any]:
        settings = getattr(run, "settings", None)
        return {"run_id": run.id, "project": getattr(run, "project", None), "entity": getattr(run, "entity", None),
                "dir": getattr(settings, "root_dir", None), "mode": getattr(settings, "mode", None)}

    module.init = _after(original, "wandb", describe)


def patch_tensorboard(module: Any) -> None:
    """Wrap ``SummaryWriter.__init__`` (torch.utils.tensorboard): the folder the script's events go to."""
    cls: Any = getattr(module, "SummaryWriter", None)
    original = getattr(cls, "__init__", None)
    if original is None or getattr(original, "__stallscope_wrapped__", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _record("tensorboard", lambda: {"log_dir": os.path.abspath(str(self.log_dir))})

    __init__.__stallscope_wrapped__ = True  # type: ignore[attr-defined]
    cls.__init__ = functools.wraps(original)(__init__)
