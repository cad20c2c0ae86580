"""In-process recording, for notebooks: ``with stallscope.record() as rec:`` around a training loop.

``stallscope run`` records a script it starts; a notebook's kernel is already running and holds the
model, so here the recorder is started in this very process instead, for the length of the block. What
it records and how it is read is the launched run's, piece for piece: the same run directory and
``run.json`` (``launcher.new_run``), the same patches (``bootstrap.PATCHES``), the same environment
for the DataLoader workers it spawns (so they start the recorder as a launched job's do; forked ones
inherit it), the same system sampler (in a thread here), and the same session, analysis, history row
and summary (``api.conclude``). A notebook outlives the block, so nothing that only a launched script
wants is installed: no signal handlers, no ``sys.excepthook``, no ``os._exit`` wrapper, no
parent-death signal, no ``--steps`` limit. The patches stay in place after the block (they cannot be
taken out safely while objects made through them live), but record nothing until the next block.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shlex
import shutil
import sys
import time
import traceback
from html import escape
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from stallscope import launcher
from stallscope.api import RunResult, conclude
from stallscope.collect import build_session
from stallscope.folding import FoldingThread
from stallscope.launcher import RunOutcome
from stallscope.recorder import bootstrap, cuda_timing, events, loader, steps, transfer
from stallscope.sample import SystemSampler
from stallscope.session import Session
from stallscope.settings import ENV_LAUNCHER_PID

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Recording", "RecordingError", "load_ipython_extension", "record"]

#: ``ENV_LAUNCHER_PID`` while a block records: no process has it as its parent, so no process this one
#: starts takes itself for the main process of a launched job (that role is this process's own).
NO_LAUNCHER = "-1"

_active: Recording | None = None


class RecordingError(RuntimeError):
    """Recording cannot start in this process (a block is recording already, or ``stallscope run`` is)."""


def record(*, store: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None,
           sample_interval_s: float = 0.1, history: bool = True, label: str | None = None) -> Recording:
    """Record the training that runs inside the ``with`` block, in this process and its DataLoader workers.

    The twin of ``stallscope.run`` for code that cannot be restarted as a script (a notebook): on leaving
    the block the session is saved under ``store`` (as ``--store``), analysed and added to the history
    (``history=False`` leaves it out); ``rec.summary()`` is then the document ``run --json`` writes.
    ``overrides``: DataLoader arguments changed at construction, as ``--set`` (DataLoaders built inside
    the block only); ``sample_interval_s``: the system sampler's period (0 turns it off); ``label``: names
    the run in the history instead of this process's command line.
    """
    return Recording(store=store, overrides=overrides, sample_interval_s=sample_interval_s, history=history,
                     label=label)


class Recording:
    """One in-process recording: a context manager, then the result (``summary()``, ``session``,
    ``analysis``, ``verdict``), shown as the terminal summary in HTML by Jupyter."""

    def __init__(self, *, store: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None,
                 sample_interval_s: float = 0.1, history: bool = True, label: str | None = None) -> None:
        if not (sample_interval_s >= 0 and math.isfinite(sample_interval_s)):
            raise ValueError(f"sample_interval_s must be 0 (sampler off) or a positive number of seconds, not "
                             f"{sample_interval_s!r}")
        self.store = store
        self.overrides = dict(overrides or {})
        self.sample_interval_s = sample_interval_s
        self.history = history
        self.label = label
        self.run_dir: Path | None = None
        self.result: RunResult | None = None
        self._meta: dict[str, Any] = {}
        self._lock: contextlib.ExitStack | None = None
        self._sampler: SystemSampler | None = None
        self._folding: FoldingThread | None = None
        self._saved_environ: dict[str, str | None] = {}
        self._saved_overrides: dict[str, Any] | None = None
        self._saved_max_steps: int | None = None
        self._forkserver: int | None = None

    # -- the block ------------------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        global _active
        if _active is not None or events.enabled():
            raise RecordingError("this process is being recorded already (a stallscope.record() block, or "
                                 "stallscope run): one recording at a time")
        if self.result is not None or self.run_dir is not None:
            raise RecordingError("this recording has run already: start another with stallscope.record()")
        command = ["<in-process>", self.label] if self.label else ["<in-process>", *sys.argv]
        self.run_dir, self._meta = launcher.new_run(self.store, command, self.overrides, None)
        _active = self
        try:
            self._start()
        except BaseException:
            self._stop()
            if self._lock is not None:
                self._lock.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
            _active = None
            raise
        return self

    def _start(self) -> None:
        assert self.run_dir is not None
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(launcher._in_progress(self.run_dir))
        self._meta["notes"] = _unrecorded_workers()
        self._forkserver = _forkserver_pid()
        self._set_environ(launcher._child_env(self.run_dir, self.overrides, None))
        self._saved_overrides = dict(loader.overrides)
        loader.overrides.clear()
        loader.overrides.update(self.overrides)
        self._saved_max_steps, steps.max_steps = steps.max_steps, None
        events.configure(self.run_dir, role="main")
        bootstrap.register_patches()
        _resume_gpu_timing()
        events.emit("process_start", time.perf_counter_ns(), sys.argv[:32])
        if not events._background_flusher:  # one per process, kept: it sleeps and writes nothing between blocks
            events.start_background_flusher()
        if self.sample_interval_s > 0:
            self._sampler = SystemSampler(os.getpid(), self.sample_interval_s)
            self._sampler.start()
        # a block of days is folded as it goes, as a launched run
        self._folding = FoldingThread(self.run_dir, self._sampler.snapshot if self._sampler is not None else None)
        self._folding.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Stop recording and conclude the run; an exception raised in the block goes on unchanged (this
        returns None), and one raised while concluding is only reported then, never put in its place."""
        global _active
        self._meta["exit_code"], self._meta["ended_by"] = _ending(exc_type, exc)
        try:
            self._record_ending(exc_type, exc, tb)
        finally:
            self._meta["end_ns"] = time.perf_counter_ns()
            samples = self._stop()
            _active = None
        if samples is not None:
            self._meta["system_samples"] = samples
        try:
            self.result = self._conclude()
        except Exception as error:
            if exc_type is None:
                raise
            sys.stderr.write(f"stallscope: the recording could not be concluded: {error!r}\n")

    def _record_ending(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                       tb: TracebackType | None) -> None:
        """Record how the block ended, as the launched script's recorder would (``bootstrap``): the
        exception, the main process's exit, the GPU spans still in flight."""
        now = time.perf_counter_ns
        if exc_type is not None and not issubclass(exc_type, SystemExit):
            where = traceback.extract_tb(tb)[-1] if tb is not None else None
            loader.record_open_next(exc_type.__name__)
            events.emit("exception", now(), exc_type.__name__, str(exc)[:2000],
                        f"{where.filename}:{where.lineno}" if where else None,
                        "".join(traceback.format_exception(exc_type, exc, tb))[-6000:])
        loader.record_open_next("exit")
        _pause_gpu_timing()
        events.emit("process_exit", now(), None)
        events.flush()

    def _stop(self) -> dict[str, Any] | None:
        """Undo what ``_start`` did, whatever part of it was done: this process records nothing more, and
        the environment, overrides and step limit are as they were."""
        samples = None
        with events._flush_lock:  # not in the middle of the background flusher's write
            events.reset()
        _pause_gpu_timing(drain=False)
        if self._sampler is not None:
            samples = self._sampler.stop()
            self._sampler = None
        self._restore_environ()
        _stop_forkserver_started_since(self._forkserver)
        if self._saved_overrides is not None:
            loader.overrides.clear()
            loader.overrides.update(self._saved_overrides)
        steps.max_steps = self._saved_max_steps
        return samples

    def _conclude(self) -> RunResult:
        assert self.run_dir is not None
        try:
            session = build_session(self.run_dir, self._meta,
                                    self._folding.finish() if self._folding is not None else None)
            session_path, save_error = launcher.save_session(session, self.run_dir)
            if save_error:
                launcher.write_ending(self.run_dir, self._meta)
                session.notes.append(f"{save_error}; its raw events stay in {self.run_dir / 'events'} "
                                     f"(stallscope report {self.run_dir} rebuilds it once there is room)")
        finally:
            if self._lock is not None:
                self._lock.close()
        outcome = RunOutcome(session, session_path, self._meta["exit_code"], save_error)
        return conclude(outcome, store=self.run_dir.parent.parent, history=self.history)

    def _set_environ(self, wanted: dict[str, str]) -> None:
        """Make ``os.environ`` what spawned workers need to start the recorder (``launcher._child_env``,
        less the launcher's pid), remembering what each changed variable was."""
        wanted = {**wanted, ENV_LAUNCHER_PID: NO_LAUNCHER}
        for name in set(os.environ) - set(wanted):
            self._saved_environ[name] = os.environ.pop(name)
        for name, value in wanted.items():
            if os.environ.get(name) != value:
                self._saved_environ.setdefault(name, os.environ.get(name))
                os.environ[name] = value

    def _restore_environ(self) -> None:
        for name, value in self._saved_environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_environ = {}

    # -- the result -----------------------------------------------------------------------------------------

    def _done(self) -> RunResult:
        if self.result is None:
            raise RecordingError("no result yet: the recording's with-block has not ended" if _active is self
                                 else "no result: the recording has not run, or could not be concluded")
        return self.result

    def summary(self) -> dict[str, Any]:
        """The summary JSON (schema ``stallscope.summary/1``), as ``stallscope run --json`` writes it."""
        return self._done().summary

    @property
    def session(self) -> Session:
        return self._done().session

    @property
    def analysis(self) -> Any:
        return self._done().analysis

    @property
    def verdict(self) -> str:
        return self._done().verdict

    @property
    def session_path(self) -> Path | None:
        return self._done().session_path

    @property
    def exit_code(self) -> int:
        return self._done().exit_code

    @property
    def history_error(self) -> str | None:
        return self._done().history_error

    def __repr__(self) -> str:
        if self.result is None:
            return f"<stallscope.Recording {'recording' if _active is self else 'not concluded'}>"
        return f"<stallscope.Recording {self.result.session.run_id}: {self.result.verdict}>"

    def _repr_html_(self) -> str:
        """The terminal summary, in HTML (rich's export: every user string escaped, no plotly needed)."""
        if self.result is None:
            return f"<pre>{escape(repr(self))}</pre>"
        return summary_html(self.result)


_HTML_FRAME = ('<pre style="font-family: Menlo, \'DejaVu Sans Mono\', Consolas, monospace; font-size: 12px; '
               'line-height: 1.3; white-space: pre-wrap">{code}</pre>')


def summary_html(result: RunResult, width: int = 110) -> str:
    """What ``stallscope run`` prints at the end of a run, as an HTML fragment for a notebook."""

    from stallscope.render import terminal
    from stallscope.render.safe_text import safe_console

    console = safe_console(record=True, file=io.StringIO(), width=width, color_system="truecolor", force_terminal=True)
    terminal.render(result.session, result.analysis, console,
                    session_ref=str(result.session_path) if result.session_path else None)
    return console.export_html(inline_styles=True, code_format=_HTML_FRAME)


def _ending(exc_type: type[BaseException] | None, exc: BaseException | None) -> tuple[int, str]:
    """The exit code and ``ended_by`` a script ending the way the block did would have had under
    ``stallscope run``: 0, ``sys.exit``'s code, 1 for an exception, 130 for Ctrl-C (SIGINT)."""
    if exc_type is None:
        return 0, "exit"
    if issubclass(exc_type, SystemExit):
        code = getattr(exc, "code", None)
        return (code if isinstance(code, int) else (0 if code is None else 1)), "exit"
    if issubclass(exc_type, KeyboardInterrupt):
        return 130, "interrupt"
    return 1, "exit"


def _unrecorded_workers() -> list[str]:
    """What keeps spawned workers of this process from starting the recorder, said in the session."""
    notes = []
    if sys.flags.isolated or sys.flags.ignore_environment or sys.flags.no_site:
        notes.append("this Python runs with -I, -E or -S, which its spawned processes inherit: DataLoader workers "
                     "started with spawn or forkserver were not recorded (forked ones were)")
    try:
        from multiprocessing import forkserver

        # private, and the only way to ask whether a forkserver runs; AttributeError below where it changed
        if forkserver._forkserver._forkserver_pid is not None:  # type: ignore[attr-defined]
            notes.append("a forkserver was running before the recording started: DataLoader workers it started "
                         "were not recorded (fork and spawn workers are)")
    except (ImportError, AttributeError):
        pass
    return notes


def _forkserver_pid() -> int | None:
    try:
        from multiprocessing import forkserver

        return forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]  # private, as above
    except (ImportError, AttributeError):
        return None


def _stop_forkserver_started_since(before: int | None) -> None:
    """A forkserver started in the block has the recorder on, for this block's run: stopped, so that later
    workers come from a new one, recorded in their own block or not at all (its workers run on)."""
    pid = _forkserver_pid()
    if pid is None or pid == before:
        return
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def _resume_gpu_timing() -> None:
    """CUDA initialised before the block (an earlier cell): record copies and CUDA events from now on, as
    the recorder does once a launched script initialises CUDA."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is None or not cuda.is_initialized():
        return
    if not transfer._installed:
        cuda._lazy_init()  # patched (``transfer.install_after_cuda_init``): wraps the copies, starts CUDA events
    else:
        events.emit("cuda_init", time.perf_counter_ns(), cuda.get_device_name(cuda.current_device()))
        cuda_timing.enable(cuda)


def _pause_gpu_timing(drain: bool = True) -> None:
    """Stop putting CUDA events in the stream between blocks (resolving the block's own first)."""
    if cuda_timing._cuda is None:
        return
    if drain:
        cuda_timing._drain_at_exit()
    cuda_timing._cuda = None
    cuda_timing._ready = cuda_timing._last_end = None
    cuda_timing._pending.clear()
    cuda_timing.dropped = 0


# -- IPython ---------------------------------------------------------------------------------------------------


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext stallscope``: the ``%%stallscope [--store DIR] [--set NAME=VALUE] [--no-history]
    [--label TEXT] [--sample-interval SECONDS]`` cell magic records the cell and shows its summary in place
    of the cell's value. An exception in the cell is shown as IPython shows it and recorded as the run's
    failure; the summary still follows."""

    def stallscope(line: str, cell: str) -> Recording:
        rec = record(**_magic_options(line))
        code = compile(ipython.transform_cell(cell), "<%%stallscope cell>", "exec")
        try:
            with rec:
                exec(code, ipython.user_ns)  # noqa: S102 - the user's own cell, as IPython runs it
        except Exception:  # noqa: BLE001 - shown as IPython shows a cell's error; the summary follows
            ipython.showtraceback()
        return rec

    ipython.register_magic_function(stallscope, "cell", "stallscope")


def _magic_options(line: str) -> dict[str, Any]:
    import argparse

    from stallscope.settings import parse_overrides

    parser = argparse.ArgumentParser(prog="%%stallscope", add_help=False, exit_on_error=False)
    parser.add_argument("--store")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--no-history", action="store_true")
    parser.add_argument("--label")
    parser.add_argument("--sample-interval", type=float, default=0.1)
    try:
        args = parser.parse_args(shlex.split(line))
    except (SystemExit, argparse.ArgumentError) as exc:  # argparse exits on some errors whatever it is told
        raise ValueError(f"%%stallscope {line}: {exc}; options: --store DIR, --set NAME=VALUE, --no-history, "
                         "--label TEXT, --sample-interval SECONDS") from None
    return {"store": args.store, "overrides": parse_overrides(args.overrides), "history": not args.no_history,
            "label": args.label, "sample_interval_s": args.sample_interval}
