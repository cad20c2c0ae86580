"""``stallscope merge A B ... -o OUT``: one session for a multi-node job recorded node by node."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stallscope import paths
from stallscope.analysis import analyze
from stallscope.cli.args import folder, output_error
from stallscope.cli.common import load_error
from stallscope.cli.report_cmd import load_run
from stallscope.merge import merge_sessions
from stallscope.render import terminal
from stallscope.render.safe_text import printable, terminal_console
from stallscope.render.summary import summary_dict, write_summary


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "merge", help="combine the per-node sessions of a multi-node job into one",
        description="Combine sessions recorded by one `stallscope run` per node into one session: ranks as the "
                    "job numbered them, node clocks aligned on the job's own synchronizations.",
        epilog="example (on each node: stallscope run -- torchrun --nnodes 2 --node_rank K ... train.py):\n"
               "  stallscope merge node0/.stallscope/runs/RUN0 node1/.stallscope/runs/RUN1 -o job.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="sessions: session.json paths, run directories or run ids")
    p.add_argument("-o", "--output", required=True, metavar="PATH", help="where to save the merged session")
    p.add_argument("--json", metavar="PATH", help="write the merged run's summary JSON here")
    p.add_argument("--store", metavar="DIR", type=folder, help="the store run ids are looked up in")
    p.add_argument("--quiet", action="store_true", help="do not print the summary")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    store = paths.store_dir(args.store)
    try:
        sessions = [load_run(ref, str(store), "merge")[0] for ref in args.runs]  # a run folder never saved is rebuilt
        merged = merge_sessions(sessions)
    except (OSError, ValueError) as exc:  # MergeError is a ValueError
        print(printable(f"stallscope merge: {load_error(exc)}"), file=sys.stderr)
        return 2
    if problem := output_error([args.output, args.json], args.store):
        print(printable(f"stallscope merge: {problem}"), file=sys.stderr)
        return 2
    analysis = analyze(merged)
    writing = args.output
    try:
        out = merged.save(Path(args.output))
        if args.json:
            writing = args.json  # a failure writing it is said with its own name, not the session's
            write_summary(args.json, summary_dict(merged, analysis, out))
    except OSError as exc:
        print(printable(f"stallscope merge: cannot write {exc.filename or writing}: {exc.strerror or exc}"),
              file=sys.stderr)
        return 2
    if not args.quiet:
        terminal.render(merged, analysis, terminal_console(stderr=True), session_ref=str(out))
    print(f"merged {len(sessions)} sessions into {out}   re-render: stallscope report {out}", file=sys.stderr)
    return 0
