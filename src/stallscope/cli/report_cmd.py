"""``stallscope report RUN``: re-render a saved session without re-running the script."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from stallscope import paths
from stallscope.analyze import analyze
from stallscope.render import terminal
from stallscope.render.summary import summary_dict, write_summary
from stallscope.session import Session


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="re-render a saved run",
                              description="Analyse and render a saved session again (the script is not re-run).")
    p.add_argument("run", nargs="?", default="last",
                   help="run id (or a unique prefix), a session.json path, a run directory, or 'last' (default)")
    p.add_argument("--json", metavar="PATH", help="write the summary JSON here")
    p.add_argument("--store", metavar="DIR", help="the store to look in (default ./.stallscope or $STALLSCOPE_HOME)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    try:
        path = paths.resolve_run(args.run, paths.store_dir(args.store))
        session = Session.load(path)
    except (FileNotFoundError, ValueError) as exc:
        print(f"stallscope report: {exc}", file=sys.stderr)
        return 2
    analysis = analyze(session)
    if args.json:
        write_summary(args.json, summary_dict(session, analysis, path))
    terminal.render(session, analysis, Console(), session_ref=str(path))
    return 0
