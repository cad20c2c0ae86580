"""What the verbs that record a run share: their options and what they print once it ended."""

from __future__ import annotations

import argparse
import errno
import math
import os
import sys

from stallscope import api, paths
from stallscope.api import LaunchError, RunResult
from stallscope.cli.args import folder, output_error
from stallscope.oserrors import os_error_words
from stallscope.render import terminal
from stallscope.render.safe_text import printable, terminal_console
from stallscope.render.summary import write_summary
from stallscope.settings import ENV_TRIAL_FIGURES, OverrideError, parse_overrides, set_help
from stallscope.trackers import TRACKERS, failure_line, log_run, missing_library


def after_dashes(items: list[str]) -> list[str]:
    """The words after ``--`` (argparse keeps the separator at the head of a REMAINDER)."""
    return items[1:] if items and items[0] == "--" else list(items)


def say(verb: str, message: str) -> None:
    """One line of the verb's on stderr; its text (paths, arguments, exception messages) shown without control codes."""
    print(printable(f"stallscope {verb}: {message}"), file=sys.stderr)


def fail(verb: str, message: str) -> int:
    """Bad input: one line on stderr, exit code 2."""
    say(verb, message)
    return 2


def store_write_error(exc: OSError, store: str | None) -> str:
    """Why the store could not take what ``tune`` or ``bench`` writes there (trial folders, their records), in one
    line naming where: a write that fails for want of room names no file (only opening one does), so the store
    folder is named then, with the system's reason and what to do about it."""
    where = exc.filename or f"in the store {paths.store_dir(store)}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space there, or choose another store with --store DIR"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable, or choose another store with --store DIR"
    elif exc.filename:
        fix = "choose another store with --store DIR"
    else:  # not the store's: starting a trial failed (too many processes or open files, no memory)
        return f"could not start a trial: {exc.strerror or exc}"
    return f"cannot write {where}: {exc.strerror or exc}; {fix}"


def load_error(exc: OSError | ValueError, run: str | None = None) -> str:
    """Why a saved run (a RUN argument: its session file, run folder or raw events) could not be loaded, in one
    line: a file the system would not let us read is named with the reason in words, never as Python's
    ``[Errno 13] Permission denied: '...'``, nor an error of the system that names no file as a bare
    ``[Errno 2] No such file or directory``; anything else (no such run, not a session) says it already."""
    if not isinstance(exc, OSError) or (not exc.filename and not exc.strerror):
        return str(exc)  # stallscope's own message (paths.resolve_run's), which names the places it looked
    if not exc.filename or not exc.strerror:
        return f"cannot load {'the run' if run is None else f'run {run!r}'}: {os_error_words(exc)}"
    reason = exc.strerror[:1].lower() + exc.strerror[1:]
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"cannot read {exc.filename}: {reason}; its owner can make it readable with: chmod a+r "
                f"{exc.filename}")
    return f"cannot read {exc.filename}: {reason}"


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="write the summary JSON (schema stallscope.summary/1) here")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                   help=set_help())
    p.add_argument("--steps", type=int, metavar="N", help="stop the job cleanly after N training steps")
    p.add_argument("--store", metavar="DIR", type=folder,
                   help="where sessions are saved (default ./.stallscope or $STALLSCOPE_HOME)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="do not print the summary, nor the status line shown under the script's output while it runs")
    p.add_argument("--sample-interval", type=float, default=0.1, metavar="SECONDS",
                   help="period of the system sampler (CPU, memory, GPU); 0 turns it off (default 0.1)")
    p.add_argument("--log-to", action="append", default=[], choices=sorted(TRACKERS), metavar="TRACKER",
                   help="after the run, log its metrics, verdict, summary JSON and HTML report to mlflow, wandb or "
                        "tensorboard (repeatable): the script's own run of that tracker, else a new one "
                        "($MLFLOW_TRACKING_URI, $WANDB_PROJECT/WANDB_MODE, ./runs/stallscope/RUN_ID); "
                        "see stallscope export --help")


def run_options_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the options ``add_run_options`` defines, if anything."""
    if problem := next((m for t in getattr(args, "log_to", None) or [] if (m := missing_library(t, "--log-to"))
                        is not None), None):
        return problem  # refused before the script starts: its results could not be logged
    if args.steps is not None and args.steps < 1:
        return "--steps must be at least 1"
    if not math.isfinite(args.sample_interval) or args.sample_interval < 0:
        return "--sample-interval must be 0 (off) or a positive number of seconds"
    return output_error([args.json], getattr(args, "store", None))


def parse_set(verb: str, items: list[str]) -> dict | None:
    """The ``--set`` items parsed, or None after saying what is wrong with them."""
    try:
        return parse_overrides(items)
    except OverrideError as exc:
        fail(verb, str(exc))
        return None


def record(verb: str, command: list[str], *, module: str | None, store: str | None, overrides: dict,
           max_steps: int | None, json_path: str | None, quiet: bool,
           sample_interval_s: float = 0.1, log_to: list[str] | None = None,
           live: bool | None = None) -> tuple[int, RunResult | None]:
    """Run through ``stallscope.api.run`` and print what it found: the exit code and the result (None if
    the command could not start). ``log_to``: trackers to send the results to afterwards (``--log-to``);
    ``live``: the status line while it runs (default: unless ``quiet``; only where stdout and stderr are one
    terminal)."""
    trial_figures = os.environ.pop(ENV_TRIAL_FIGURES, None)  # a tune trial's: the script never sees it
    try:
        result = api.run(command, module=module, store=store, overrides=overrides, max_steps=max_steps,
                         sample_interval_s=sample_interval_s,
                         live=not quiet if live is None else live)
    except LaunchError as exc:
        say(verb, str(exc))
        return 2, None
    report_run(verb, result, json_path=json_path, quiet=quiet)
    if trial_figures:
        from stallscope.tuning.trials import write_trial_figures

        try:
            write_trial_figures(trial_figures, result.session, result.analysis)
        except OSError:  # the tuner then analyses the saved session itself
            pass
    for target in dict.fromkeys(log_to or []):
        log_to_tracker(verb, result, target)
    return result.exit_code, result


def log_to_tracker(verb: str, result: RunResult, target: str) -> None:
    """``--log-to``: one line saying where the run went, or why not. Never changes the exit code."""
    def note(line: str) -> None:
        say(verb, line)

    try:
        where = log_run(result.summary, result.session, target, analysis=result.analysis, warn=note)
        note(f"logged to {where}")
    except (Exception, KeyboardInterrupt, SystemExit) as exc:  # noqa: BLE001 - the run is over and saved:
        # a tracker's failure (or Ctrl-C while logging) costs only the logging, never the exit code
        try:
            note(f"warning: could not log to {target}: {failure_line(exc)}")
        except (OSError, ValueError):
            pass


#: Said after "the run was not added to the history": its session is saved, so the history can get it back.
HISTORY_REBUILD_HINT = ("; stallscope history --rebuild adds it from its saved session (it keeps a damaged history "
                        "aside; a full disk needs space freed first)")


def report_run(verb: str, result: RunResult, *, json_path: str | None, quiet: bool) -> None:
    """After a recorded run: the history warning if any, the summary JSON, the terminal summary. Nothing
    here may change the exit code: a full disk or a closed terminal (SIGHUP) costs the output, not the
    script's code. A ``--json`` file that could not be written is an error all the same (what reads it will not
    find it), said last, under the summary, where it is seen."""
    try:
        if result.history_error:
            say(verb, f"warning: the run was not added to the history: {result.history_error}"
                      f"{HISTORY_REBUILD_HINT if result.session_path else ''}")
        json_error = None
        if json_path:
            try:
                write_summary(json_path, result.summary)
            except OSError as exc:
                json_error = (f"stallscope {verb}: error: the summary JSON was not written to {json_path}: "
                              f"{exc.strerror or exc} (the exit code is still the script's, {result.exit_code})")
        if not quiet:
            terminal.render(result.session, result.analysis, terminal_console(stderr=True),
                            session_ref=str(result.session_path) if result.session_path else None)
        if json_error:
            print(printable(json_error), file=sys.stderr)
    except (OSError, SystemExit, KeyboardInterrupt):
        # stderr is gone (terminal hung up, a closed pipe: cli.main has rich raise BrokenPipeError), or a
        # Ctrl-C after the script ended: the session is saved all the same, and the exit code stays the
        # script's. Later writes go nowhere.
        _silence_stderr()


def _silence_stderr() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
