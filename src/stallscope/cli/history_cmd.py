"""``stallscope history``: the table of recorded runs, newest last, filterable."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from stallscope import paths
from stallscope.analysis import analyze
from stallscope.cli.args import at_least, folder
from stallscope.history.runs import RunRow, row_from_session
from stallscope.history.store import HistoryError, list_runs, rebuild_history
from stallscope.oserrors import os_error_words
from stallscope.render.history import history_table
from stallscope.render.safe_text import printable, safe_console, terminal_console
from stallscope.session import Session

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("history", help="the table of recorded runs",
                              description="List the runs recorded in the store's history (one row per "
                                          "stallscope run): step time, throughput, data wait, memory.",
                              epilog="examples:\n  stallscope history --limit 10\n"
                                     "  stallscope history --command train.py --since 2d\n"
                                     "  stallscope compare last~1 last",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", metavar="DIR", type=folder,
                   help="the store to read (default ./.stallscope or $STALLSCOPE_HOME)")
    p.add_argument("--command", metavar="TEXT", help="only runs whose command line contains TEXT")
    p.add_argument("--verdict", choices=["input-bound", "compute-bound", "balanced", "unknown"],
                   help="only runs with this verdict")
    p.add_argument("--git", metavar="COMMIT", help="only runs made at this git commit (a prefix is enough)")
    p.add_argument("--since", metavar="WHEN", help="only runs started since WHEN: YYYY-MM-DD, or an age like 2h, 3d")
    p.add_argument("--limit", type=at_least(0, most=1_000_000_000), default=30, metavar="N",
                   help="the N most recent runs (default 30; 0: all)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.add_argument("--rebuild", action="store_true",
                   help="make the history again from the store's saved sessions (after it was damaged or deleted); "
                        "the old file is kept beside it")
    p.set_defaults(handler=handle)


def _rows_from_sessions(store: Path, skipped: list[str], unreadable: list[str]) -> list[RunRow]:
    """Each saved session of the store as a history row, oldest first. Damaged ones are named in ``skipped``
    and left out; ones the file system would not let us read (permissions, I/O) go to ``unreadable``: their runs
    still exist, so a history without them would lose them."""
    files = sorted(paths.runs_dir(store).glob("*/session.json"))
    rows: list[RunRow] = []
    with Progress(TextColumn("rebuilding the history"), BarColumn(), MofNCompleteColumn(),
                  console=safe_console(stderr=True), disable=not sys.stderr.isatty() or len(files) < 5) as progress:
        task = progress.add_task("sessions", total=len(files))
        for path in files:
            try:
                session = Session.load(path)
                rows.append(row_from_session(session, analyze(session), path))
            except OSError as exc:
                unreadable.append(f"{path}: {exc.strerror or exc}")
            except ValueError as exc:
                skipped.append(f"{path.parent.name}: {exc}")
            progress.advance(task)
    return rows


def rebuild(store: Path) -> int:
    skipped: list[str] = []
    unreadable: list[str] = []
    runs = paths.runs_dir(store)
    try:
        if runs.exists():
            os.listdir(runs)  # glob() takes a folder it cannot list for an empty one
        rows = _rows_from_sessions(store, skipped, unreadable)
    except OSError as exc:
        unreadable.append(f"{exc.filename or runs}: {exc.strerror or exc}")
    if unreadable:
        print(f"stallscope history: cannot read {unreadable[0]}"
              + (f" (and {len(unreadable) - 1} more)" if len(unreadable) > 1 else "")
              + "; the history is left as it was, since rebuilding it now would leave those runs out: fix the "
              "permissions and run --rebuild again", file=sys.stderr)
        return 2
    try:
        written, kept = rebuild_history(store, iter(rows))
    except (HistoryError, OSError) as exc:
        said = os_error_words(exc) if isinstance(exc, OSError) else str(exc)
        print(printable(f"stallscope history: cannot rebuild the history in {store}: {said}"), file=sys.stderr)
        return 2
    print(f"rebuilt the history of {store} from {written} saved session(s)"
          + (f"; the old file is kept as {kept}" if kept else ""), file=sys.stderr)
    for line in skipped[:10]:
        print(f"  skipped {line}", file=sys.stderr)
    return 0


def _offer_rebuild(store: Path) -> bool:
    """On a terminal, ask whether to rebuild a damaged history now."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    count = len(list(paths.runs_dir(store).glob("*/session.json")))
    try:
        answer = input(f"Rebuild it now from the {count} saved session(s)? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def parse_since(text: str, now: float | None = None) -> float:
    match = _DURATION.match(text.strip())
    if match:
        return (now if now is not None else time.time()) - float(match.group(1)) * _SECONDS[match.group(2)]
    for fmt in ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"):
        try:
            return time.mktime(time.strptime(text.strip(), fmt))
        except ValueError:
            continue
    raise ValueError(f"--since {text!r}: use a date (2024-06-01) or an age (90m, 2h, 3d)")


def handle(args: argparse.Namespace) -> int:
    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as exc:
        print(printable(f"stallscope history: {exc}"), file=sys.stderr)
        return 2
    store = paths.store_dir(args.store)
    if args.rebuild:
        status = rebuild(store)
        if status:
            return status
    try:
        rows = list_runs(store, command=args.command, verdict=args.verdict, git_commit_prefix=args.git,
                         since=since, limit=args.limit or None)
        everything = rows or list_runs(store, limit=1)
    except HistoryError as exc:
        print(printable(f"stallscope history: {exc}"), file=sys.stderr)
        if exc.damaged and _offer_rebuild(store):
            return rebuild(store) or handle(args)
        return 2
    if not everything:
        print(printable(f"stallscope history: the history in {store} is empty (record a run with: stallscope "
                        "run -- python train.py)"), file=sys.stderr)
        return 2
    if not rows:
        print("stallscope history: no run matches these filters", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{k: v for k, v in dataclasses.asdict(r).items() if k != "step_detail"} for r in rows],
                         indent=1))
        return 0
    console = terminal_console()
    console.print(history_table(rows), highlight=False)
    pair = pair_to_compare(rows)
    hint = f"; compare two with: stallscope compare {pair[0].run_id} {pair[1].run_id}" if pair else ""
    console.print(f"[dim]{len(rows)} run(s){hint}[/dim]", highlight=False)
    return 0


def pair_to_compare(rows: list[RunRow]) -> tuple[RunRow, RunRow] | None:
    """The two runs the hint suggests comparing, the older first (the baseline), from rows newest first: the newest
    two of one command that measured steady steps (a change against the same script), else the newest two that
    measured any; None where fewer than two did. A failed run of another script is no baseline to suggest."""
    measured = [r for r in rows if r.steady_steps]
    for newest in measured:
        same = [r for r in measured if r.command == newest.command]
        if len(same) >= 2:
            return same[1], same[0]
    return (measured[1], measured[0]) if len(measured) >= 2 else None
