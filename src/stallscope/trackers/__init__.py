"""Send a run's results to an experiment tracker: MLflow, Weights & Biases or TensorBoard.

What is logged is the same everywhere (``metrics.py``): flat metrics, the verdict and limiting stage as tags,
and the summary JSON and HTML report as files. When the script started a run of that tracker itself (the
recorder saw ``mlflow.start_run``, ``wandb.init`` or a ``SummaryWriter``: ``Session.tracker_runs``), the
results go to that run; otherwise a new one is made where the tracker's own settings point. Each tracker's
library is imported only here, on use: none of them is a dependency of stallscope.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stallscope.session import Session

#: --to / --log-to name -> (the module that must be importable, the stallscope extra that installs it).
TRACKERS: dict[str, tuple[str, str]] = {
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
    "tensorboard": ("tensorboard", "tensorboard"),
}
#: Names of the files logged next to the metrics.
SUMMARY_FILE = "stallscope-summary.json"
REPORT_FILE = "stallscope-report.html"


class TrackerUnavailable(Exception):
    """The tracker's library is not installed (or does not import): the message says what to install."""


def needs(target: str, flag: str = "--to") -> str:
    """The one-line explanation of a missing tracker library."""
    module, extra = TRACKERS[target]
    return f"{flag} {target} needs {module}; install it with: pip install 'stallscope[{extra}]'"


def missing_library(target: str, flag: str = "--to") -> str | None:
    """Why ``target`` cannot be used, checked without importing it (cheap, before a run starts), or None."""
    try:
        found = importlib.util.find_spec(TRACKERS[target][0]) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else needs(target, flag)


def script_run(session: Session, tracker: str) -> dict[str, Any] | None:
    """The first run of ``tracker`` the script started (the outermost, when it nested runs), or None."""
    return next((run for run in session.tracker_runs if run.get("tracker") == tracker), None)


def log_run(summary: dict[str, Any], session: Session, target: str, *, analysis: Any = None,
            uri: str | None = None, log_dir: str | None = None, project: str | None = None,
            warn: Callable[[str], None] | None = None) -> str:
    """Log the run to ``target`` and say where it went (e.g. ``MLflow run abc at sqlite:///mlflow.db``).

    ``analysis`` is the run's analysis when the caller has it (the HTML report is built from it; it is
    computed again otherwise). ``warn`` receives a one-line note when the HTML report cannot be made.
    Raises ``TrackerUnavailable`` when the library is missing; any other exception is the tracker's own.
    """
    if target not in TRACKERS:
        raise ValueError(f"unknown tracker {target!r} (choose from {', '.join(TRACKERS)})")
    try:
        backend = importlib.import_module(f"stallscope.trackers.to_{target}")
        backend.require()
    except ImportError as exc:
        raise TrackerUnavailable(needs(target)) from exc
    with tempfile.TemporaryDirectory(prefix="stallscope-export-") as folder, _library_threads_contained() as failed:
        files = write_files(summary, session, analysis, Path(folder), warn or _stderr)
        if target == "mlflow":
            where = backend.log(summary, session, files, uri=uri)
        elif target == "wandb":
            where = backend.log(summary, session, files, project=project)
        else:
            where = backend.log(summary, session, files, log_dir=log_dir)
        if failed:  # a writer thread lost what it was given while the calls above returned as if all went well
            raise failed[0]
        return where


@contextlib.contextmanager
def _library_threads_contained() -> Iterator[list[BaseException]]:
    """Keep the trackers' own threads and loggers from printing tracebacks over our one-line error.

    TensorBoard writes event files from a thread of its own, and W&B logs from several: on a full disk or a
    read-only folder each prints a traceback ("Exception in thread ...", "--- Logging error ---", hundreds of
    lines from W&B) before the export's own error says what went wrong. Their exceptions are collected
    instead (the yielded list, the first is raised by the caller when nothing else was) and logging's own
    failures are not printed; both are restored afterwards."""
    failed: list[BaseException] = []
    previous_hook, previous_raise = threading.excepthook, logging.raiseExceptions
    earlier = set(threading.enumerate())  # threads the export did not start (by object: an ident is reused)

    def collect(args: threading.ExceptHookArgs) -> None:
        if args.thread in earlier:
            previous_hook(args)  # not this export's: a lingering thread of an earlier tracker, the script's own
        elif args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            failed.append(args.exc_value)

    threading.excepthook, logging.raiseExceptions = collect, False
    try:
        yield failed
    finally:
        threading.excepthook, logging.raiseExceptions = previous_hook, previous_raise


def write_files(summary: dict[str, Any], session: Session, analysis: Any, folder: Path,
                warn: Callable[[str], None]) -> list[Path]:
    """The summary JSON and, when plotly is installed, the HTML report, written into ``folder``."""
    files = [folder / SUMMARY_FILE]
    files[0].write_text(json.dumps(summary, indent=1, sort_keys=True), encoding="utf-8")
    try:
        from stallscope.analysis import analyze
        from stallscope.render import html

        page = html.render(session, analysis if analysis is not None else analyze(session))
    except ImportError as exc:  # plotly (the charts) is the `report` extra
        warn(f"logging the summary JSON without the HTML report: it needs plotly ({exc.name or exc}); "
             "install it with: pip install 'stallscope[report]'")
        return files
    files.append(html.write_html(folder / REPORT_FILE, page))
    return files


def failure_line(exc: BaseException) -> str:
    """A tracker's exception as one line (their messages can run to pages); a file where a folder should be is
    said in words (the OS's 'File exists' for mkdir over a file says the opposite of what is wrong)."""
    if isinstance(exc, (FileExistsError, NotADirectoryError)) and exc.filename:
        return f"{exc.filename} (or a folder above it) is a file, where a folder is needed"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {_shortened(text.splitlines()[0]) if text else repr(exc)}"


def _shortened(line: str, most: int = 300) -> str:
    """``line`` cut to about ``most`` characters at a space, marked as cut: a URL or path in it stays whole
    where it ends before the cut (MLflow's message for a bad tracking URI quotes the URI, then pages of advice)."""
    if len(line) <= most:
        return line
    space = line.rfind(" ", 0, most)
    return f"{line[:space if space > most // 2 else most].rstrip(' ,;:')} …"


def _stderr(message: str) -> None:
    print(f"stallscope: {message}", file=sys.stderr)
