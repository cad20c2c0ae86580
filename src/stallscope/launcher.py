"""Start the unmodified script with the recorder injected, and save what it measured as a Session.

The script runs in a child process with our ``sitecustomize`` on ``PYTHONPATH``, so every
Python process of the job (the script, spawn/forkserver workers) starts the recorder. The
launcher forwards Ctrl-C and SIGTERM to the child's process group, waits, and always builds
and saves the session, whether the script succeeded, crashed, or was interrupted. Analysis and
history are ``api.run``'s: this module only runs processes and collects their records.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stallscope
from stallscope import environment, paths
from stallscope.collect import build_session
from stallscope.sample import SystemSampler
from stallscope.session import Session
from stallscope.settings import (
    ENV_LAUNCHER_PID,
    ENV_MAX_STEPS,
    ENV_OVERRIDES,
    ENV_PKG_PARENT,
    ENV_RUN_DIR,
    encode_overrides,
)

INJECT_DIR = Path(__file__).resolve().parent / "record" / "_inject"


class LaunchError(RuntimeError):
    """The command could not be started (not found, not executable, bad arguments)."""


@dataclass(frozen=True)
class RunOutcome:
    session: Session
    session_path: Path
    exit_code: int


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
        raise LaunchError(f"command not found: {first}")
    if Path(first).name.startswith("python") and len(command) > 1 and command[1].endswith(".py") \
            and not Path(command[1]).is_file():
        raise LaunchError(f"script not found: {command[1]}")
    return list(command)


def _child_env(run_dir: Path, overrides: dict[str, Any], max_steps: int | None) -> dict[str, str]:
    env = dict(os.environ)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(INJECT_DIR) + (os.pathsep + existing if existing else "")
    env[ENV_RUN_DIR] = str(run_dir)
    env[ENV_LAUNCHER_PID] = str(os.getpid())
    env[ENV_PKG_PARENT] = str(Path(stallscope.__file__).resolve().parent.parent)
    env[ENV_OVERRIDES] = encode_overrides(overrides)
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


class _SignalForwarder:
    """Forward Ctrl-C / SIGTERM to the child's process group, escalating on repeats."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalForwarder:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        escalation = {1: signum, 2: signal.SIGTERM}.get(len(self.received), signal.SIGKILL)
        try:
            os.killpg(self.child.pid, escalation)
        except (ProcessLookupError, PermissionError):
            pass


def launch(command: list[str], *, module: str | None = None, store: str | os.PathLike[str] | None = None,
        overrides: dict[str, Any] | None = None, max_steps: int | None = None,
        stdout: Any = None, stderr: Any = None, sample_interval_s: float = 0.1) -> RunOutcome:
    """Run ``command`` under the recorder and return the saved Session and the script's exit code.

    ``sample_interval_s``: period of the system sampler (0 turns it off).
    """
    overrides = dict(overrides or {})
    argv = resolve_command(list(command), module)
    store_dir = paths.store_dir(store)
    run_id = paths.new_run_id()
    run_dir = paths.runs_dir(store_dir) / run_id
    try:
        (run_dir / "events").mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # nowhere to save what is measured: say so before the script runs, not after
        raise LaunchError(f"cannot save sessions in {store_dir}: {exc.strerror or exc}; choose another place "
                          "with --store DIR or $STALLSCOPE_HOME") from None
    meta: dict[str, Any] = {
        "run_id": run_id,
        "command": argv,
        "cwd": os.getcwd(),
        "started_wall": time.time(),
        "overrides": overrides,
        "max_steps": max_steps,
        "environment": environment.fingerprint(),
        "checks": _quick_checks(),
    }
    try:
        (run_dir / "run.json").write_text(json.dumps(meta, indent=1))
    except OSError as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise LaunchError(f"cannot save sessions in {store_dir}: {exc.strerror or exc}") from None

    meta["start_ns"] = time.perf_counter_ns()
    try:
        child = subprocess.Popen(argv, env=_child_env(run_dir, overrides, max_steps), start_new_session=True,
                                 stdout=stdout, stderr=stderr)
    except OSError as exc:
        raise LaunchError(f"could not start {argv[0]}: {exc}") from None
    sampler = SystemSampler(child.pid, sample_interval_s) if sample_interval_s > 0 else None
    if sampler is not None:
        sampler.start()
    with _SignalForwarder(child) as forwarder:
        while True:
            try:
                returncode = child.wait()
                break
            except KeyboardInterrupt:  # only if a signal arrived before our handler was installed
                continue
    meta["end_ns"] = time.perf_counter_ns()
    if sampler is not None:
        meta["system_samples"] = sampler.stop()
    exit_code = 128 - returncode if returncode < 0 else returncode
    if forwarder.received:
        meta["ended_by"] = "interrupt"
        meta["notes"] = [f"stopped by {signal.Signals(forwarder.received[0]).name} sent to stallscope"]
    elif returncode < 0:
        meta["ended_by"] = "signal"
        meta["notes"] = [f"the script was killed by {signal.Signals(-returncode).name}"]
    else:
        meta["ended_by"] = "exit"
    meta["exit_code"] = exit_code
    session = build_session(run_dir, meta)
    session_path = session.save(run_dir / "session.json")
    shutil.rmtree(run_dir / "events", ignore_errors=True)
    return RunOutcome(session, session_path, exit_code)
