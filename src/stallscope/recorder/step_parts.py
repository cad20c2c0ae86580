"""Forward and backward spans of the training step, so compute can be split into forward, backward, optimizer and
the script's own step code (the optimizer's spans come from ``steps.py``).

*Forward* is a call of a module that has parameters made outside any other module call: the model's (or a GAN's
two models') outermost ``__call__``. A loss module (no parameters) is not forward: it is the step's own code.
Torch's global module hooks see every module call, which costs about a microsecond or two per call in every
module; so they only run until the roots are known (a few optimizer steps, or enough root calls without an
optimizer), then hooks on those root modules alone take over and the global hooks go. A model first called after
that (an evaluation model) is not seen: its time stays in the step code.

*Backward* is a call of ``torch.autograd.backward`` (``loss.backward()``, a ``GradScaler``'s scaled loss) or
``torch.autograd.grad``, outermost only: activation checkpointing's recomputed forward inside it stays backward.

Hooks never run inside ``torch.compile``'s tracing (they return at once there), so a compiled model computes as it
would without them; its outermost call (the ``OptimizedModule``) is the forward. Its guards do hold the number of
global hooks, so once it has compiled the global hooks stay for the run: removing them would recompile it.
DataLoader workers drop the hooks (transforms are modules too, and a worker never trains).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import weakref
from typing import Any

from stallscope.recorder import events, model_facts, op_window

_perf = time.perf_counter_ns

#: Optimizer steps (with at least one root seen) after which the global hooks give way to hooks on the roots.
LEARN_STEPS = 3
#: Root forward calls after which the global hooks give way, when the script has no optimizer (inference).
LEARN_CALLS = 32


#: The part of the step the main thread is in now (the step sampler reads it): "forward", "backward", "optimizer",
#: or "step_code" (the script's own code between them).
main_part = "step_code"
_main_ident = threading.main_thread().ident
_parts_entered: list[str] = []  # the parts the main thread is inside, outermost first, less the current one


class _ThreadState(threading.local):
    """Per thread (DataParallel runs replicas in threads): module-call depth and the outermost call's start."""
    depth = 0
    start_ns = 0
    root: Any = None
    backward_depth = 0
    autocast: Any = None  # the autocast context entered around the outermost call (``--set autocast``)


#: ``--set channels_last=true``: the roots' weights are converted once, their 4-D inputs at every call.
channels_last = False
_converted: weakref.WeakSet[Any] = weakref.WeakSet()  # roots whose weights are channels_last already
#: ``--set autocast=bfloat16``: the dtype the roots' forward runs under ``torch.autocast`` in (None: as the script
#: says). Set once, as the script builds its first DataLoader (``loader._numerics``).
autocast_dtype: str | None = None


_state = _ThreadState()
_handles: list[Any] = []
_roots: dict[int, Any] = {}  # id -> module, while learning
_root_calls = 0
_steps_seen = 0
_learning = False
_settled = False  # hooks on the roots, none global
_hooked: weakref.WeakSet[Any] = weakref.WeakSet()  # the roots that carry our hooks
_global_module: Any = None  # torch.nn.modules.module, to put the global hooks back (learning again)
_forwards_since_step = 0
_backwards_since_step = 0
_in_worker = False
_is_compiling: Any = None


def enter_part(part: str) -> None:
    """The main thread enters ``part`` (a forward, a backward, an optimizer step); ``leave_part`` puts back the one
    it was in (an optimizer's closure runs forward and backward inside the step). Other threads' parts are not the
    step sampler's."""
    global main_part
    if threading.get_ident() == _main_ident:
        _parts_entered.append(main_part)
        main_part = part
        if op_window.active:
            op_window.enter(part)


def leave_part() -> None:
    global main_part
    if threading.get_ident() == _main_ident and _parts_entered:
        main_part = _parts_entered.pop()
        if op_window.active:
            op_window.leave()


def _has_parameters(module: Any) -> bool:
    try:
        return next(module.parameters(), None) is not None
    except Exception:  # a module whose parameters() the script broke: not ours to judge
        return False


def _pre(module: Any, args: Any) -> Any:
    if _is_compiling():
        return
    state = _state
    if state.depth == 0:
        if state.backward_depth or not _has_parameters(module):
            return  # a loss module; or checkpointing's recompute inside backward (backward's time)
        if autocast_dtype is not None:
            state.autocast = _enter_autocast(module)
        if channels_last:
            args = _channels_last(module, args)
        model_facts.on_first_call(module, args)
        state.start_ns = _perf()
        state.root = module
        enter_part("forward")
        state.depth += 1
        return args if channels_last else None
    state.depth += 1
    return None


def _post(module: Any, args: Any, output: Any) -> None:
    global _forwards_since_step
    if _is_compiling():
        return
    state = _state
    if state.depth == 0:
        return
    state.depth -= 1
    if state.depth == 0:
        root, state.root = state.root, None
        events.emit("fwd", state.start_ns, _perf(), type(root).__name__)
        leave_part()
        _forwards_since_step += 1
        if _learning:
            _learn(root)
        if state.autocast is not None:
            context, state.autocast = state.autocast, None
            context.__exit__(None, None, None)
            return _to_float32(output)
    return None


def use_channels_last() -> None:
    global channels_last
    channels_last = True


def _channels_last(module: Any, args: Any) -> Any:
    """``module``'s 4-D weights in channels_last (once: the same parameters, so the optimizer's hold), and the 4-D
    tensors of this call's arguments."""
    import torch

    if module not in _converted:
        _converted.add(module)
        try:
            module.to(memory_format=torch.channels_last)
        except Exception:  # noqa: BLE001, S110 - a module that refuses: its weights stay as they are
            pass
    return tuple(a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.dim() == 4
                 else a for a in args)


def use_autocast(dtype: str) -> None:
    global autocast_dtype
    autocast_dtype = dtype


def _enter_autocast(module: Any) -> Any:
    """An autocast context entered for ``module``'s call, on the device of its parameters; None where autocast is
    on already (the script's own), the parameters are not float32 (a model in bfloat16 outputs it by design), or it
    cannot be entered there."""
    import torch

    try:
        first = next(module.parameters())
        device = first.device.type
        if torch.is_autocast_enabled(device) or first.dtype != torch.float32:
            return None
        context = torch.autocast(device_type=device, dtype=getattr(torch, autocast_dtype or "bfloat16"))
        context.__enter__()
    except Exception:  # noqa: BLE001 - a device autocast does not know: the forward runs as the script wrote it
        return None
    return context


def _to_float32(output: Any) -> Any:
    """The forward's floating outputs cast back to float32, as autocast around the loss would for the losses it
    lists (cross entropy, MSE...): a loss computed outside the forward is not computed in bfloat16. Containers are
    rebuilt (tuples, lists) or updated in place (dicts, a Hugging Face ModelOutput); None: the output unchanged."""
    import torch

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype in (torch.bfloat16, torch.float16):
            return value.float()
        return value

    if isinstance(output, torch.Tensor):
        return cast(output)
    if isinstance(output, tuple) and not hasattr(output, "_fields"):
        return tuple(cast(v) for v in output)
    if isinstance(output, list):
        return [cast(v) for v in output]
    if isinstance(output, dict):
        for key, value in list(output.items()):
            if (wide := cast(value)) is not value:
                output[key] = wide
    return None


def _learn(root: Any) -> None:
    global _root_calls
    _roots.setdefault(id(root), root)
    _root_calls += 1
    if _root_calls >= LEARN_CALLS:
        _settle()


def on_optimizer_step(fed: bool) -> None:
    """Called after every optimizer step (``steps.py``; ``fed``: a batch came since the last one). Once the roots
    have been seen over a few training steps, settle. Settled, a step with a backward but no forward seen trains a
    model called first since (a model built per fold, after a warm-up pass): learn the roots again."""
    global _steps_seen, _forwards_since_step, _backwards_since_step
    if _learning:
        if fed and _roots:
            _steps_seen += 1
            if _steps_seen >= LEARN_STEPS:
                _settle()
    elif _settled and _backwards_since_step and not _forwards_since_step:
        _learn_again()
    _forwards_since_step = _backwards_since_step = 0


def _learn_again() -> None:
    global _learning, _steps_seen, _root_calls, _settled
    if _global_module is None or _in_worker:
        return
    for handle in _global_handles(_global_module):
        _handles.append(handle)
    _learning, _settled, _steps_seen, _root_calls = True, False, 0, 0


def _compiled_since_start() -> bool:
    """Whether ``torch.compile`` has traced code since the hooks went in: its guards then hold the global hooks'
    count, and removing them would recompile the model."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return utils is not None and utils.counters["frames"]["total"] > 0
    except Exception:  # noqa: BLE001 - a torch without those counters: assume compiled, keep the hooks
        return True


def _settle() -> None:
    """Hooks on the roots seen, the global hooks removed: other modules' calls cost nothing again. Not where
    ``torch.compile`` traced with the global hooks in place: they stay for the run (their cost is in the modules it
    did not compile)."""
    global _learning, _settled
    _learning = False
    if _compiled_since_start():
        _roots.clear()
        return
    for handle in _handles:
        handle.remove()
    _handles.clear()
    for module in _roots.values():
        if module in _hooked:
            continue
        try:
            module.register_forward_pre_hook(_pre)
            module.register_forward_hook(_post, always_call=True)
            _hooked.add(module)
        except Exception:  # noqa: BLE001 - a module class that refuses hooks: its calls go uncounted
            continue
    _roots.clear()
    _settled = True


def _global_handles(module_module: Any) -> list[Any]:
    pre = module_module.register_module_forward_pre_hook(_pre)
    try:
        post = module_module.register_module_forward_hook(_post, always_call=True)
    except TypeError:  # torch before 2.1: no always_call; a forward that raises leaves the depth for the next step
        post = module_module.register_module_forward_hook(_post)
    return [pre, post]


def install_module_hooks(module_module: Any) -> None:
    """Patch target ``torch.nn.modules.module``: the global hooks that find the roots."""
    global _learning, _is_compiling
    if _in_worker or _handles:
        return
    import torch

    global _global_module
    _is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
    _global_module = module_module
    _handles.extend(_global_handles(module_module))
    _learning = True


def _timed_backward(original: Any, how: str) -> Any:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _backwards_since_step
        state = _state
        if state.backward_depth or _in_worker:
            return original(*args, **kwargs)
        state.backward_depth = 1
        _backwards_since_step += 1
        enter_part("backward")
        start = _perf()
        try:
            return original(*args, **kwargs)
        finally:
            state.backward_depth = 0
            events.emit("bwd", start, _perf(), how)
            leave_part()

    wrapper.__stallscope_original__ = original  # type: ignore[attr-defined]
    return wrapper


def patch_autograd(autograd: Any) -> None:
    """Patch target ``torch.autograd``: ``backward`` (what ``Tensor.backward`` calls) and ``grad`` timed."""
    for name, how in (("backward", "backward"), ("grad", "grad")):
        original = getattr(autograd, name, None)
        if original is not None and not hasattr(original, "__stallscope_original__"):
            setattr(autograd, name, _timed_backward(original, how))


def leave_worker() -> None:
    """In a DataLoader worker: no forward or backward to record; drop the hooks so transforms cost nothing."""
    global _in_worker, _learning
    _in_worker = True
    _learning = False
    for handle in _handles:
        handle.remove()
    _handles.clear()
    _roots.clear()
