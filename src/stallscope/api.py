"""The library's front door for a run: record -> Session -> Analysis -> history -> summary.

``stallscope.run(...)`` and the ``run`` and ``demo`` verbs all go through :func:`run`, so a script that
calls the library gets exactly what the CLI prints and saves: the same analysis, the same summary JSON,
the same row in the history.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallscope import paths
from stallscope.analysis import Analysis, analyze
from stallscope.history import store as history_store
from stallscope.history.runs import row_from_session
from stallscope.launcher import LaunchError, RunOutcome, launch
from stallscope.oserrors import os_error_words
from stallscope.render.summary import summary_dict
from stallscope.session import Session

__all__ = ["LaunchError", "RunResult", "conclude", "record_history", "run"]


@dataclass(frozen=True)
class RunResult:
    """What one recorded run gives: the script's exit code, what was measured, and what it means."""
    exit_code: int
    session: Session
    session_path: Path | None  # None when the session could not be saved (the reason is in history_error)
    analysis: Analysis
    summary: dict[str, Any]  # the summary JSON (schema stallscope.summary/1), as ``run --json`` writes it
    history_error: str | None = None  # why the run is not in the history, when it could not be added

    @property
    def verdict(self) -> str:
        return self.analysis.verdict


def record_history(store: str | os.PathLike[str] | None, session: Session, analysis: Analysis,
                   session_path: str | os.PathLike[str] | None) -> str | None:
    """Add the run to its store's history; the reason it could not be added, or None. A history failure
    never fails a run: the session itself is saved already."""
    try:
        history_store.record_run(paths.store_dir(store), row_from_session(session, analysis, session_path))
        return None
    except OSError as exc:  # said with its file: Python's own words may name none ([Errno 2] ...)
        return os_error_words(exc, store)
    except Exception as exc:  # noqa: BLE001 - the run itself succeeded; the history is secondary
        return str(exc) or repr(exc)


def run(command: list[str], *, module: str | None = None, store: str | os.PathLike[str] | None = None,
        overrides: dict[str, Any] | None = None, max_steps: int | None = None, sample_interval_s: float = 0.1,
        history: bool = True, stdout: Any = None, stderr: Any = None, live: bool = False) -> RunResult:
    """Run ``command`` (``["python", "train.py", ...]``, or ``["train.py", ...]``) unmodified under the
    recorder, analyse it, add it to the history, and return the result.

    ``overrides``: DataLoader arguments changed at construction (``{"num_workers": 4}``, as ``--set``);
    ``max_steps``: stop the job cleanly after that many training steps; ``sample_interval_s``: period of
    the system sampler (0 turns it off); ``live``: a status line under the script's output while it runs,
    where stdout and stderr are one terminal (the CLI's default). Raises :class:`LaunchError` when the command
    cannot start.
    """
    outcome = launch(command, module=module, store=store, overrides=overrides, max_steps=max_steps,
                     stdout=stdout, stderr=stderr, sample_interval_s=sample_interval_s, live=live)
    return conclude(outcome, store=store, history=history)


def conclude(outcome: RunOutcome, *, store: str | os.PathLike[str] | None, history: bool) -> RunResult:
    """Analyse a recorded run, add it to the history and build its summary: one place for what follows a
    recording, whether it was launched (:func:`run`) or made in-process (``stallscope.record``)."""
    analysis = analyze(outcome.session)
    if outcome.save_error:  # nothing saved to point a history row at (and the disk is likely full)
        error = outcome.save_error if history else None
    else:
        error = record_history(store, outcome.session, analysis, outcome.session_path) if history else None
    return RunResult(outcome.exit_code, outcome.session, outcome.session_path, analysis,
                     summary_dict(outcome.session, analysis, outcome.session_path), error)
