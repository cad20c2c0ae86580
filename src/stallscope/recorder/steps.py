"""Training-step boundaries from the optimizer, and the ``--steps N`` stop.

Every optimizer's ``step`` is seen through torch's global step hooks, so custom optimizers are
covered too. A *step* ends at the first optimizer step after at least one batch was fetched:
two optimizers stepped on one batch (a GAN) make one training step, and gradient accumulation
over several batches makes one step as well. Without any optimizer, batches are the steps.
"""

from __future__ import annotations

import time
from typing import Any

from stallscope.recorder import cuda_timing, distributed, events, model_facts, op_window, step_parts

_perf = time.perf_counter_ns
max_steps: int | None = None

_steps_done = 0
_batches_done = 0
_batches_since_step = 0
_saw_optimizer = False
_pre_ns = 0
_stopping = False


class StepLimitReached(SystemExit):
    """Raised at the next batch fetch after ``--steps N`` steps: ends the script with exit code 0."""


def _pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    global _pre_ns
    step_parts.enter_part("optimizer")
    _pre_ns = _perf()


def _post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    global _steps_done, _batches_since_step, _saw_optimizer
    _saw_optimizer = True
    events.emit("opt", id(optimizer) & 0xFFFFFF, type(optimizer).__name__, _pre_ns, _perf())
    step_parts.leave_part()
    model_facts.on_optimizer_step(optimizer)
    cuda_timing.on_step_end()
    step_parts.on_optimizer_step(_batches_since_step > 0)
    op_window.on_step_end(_batches_since_step > 0)
    if _batches_since_step > 0:
        _steps_done += 1
        _batches_since_step = 0


def install_optimizer_hooks(optimizer_module: Any) -> None:
    optimizer_module.register_optimizer_step_pre_hook(_pre_hook)
    optimizer_module.register_optimizer_step_post_hook(_post_hook)


def before_next() -> None:
    """Called at every DataLoader ``__next__``: the clean place to stop after N steps."""
    global _stopping
    if max_steps is None or _stopping:
        return
    done = _steps_done if _saw_optimizer else _batches_done
    if done >= max_steps:
        _stopping = True
        events.emit("step_limit", max_steps, done, _perf())
        events.flush()
        distributed.stopped_by_step_limit = True
        raise StepLimitReached(0)


def after_next(loader_id: int) -> None:
    global _batches_done, _batches_since_step
    _batches_done += 1
    _batches_since_step += 1
    cuda_timing.on_batch(_saw_optimizer)
