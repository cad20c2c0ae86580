"""Start-up of the instrumentation in every process of the target job.

Run from our ``sitecustomize`` when the launcher's environment variables are present. It only
registers post-import hooks; torch and the libraries are patched when the script imports them.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from typing import Any, NoReturn

from stallscope.recorder import (
    distributed,
    events,
    frameworks,
    gc_timing,
    importhook,
    loader,
    model_facts,
    op_window,
    step_parts,
    steps,
    trackers,
    transfer,
)
from stallscope.recorder.aiohttp_requests import AIOHTTP_PATCHES
from stallscope.recorder.http_requests import REQUEST_PATCHES, watch_thread_starts
from stallscope.recorder.libraries import LIBRARY_PATCHES, patch_torch
from stallscope.recorder.obstore_requests import OBSTORE_PATCHES
from stallscope.settings import (
    ENV_BENCH,
    ENV_LAUNCHER_PID,
    ENV_MAX_STEPS,
    ENV_OVERRIDES,
    ENV_RANK_PID,
    ENV_RUN_DIR,
    decode_overrides,
)

#: module -> what the recorder does to it once the script imports it: every patch of the job, in one list.
PATCHES: dict[str, Any] = {
    "torch": patch_torch,
    "torch.utils.data.dataloader": loader.patch_dataloader,
    "torch.utils.data._utils.fetch": loader.patch_fetchers,
    "torch.utils.data._utils.pin_memory": loader.patch_pin_memory,
    "torch.optim.optimizer": steps.install_optimizer_hooks,
    "torch.nn.modules.module": step_parts.install_module_hooks,
    "torch.autograd.profiler": op_window.patch_profiler,
    "torch.autograd": step_parts.patch_autograd,
    "torch.cuda": transfer.install_after_cuda_init,
    "torch.distributed.distributed_c10d": distributed.patch_c10d,
    "torch.nn.parallel.distributed": lambda module: _patch_ddp(module),
    "transformers.training_args": frameworks.patch_training_args,
    "mlflow": trackers.patch_mlflow,
    "wandb": trackers.patch_wandb,
    "torch.utils.tensorboard.writer": trackers.patch_tensorboard,
    **LIBRARY_PATCHES,
    **REQUEST_PATCHES,
    **OBSTORE_PATCHES,
    **AIOHTTP_PATCHES,
    "threading": watch_thread_starts,
}
_installed = False
_patches_registered = False


def _patch_ddp(module: Any) -> None:
    """DDP: the wait for its gradient reduction (distributed.py), its settings and its per-step graph search."""
    distributed.patch_ddp(module)
    model_facts.patch_ddp(module)


def install() -> None:
    global _installed
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir or _installed:
        return
    _installed = True
    is_main = str(os.getppid()) == os.environ.get(ENV_LAUNCHER_PID)
    rank = distributed.rank_from_env()  # torchrun's ranks; spawned ranks say so at init_process_group
    if os.environ.get(ENV_RANK_PID, str(os.getpid())) != str(os.getpid()):
        rank = None  # a rank's DataLoader worker (spawn, forkserver) inherits RANK but is not a rank
    events.configure(run_dir, role="main" if is_main else ("rank" if rank else "child"))
    loader.overrides.update(decode_overrides(os.environ.get(ENV_OVERRIDES)))
    limit = os.environ.get(ENV_MAX_STEPS)
    steps.max_steps = int(limit) if limit else None

    register_patches()
    if is_main and os.environ.get(ENV_BENCH):  # stallscope bench: see recorder/bench_mode.py
        from stallscope.recorder import bench_mode
        bench_mode.install(os.environ[ENV_BENCH])

    if is_main:
        _die_with_launcher()
    _flush_before_os_exit()  # every process: a forked or forkserver child that trains leaves through os._exit too
    if is_main or rank or _a_program_the_script_started():
        _start_process_recording()
    if not (is_main or rank):
        distributed._became_rank_hook = _start_rank_recording
    if rank:
        distributed.mark_rank(rank["rank"], rank["local_rank"], rank["world_size"], rank["node_rank"])


def register_patches() -> None:
    """Have every module of ``PATCHES`` patched once imported (at once if it already is). Once per process:
    the patches wrap what they find, so a second registration would wrap them twice (an in-process
    recording started again, ``stallscope.record``)."""
    global _patches_registered
    if _patches_registered:
        return
    _patches_registered = True
    for module_name, patch in PATCHES.items():
        importhook.when_imported(module_name, patch)


def _die_with_launcher() -> None:
    """Get SIGTERM when the launcher dies, even by SIGKILL (Linux's parent-death signal), so training
    never outlives stallscope. The launcher's CLI arms it before exec already; this covers library use."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != os.environ.get(ENV_LAUNCHER_PID):  # the launcher died before it was armed
        os.kill(os.getpid(), signal.SIGTERM)


def _a_program_the_script_started() -> bool:
    """A Python program the script runs as a process of its own (``subprocess.run([sys.executable, "train.py"])``
    from a launcher script or a job wrapper, ``python -m pkg``): training may run there, so it is recorded like the
    script. Not ``python -c`` helpers nor multiprocessing's own children (spawned DataLoader workers, the
    forkserver, the resource tracker), which become what they are later (a worker, a rank) or never train."""
    argv = sys.argv
    return bool(argv) and argv[0] not in ("", "-c") and "--multiprocessing-fork" not in argv


_recording_pid: int | None = None  # the process whose start, exit and signals are recorded (a fork inherits it)


def _start_process_recording() -> None:
    global _recording_pid
    if _recording_pid == os.getpid():  # a recorded program that becomes a rank later (init_process_group)
        return
    _recording_pid = os.getpid()
    events.emit("process_start", time.perf_counter_ns(), sys.argv[:32])
    events.start_background_flusher()
    gc_timing.install()
    _install_exit_recording()


def _start_rank_recording() -> None:
    """A process that became a rank at ``init_process_group`` (``torch.multiprocessing.spawn``):
    record it like the main process. Such children leave through ``os._exit``, so flush then too."""
    events.set_role("rank")
    _start_process_recording()
    events.flush_at_process_exit()


def _install_exit_recording() -> None:
    """Record uncaught exceptions and a SIGTERM, then let Python do what it would have done."""
    previous_hook = sys.excepthook

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        if not issubclass(exc_type, SystemExit):
            distributed.uncaught_exception = True
            where = traceback.extract_tb(tb)[-1] if tb is not None else None
            loader.record_open_next(exc_type.__name__)
            events.emit("exception", time.perf_counter_ns(), exc_type.__name__, str(exc)[:2000],
                        f"{where.filename}:{where.lineno}" if where else None,
                        "".join(traceback.format_exception(exc_type, exc, tb))[-6000:])
            events.flush()
        previous_hook(exc_type, exc, tb)

    sys.excepthook = excepthook
    _record_exit_messages()

    for ending in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        if signal.getsignal(ending) == signal.SIG_DFL:
            signal.signal(ending, _flush_then_default)

    import atexit

    def at_exit() -> None:
        loader.record_open_next("exit")  # a daemon thread still blocked in next() when the script ended
        if loader.loaded_in_process and not loader.loaded_by_workers:  # what workers would pay to pass batches
            from stallscope.recorder import shm_cost

            measured = shm_cost.measure(shm_cost.calibration_bytes(loader.main_batch_nbytes()))
            if measured:
                events.emit("calibration", time.perf_counter_ns(), "shared_memory", measured)
        gc_timing.emit()
        events.emit("process_exit", time.perf_counter_ns(), None)

    atexit.register(at_exit)


def _record_exit_messages() -> None:
    """``sys.exit("message")`` (and ``exit("message")``) ends the script with code 1 once Python has printed the
    message, and no hook sees a ``SystemExit``: the call itself keeps a code that is not a number, as an
    ``exception`` record of type ``SystemExit`` that the analysis reads only where the script did exit with 1."""
    me = os.getpid()

    def note(code: object) -> None:
        if code is None or isinstance(code, int) or os.getpid() != me:
            return
        try:
            caller = sys._getframe(2)
            stack = "".join(traceback.format_stack(caller, limit=-16))
            events.emit("exception", time.perf_counter_ns(), "SystemExit", str(code)[:2000],
                        f"{caller.f_code.co_filename}:{caller.f_lineno}",
                        f"Traceback (most recent call last):\n{stack}SystemExit: {code}"[-6000:])
        except Exception:  # noqa: BLE001 - exiting must never fail because of the recorder
            pass

    real_exit = sys.exit

    def exit(status: str | int | None = None, /) -> NoReturn:
        note(status)
        real_exit(status)

    exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    exit.__doc__ = real_exit.__doc__
    sys.exit = exit
    try:
        import _sitebuiltins
    except ImportError:
        return
    quitter_call = _sitebuiltins.Quitter.__call__

    def __call__(self: Any, code: str | int | None = None) -> NoReturn:
        note(code)
        quitter_call(self, code)

    __call__.__wrapped__ = quitter_call  # type: ignore[attr-defined]
    _sitebuiltins.Quitter.__call__ = __call__  # type: ignore[method-assign]


_ending = False


def _flush_then_default(signum: int, frame: Any) -> None:
    """A signal that ends the process by default (SIGTERM, SIGHUP, SIGQUIT): record it, write out what is
    buffered, then die of it as the script would have (same exit status). It may run while the main thread
    is inside a flush, or inside this handler for another signal: it never waits long, and a second
    ending signal dies at once."""
    global _ending
    signal.signal(signum, signal.SIG_DFL)
    if not _ending:
        _ending = True
        loader.record_open_next(signal.Signals(signum).name)
        events.emit("signal", time.perf_counter_ns(), signal.Signals(signum).name)
        events.flush(wait_s=events.ENDING_FLUSH_WAIT_S)
    os.kill(os.getpid(), signum)


def _flush_before_os_exit() -> None:
    """``os._exit`` skips ``atexit``: write out the last events first, in this process and in every child it
    forks (a child that trains and ends by ``os._exit``, a ``multiprocessing`` fork child): a fork clears the
    child's buffer, so each writes only its own. A ``__next__`` left open is this process's only: a fork child
    would find one its parent's other thread had open."""
    real_exit = os._exit
    me = os.getpid()

    def _exit(status: int) -> NoReturn:
        try:
            if os.getpid() == me:
                loader.record_open_next("os._exit")
            events.emit("process_exit", time.perf_counter_ns(), status)
            events.flush(wait_s=events.ENDING_FLUSH_WAIT_S)
        except Exception:  # noqa: BLE001 - exiting must never fail because of the recorder
            pass
        real_exit(status)

    _exit.__wrapped__ = real_exit  # type: ignore[attr-defined]
    os._exit = _exit
