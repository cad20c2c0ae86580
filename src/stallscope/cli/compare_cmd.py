"""``stallscope compare A B [C...]``: a markdown table of deltas against A, each marked real or noise."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stallscope import paths
from stallscope.analysis import analyze
from stallscope.cli.args import folder, output_error
from stallscope.cli.common import load_error
from stallscope.cli.report_cmd import load_run
from stallscope.history.compare import MIN_RELATIVE_EFFECT, compare
from stallscope.history.runs import RunRow, row_from_session
from stallscope.history.store import HistoryError, get_run
from stallscope.render.markdown import render_compare
from stallscope.render.safe_text import printable


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("compare", help="compare runs: deltas and whether they are beyond noise",
                              description="Compare runs against the first one (the baseline) and print a "
                                          "markdown table to paste into a pull request. Each delta is tested "
                                          "against run-to-run noise from the runs' per-step times.",
                              epilog="RUN: a run id (or a unique prefix) of the history, last, last~N, or a "
                                     "session.json path / run directory.\n"
                                     "example: stallscope compare last~1 last --output compare.md",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help="two or more runs; the first is the baseline")
    p.add_argument("--store", metavar="DIR", type=folder,
                   help="the store to look in (default ./.stallscope or $STALLSCOPE_HOME)")
    p.add_argument("--min-effect", type=float, default=MIN_RELATIVE_EFFECT, metavar="FRACTION",
                   help="smallest relative change reported as real: the run-to-run noise floor "
                        f"(default {MIN_RELATIVE_EFFECT})")
    p.add_argument("--output", "-o", metavar="PATH", help="also write the markdown to PATH")
    p.set_defaults(handler=handle)


def resolve(ref: str, store: Path) -> RunRow:
    """A run from the history; a saved session that is not in it is analysed on the spot."""
    try:
        return get_run(store, ref)
    except HistoryError as history_error:
        try:
            path = paths.resolve_run(ref, store)
        except FileNotFoundError:
            raise history_error from None
        try:
            session, path = load_run(str(path), str(store), "compare")  # a run folder never saved is rebuilt
        except (OSError, ValueError) as exc:
            raise HistoryError(load_error(exc)) from None
        return row_from_session(session, analyze(session), path)


def handle(args: argparse.Namespace) -> int:
    if len(args.runs) < 2:
        print("stallscope compare: give at least two runs (the first is the baseline)", file=sys.stderr)
        return 2
    if problem := output_error([args.output], args.store):
        print(printable(f"stallscope compare: {problem}"), file=sys.stderr)
        return 2
    store = paths.store_dir(args.store)
    try:
        runs = [resolve(ref, store) for ref in args.runs]
    except HistoryError as exc:
        print(printable(f"stallscope compare: {exc}"), file=sys.stderr)
        return 2
    if not 0 <= args.min_effect < 10:
        print("stallscope compare: --min-effect is a fraction, e.g. 0.1 for 10%", file=sys.stderr)
        return 2
    text = render_compare(compare(runs, min_effect=args.min_effect))
    if args.output:
        try:
            paths.write_file(args.output, text)
        except OSError as exc:
            print(printable(f"stallscope compare: cannot write {args.output}: {exc.strerror or exc}"), file=sys.stderr)
            return 2
    sys.stdout.write(text)
    return 0
