"""``stallscope history``: the table of recorded runs, newest last, filterable."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time

from rich.console import Console

from stallscope import paths
from stallscope.history.store import HistoryError, list_runs
from stallscope.render.history import history_table

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
    p.add_argument("--store", metavar="DIR", help="the store to read (default ./.stallscope or $STALLSCOPE_HOME)")
    p.add_argument("--command", metavar="TEXT", help="only runs whose command line contains TEXT")
    p.add_argument("--verdict", choices=["input-bound", "compute-bound", "balanced", "unknown"],
                   help="only runs with this verdict")
    p.add_argument("--git", metavar="COMMIT", help="only runs made at this git commit (a prefix is enough)")
    p.add_argument("--since", metavar="WHEN", help="only runs started since WHEN: YYYY-MM-DD, or an age like 2h, 3d")
    p.add_argument("--limit", type=int, default=30, metavar="N", help="the N most recent runs (default 30; 0: all)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.set_defaults(handler=handle)


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
        print(f"stallscope history: {exc}", file=sys.stderr)
        return 2
    store = paths.store_dir(args.store)
    try:
        rows = list_runs(store, command=args.command, verdict=args.verdict, git_commit_prefix=args.git,
                         since=since, limit=args.limit or None)
        everything = rows or list_runs(store, limit=1)
    except HistoryError as exc:
        print(f"stallscope history: {exc}", file=sys.stderr)
        return 2
    if not everything:
        print(f"stallscope history: the history in {store} is empty (record a run with: stallscope run -- "
              "python train.py)", file=sys.stderr)
        return 2
    if not rows:
        print("stallscope history: no run matches these filters", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{k: v for k, v in dataclasses.asdict(r).items() if k != "step_detail"} for r in rows],
                         indent=1))
        return 0
    console = Console() if Console().is_terminal else Console(width=240)
    console.print(history_table(rows), highlight=False)
    console.print(f"[dim]{len(rows)} run(s); compare two with: stallscope compare {rows[0].run_id} "
                  f"{rows[-1].run_id}[/dim]", highlight=False)
    return 0
