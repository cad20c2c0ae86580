"""Start the unmodified script with the recorder injected, and save what it measured as a Session.

The script runs in a child process with our ``sitecustomize`` on ``PYTHONPATH``, so every
Python process of the job (the script, spawn/forkserver workers) starts the recorder. The
launcher forwards Ctrl-C, SIGTERM, SIGHUP and SIGQUIT to the child's process group, stops and
continues it with the launcher (Ctrl-Z, ``fg``), waits, and always builds the session, whether the
script succeeded, crashed, or was interrupted. The child gets SIGTERM when the launcher dies, even
by SIGKILL (Linux), so training never outlives it; what such a run recorded stays in its run
directory and ``stallscope report RUNDIR`` rebuilds it (``collect.recover_session``). When the
session cannot be saved (disk full), it is still returned, with the reason, and the raw events are
kept. Analysis and history are ``api.run``'s: this module only runs processes and collects records.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stallscope
from stallscope import environment, paths
from stallscope.collect import build_session
from stallscope.constants import EVENTS_LOST_NOTE, HISTORY_FILENAME
from stallscope.folding import FOLDED_DIR, FoldingThread
from stallscope.job_names import run_label
from stallscope.sample import SystemSampler
from stallscope.session import Session
from stallscope.settings import (
    ENV_LAUNCHER_PID,
    ENV_MAX_STEPS,
    ENV_OVERRIDES,
    ENV_PKG_PARENT,
    ENV_PYTHON_VERSION,
    ENV_RUN_DIR,
    PROCESS_SETTINGS,
    encode_overrides,
)

INJECT_DIR = Path(__file__).resolve().parent / "recorder" / "_inject"


class LaunchError(RuntimeError):
    """The command could not be started (not found, not executable, bad arguments)."""


@dataclass(frozen=True)
class RunOutcome:
    session: Session
    session_path: Path | None  # None when the session could not be saved (see save_error)
    exit_code: int
    save_error: str | None = None


def resolve_command(command: list[str], module: str | None = None) -> list[str]:
    """``train.py ARGS`` and ``-m pkg ARGS`` run with this Python; anything else runs as given."""
    if module:
        return [sys.executable, "-m", module, *command]
    if not command:
        raise LaunchError("no command given: use  stallscope run -- python train.py ARGS")
    first = command[0]
    if first == "-m":
        if len(command) < 2:
            raise LaunchError("-m needs a module name")
        return [sys.executable, *command]
    if first.endswith(".py"):
        if not Path(first).is_file():
            raise LaunchError(f"script not found: {first}")
        return [sys.executable, *command]
    if shutil.which(first) is None:
        if os.sep in first and Path(first).is_file():  # a path to a file the user may not execute
            raise LaunchError(f"not executable: {first} (run it with its interpreter, e.g. stallscope run -- "
                              f"python {first}, or chmod +x it)")
        raise LaunchError(f"command not found: {first}")
    if Path(first).name.startswith("python") and len(command) > 1 and command[1].endswith(".py") \
            and not Path(command[1]).is_file():
        raise LaunchError(f"script not found: {command[1]}")
    return list(command)


#: Python options that keep the recorder out: -I and -E ignore PYTHONPATH, -S skips the site module.
_UNRECORDABLE = {"I": "-I ignores PYTHONPATH", "E": "-E ignores PYTHONPATH", "S": "-S skips sitecustomize"}
#: Python options that take a value (possibly as the next word).
_OPTIONS_WITH_VALUE = set("WXQ")


def unrecordable_python_option(argv: list[str]) -> str | None:
    """Why ``argv`` (a Python command) cannot be recorded, when one of its options keeps our start-up hook
    out; None otherwise. Only the interpreter's own options count (those before the script, -m or -c)."""
    if not argv or not Path(argv[0]).name.startswith("python"):
        return None
    words = iter(argv[1:])
    for word in words:
        if not word.startswith("-") or word in ("-", "--") or word.startswith("--"):
            return None
        letters = word[1:]
        for k, letter in enumerate(letters):
            if letter in _UNRECORDABLE:
                return f"python {_UNRECORDABLE[letter]}, through which the recorder starts"
            if letter in "cm":
                return None
            if letter in _OPTIONS_WITH_VALUE:
                if k == len(letters) - 1:
                    next(words, None)
                break
    return None


def _child_env(run_dir: Path, overrides: dict[str, Any], max_steps: int | None) -> dict[str, str]:
    env = dict(os.environ)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(INJECT_DIR) + (os.pathsep + existing if existing else "")
    env[ENV_RUN_DIR] = str(run_dir)
    env[ENV_LAUNCHER_PID] = str(os.getpid())
    env[ENV_PKG_PARENT] = str(Path(stallscope.__file__).resolve().parent.parent)
    env[ENV_PYTHON_VERSION] = f"{sys.version_info[0]}.{sys.version_info[1]}"
    env[ENV_OVERRIDES] = encode_overrides(overrides)
    for name, value in overrides.items():  # --set of an environment variable (PYTORCH_CUDA_ALLOC_CONF): for the job
        if name in PROCESS_SETTINGS and PROCESS_SETTINGS[name].env and value is not None:
            env[name] = str(value)
    if max_steps is not None:
        env[ENV_MAX_STEPS] = str(max_steps)
    else:
        env.pop(ENV_MAX_STEPS, None)
    return env


def _quick_checks() -> list[dict[str, Any]]:
    """The doctor's fast machine checks, attached to every session when the doctor is available."""
    try:
        from stallscope.health import quick_checks
    except ImportError:
        return []
    try:
        return [check.to_dict() for check in quick_checks()]
    except Exception as exc:  # a broken check must not lose the run
        return [{"id": "doctor", "status": "unknown", "value": None, "why": f"quick checks failed: {exc!r}"}]


#: Signals that end the job: forwarded to the script's process group like a terminal would deliver them.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
#: The same ending signal again within this many seconds is one signal delivered twice, not a second Ctrl-C:
#: ``timeout -s INT`` (and ``kill -INT -- -PGID`` from a job's script) sends it to stallscope and then to the group
#: stallscope is in, microseconds apart or a few scheduler slices where the cores are busy. Escalated, it cut short
#: the script's own Ctrl-C handling (a checkpoint being saved) with SIGTERM. A person who reads that the first was
#: ignored and presses Ctrl-C again takes longer than this (a reaction alone takes about 0.2 s).
REPEAT_WINDOW_S = 0.1
_PR_SET_PDEATHSIG = 1


class _SignalForwarder:
    """Forward ending signals to the child's process group (escalating to SIGTERM, then SIGKILL, on
    repeats, but not on the same signal delivered twice within ``REPEAT_WINDOW_S``), and stop and continue it
    with the launcher. The launcher's other threads block these signals (``background.start_thread``), so the
    main thread, waiting for the child, takes them at once.

    The child runs in its own session, so a terminal's Ctrl-Z reaches only the launcher; and SIGTSTP
    sent to that orphaned group would be discarded by the kernel, so the child is stopped with SIGSTOP.
    """

    def __init__(self, child: subprocess.Popen[bytes], clock: Callable[[], float] = time.monotonic) -> None:
        self.child = child
        self.clock = clock
        self.received: list[int] = []
        self.last_received_at = -float("inf")
        self.repeats = 0  # the same signal again within REPEAT_WINDOW_S: not forwarded again
        self.sent: int | None = None  # the last ending signal sent to the script's group
        self.stand_ins: set[int] = set()  # signals sent in place of one received (SIGTERM for a second Ctrl-C)
        self.paused_ns = 0
        self.pauses = 0
        self.pause_spans: list[dict[str, int]] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalForwarder:
        for sig in FORWARDED_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._forward)
        self._previous[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, self._suspend)
        self._previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, self._resume)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.child.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _forward(self, signum: int, frame: Any) -> None:
        now = self.clock()
        if self.received and self.received[-1] == signum and now - self.last_received_at < REPEAT_WINDOW_S:
            self.repeats += 1  # the one just forwarded, delivered twice
            return
        self.last_received_at = now
        self.received.append(signum)
        self.sent = self.escalation(len(self.received), signum)
        if self.sent != signum:
            self.stand_ins.add(self.sent)
        self._signal_group(self.sent)

    @staticmethod
    def escalation(count: int, signum: int) -> int:
        """What the ``count``-th ending signal received is forwarded as: itself first, SIGTERM, then SIGKILL."""
        return {1: signum, 2: signal.SIGTERM}.get(count, signal.SIGKILL)

    def ended_by_escalation(self, returncode: int) -> bool:
        """The script ended of a signal stallscope sent in place of the one it received last (Ctrl-C twice: SIGTERM
        for the second). Not where that was the signal received (Ctrl-C, then a SIGTERM from outside)."""
        killed_by = -returncode if returncode < 0 else returncode - 128
        return killed_by in self.stand_ins and killed_by not in self.received

    def said(self) -> str:
        """The signals received, as a note says them: "SIGINT", "SIGINT sent to stallscope 2 times" reads as
        "SIGINT 2 times"; different ones in order ("SIGINT, then SIGTERM")."""
        names = [signal_name(s) for s in self.received]
        if len(set(names)) == 1:
            return names[0] + (f" sent to stallscope {len(names)} times" if len(names) > 1 else " sent to stallscope")
        return ", then ".join(names) + " sent to stallscope"

    def _suspend(self, signum: int, frame: Any) -> None:
        self._signal_group(signal.SIGSTOP)
        stopped = time.perf_counter_ns()
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stops here until continued (discarded where nobody could)
        signal.signal(signal.SIGTSTP, self._suspend)
        self._signal_group(signal.SIGCONT)
        resumed = time.perf_counter_ns()
        self.pauses += 1
        self.paused_ns += resumed - stopped
        self.pause_spans.append({"start_ns": stopped, "end_ns": resumed})

    def _resume(self, signum: int, frame: Any) -> None:
        self._signal_group(signal.SIGCONT)


def _die_with_parent() -> Any:
    """A ``preexec_fn`` that makes the child get SIGTERM when the launcher dies, whatever killed it
    (Linux's parent-death signal); None where that does not exist. libc is loaded before the fork.

    Only in a single-threaded launcher (the CLI): between fork and exec another thread's locks could be
    held. Elsewhere the recorder arms the same signal in the script's process (``recorder/bootstrap``)."""
    if not sys.platform.startswith("linux") or threading.active_count() > 1:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def signal_name(number: int) -> str:
    """SIGTERM for 15; ``signal 35`` for a number Python has no name for (real-time signals)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _exit_code(forwarder: _SignalForwarder, returncode: int) -> int:
    """The script's exit code as a shell gives it (128 + the signal that killed it), except where it died of the
    SIGTERM or SIGKILL stallscope sent for a repeated Ctrl-C: then the code of the user's own last signal (130),
    which is what pressing Ctrl-C twice on the bare script ends with."""
    if forwarder.ended_by_escalation(returncode):
        return 128 + forwarder.received[-1]
    return 128 - returncode if returncode < 0 else returncode


def _ending(forwarder: _SignalForwarder, returncode: int) -> tuple[str, list[str]]:
    """How the run ended (``ended_by``) and what to say about it."""
    notes = []
    if forwarder.pauses:
        notes.append(f"the job was stopped (Ctrl-Z / SIGTSTP) {forwarder.pauses} time(s), "
                     f"{forwarder.paused_ns / 1e9:.1f} s in all, left out of the steps' times")
    if forwarder.received:
        said = forwarder.said()
        if forwarder.ended_by_escalation(returncode):
            killed_by = -returncode if returncode < 0 else returncode - 128
            return "interrupt", [*notes, f"stopped by {said}: the script went on after the first, so it was sent "
                                         f"{signal_name(killed_by)}"]
        if returncode < 0 or returncode - 128 in forwarder.received:
            return "interrupt", [*notes, f"stopped by {said}"]
        forwarded = ", then ".join(signal_name(s) if s == forwarder.escalation(k, s) else
                                   f"{signal_name(forwarder.escalation(k, s))} (for {signal_name(s)})"
                                   for k, s in enumerate(forwarder.received, start=1))
        return "exit", [*notes, f"{forwarded} {'were' if len(forwarder.received) > 1 else 'was'} forwarded to "
                                f"the script, which went on and exited with code {returncode}"]
    if returncode < 0:
        return "signal", [*notes, f"the script was killed by {signal_name(-returncode)}"]
    return "exit", notes


def save_session(session: Session, run_dir: Path) -> tuple[Path | None, str | None]:
    """Save the session and fold the raw events into it: (path, None), or (None, why) when it cannot be
    written, in which case no partial file stays behind and the raw events are kept to rebuild it. A run folder
    removed while the job ran (the script deleted the folder holding the store) is not made again for it."""
    if not run_dir.is_dir():
        return None, (f"the session was not saved: its folder {run_dir} was removed while the job ran, and making it "
                      "again would undo that; what was measured is in this summary")
    try:
        path = session.save(paths.store_path(run_dir, "session.json"))  # never through a link out of the run
    except paths.OutsideStoreError as exc:
        return None, str(exc)
    except OSError as exc:  # Session.save leaves no partial file behind
        reason = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else (exc.strerror or str(exc))
        return None, f"the session could not be saved in {run_dir}: {reason}"
    shutil.rmtree(run_dir / "events", ignore_errors=True)
    shutil.rmtree(run_dir / FOLDED_DIR, ignore_errors=True)
    (run_dir / ENDING_FILE).unlink(missing_ok=True)
    return path, None


#: Kept beside the raw events for ``collect.recover_session``: how the run ended, as the launcher saw it.
ENDING_FILE = "ending.json"
#: Its size, reserved when the run starts: a disk that fills during the run can still take the ending, written
#: over bytes the file already holds (writing into a new file would fail there). Room for the exit and some 60
#: Ctrl-Z stops; beyond that the first ones are kept.
ENDING_BYTES = 4096


def _reserve_ending(run_dir: Path) -> None:
    (run_dir / ENDING_FILE).write_bytes(b" " * ENDING_BYTES)


def write_ending(run_dir: Path, meta: dict[str, Any]) -> None:
    """Write the exit code, how the run ended, when, and the job's Ctrl-Z stops into the reserved ``ending.json``,
    in place; best effort (without it ``recover_session`` infers the code from the events)."""
    ending = {key: meta.get(key) for key in ("exit_code", "ended_by", "end_ns")}
    pauses = list(meta.get("pauses") or [])
    text = json.dumps({**ending, "pauses": pauses}).encode()
    while len(text) > ENDING_BYTES and pauses:
        pauses = pauses[:len(pauses) // 2]
        text = json.dumps({**ending, "pauses": pauses}).encode()
    if len(text) > ENDING_BYTES:
        return
    try:
        with open(run_dir / ENDING_FILE, "r+b") as fh:
            fh.write(text.ljust(ENDING_BYTES))
    except OSError:
        pass


def new_run(store: str | os.PathLike[str] | None, command: list[str], overrides: dict[str, Any],
            max_steps: int | None) -> tuple[Path, dict[str, Any]]:
    """Create the run directory and its ``run.json`` (the run's description, kept even when the session
    never is): shared by :func:`launch` and the in-process recorder, so both describe a run alike. Raises
    :class:`LaunchError` when the store cannot be written, before anything runs."""
    store_dir = paths.store_dir(store)
    run_id = paths.new_run_id(label=run_label(command))
    try:  # the store's own files only: a link planted in it that leads out is refused before anything runs
        run_dir = paths.store_path(store_dir, "runs", run_id)
        paths.store_path(store_dir, HISTORY_FILENAME)
    except paths.OutsideStoreError as exc:
        raise LaunchError(str(exc)) from None
    # The description first (its checks take a moment): a Ctrl-C meanwhile leaves no empty run folder behind.
    meta: dict[str, Any] = {
        "run_id": run_id,
        "command": command,
        "cwd": os.getcwd(),
        "started_wall": time.time(),
        "overrides": overrides,
        "max_steps": max_steps,
        "environment": environment.fingerprint(),
        "checks": _quick_checks(),
        "launcher_pid": os.getpid(),  # a run directory without session.json is in progress while it lives
        "start_ns": time.perf_counter_ns(),
    }
    try:
        paths.store_folder(store_dir, "runs", run_id, "events")
    except paths.OutsideStoreError as exc:  # a link made since the check above
        raise LaunchError(str(exc)) from None
    except OSError as exc:  # nowhere to save what is measured: say so before the script runs, not after
        raise LaunchError(f"cannot save sessions in {store_dir}: {exc.strerror or exc}; choose another place "
                          "with --store DIR or $STALLSCOPE_HOME") from None
    try:
        (run_dir / "run.json").write_text(json.dumps(meta, indent=1))
        _reserve_ending(run_dir)
    except OSError as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise LaunchError(f"cannot save sessions in {store_dir}: {exc.strerror or exc}; free some space or "
                          "choose another place with --store DIR or $STALLSCOPE_HOME") from None
    except BaseException:  # Ctrl-C between the two: nothing was measured, nothing to keep
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir, meta


def launch(command: list[str], *, module: str | None = None, store: str | os.PathLike[str] | None = None,
        overrides: dict[str, Any] | None = None, max_steps: int | None = None,
        stdout: Any = None, stderr: Any = None, sample_interval_s: float = 0.1, live: bool = False) -> RunOutcome:
    """Run ``command`` under the recorder and return the saved Session and the script's exit code.

    ``sample_interval_s``: period of the system sampler (0 turns it off). ``live``: keep a status line
    under the script's output where stdout and stderr are one terminal (``render/live.py``); ignored when ``stdout`` or
    ``stderr`` is given.
    """
    overrides = dict(overrides or {})
    argv = resolve_command(list(command), module)
    if (reason := unrecordable_python_option(argv)) is not None:
        raise LaunchError(f"cannot record this command: {reason}; run it without that option")
    run_dir, meta = new_run(store, argv, overrides, max_steps)
    with _in_progress(run_dir):
        return _run_child(argv, run_dir, meta, overrides, max_steps, stdout, stderr, sample_interval_s, live)


@contextlib.contextmanager
def _in_progress(run_dir: Path) -> Any:
    """Hold a lock on ``run.json`` while the run lasts: ``recover_session`` refuses a locked run, whoever
    started it (the CLI, a notebook calling ``stallscope.run``). The kernel drops it when we die."""
    handle = open(run_dir / "run.json", "rb")  # noqa: SIM115 - held for the run
    try:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except (ImportError, OSError):
            pass
        yield
    finally:
        handle.close()


def _live_view(run_dir: Path) -> Any:
    """The live view's terminal plumbing, or None unless stdout and stderr are the same terminal (nothing
    changes then: a pipe or a file gets exactly what the script wrote)."""
    try:
        from stallscope.render.live import LiveView, same_terminal
        from stallscope.sample.progress import ProgressTally

        if not same_terminal() or os.environ.get("TERM") == "dumb":
            return None

        return LiveView(ProgressTally(run_dir / "events").poll)
    except (ImportError, OSError):  # no pseudo-terminals here: run without the view
        return None


#: An empty file the launcher leaves in the events folder while the job runs: a folder without it at the end was
#: made anew after the run's own was removed (a process that wrote events after, such as a later epoch's workers).
EVENTS_MARK = ".launched"


def _mark(events: Path) -> bool:
    try:
        (events / EVENTS_MARK).touch()
    except OSError:
        return False
    return True


def _events_vanished(events: Path, marked: bool) -> bool | None:
    """Whether the run's events folder was removed while the job ran (a script that deletes the folder it started
    in, with the store in it): False if it is there as it was; None if it is gone; True if it was made again since
    (then it holds only what was written after)."""
    if not events.is_dir():
        return None
    return marked and not (events / EVENTS_MARK).exists()


def _run_child(argv: list[str], run_dir: Path, meta: dict[str, Any], overrides: dict[str, Any],
               max_steps: int | None, stdout: Any, stderr: Any, sample_interval_s: float,
               live: bool = False) -> RunOutcome:
    view = _live_view(run_dir) if live and stdout is None and stderr is None else None
    if view is not None:
        stdout = stderr = view.child_fd
    marked = _mark(run_dir / "events")
    try:
        child = subprocess.Popen(argv, env=_child_env(run_dir, overrides, max_steps), start_new_session=True,
                                 stdout=stdout, stderr=stderr, preexec_fn=_die_with_parent())  # noqa: PLW1509
    except OSError as exc:
        if view is not None:
            view.start()
            view.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        raise LaunchError(f"could not start {argv[0]}: {exc}") from None
    if view is not None:
        view.start()
    sampler = SystemSampler(child.pid, sample_interval_s) if sample_interval_s > 0 else None
    if sampler is not None:
        sampler.start()
    folding = FoldingThread(run_dir, sampler.snapshot if sampler is not None else None)
    folding.start()
    with _SignalForwarder(child) as forwarder:
        while True:
            try:
                returncode = child.wait()
                break
            except KeyboardInterrupt:  # only if a signal arrived before our handler was installed
                continue
        if view is not None:  # signals still forwarded: a Ctrl-C now cannot cost the session
            view.close()  # the status line erased, the script's last output copied: the summary prints below
    meta["end_ns"] = time.perf_counter_ns()
    if sampler is not None:
        meta["system_samples"] = sampler.stop()
    meta["exit_code"] = _exit_code(forwarder, returncode)
    meta["ended_by"], meta["notes"] = _ending(forwarder, returncode)
    meta["pauses"] = forwarder.pause_spans
    vanished = _events_vanished(run_dir / "events", marked)
    if vanished is not False:
        what = ("so nothing was measured" if vanished is None else
                "so what was measured is lost but for events written after, in a folder made anew")
        meta["notes"] = [*meta["notes"], f"{EVENTS_LOST_NOTE} ({run_dir}): the events recorded in it went with it, "
                         f"{what}; the script's exit code is kept"]
    session = build_session(run_dir, meta, folding.finish())
    session_path, save_error = save_session(session, run_dir)
    if save_error and run_dir.is_dir():
        write_ending(run_dir, meta)
        session.notes.append(f"{save_error}; its raw events stay in {run_dir / 'events'} "
                             f"(stallscope report {run_dir} rebuilds it once there is room)")
    return RunOutcome(session, session_path, meta["exit_code"], save_error)
