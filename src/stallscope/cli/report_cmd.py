"""``stallscope report RUN``: re-render a saved session without re-running the script.

In the terminal by default; ``--html`` writes a self-contained report (charts work offline), ``--trace`` a
Chrome trace-event file for ui.perfetto.dev and ``--speedscope`` the sampled stacks for speedscope.app.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stallscope import paths
from stallscope.analysis import Analysis, analyze
from stallscope.api import record_history
from stallscope.cli.args import folder, output_error
from stallscope.cli.common import HISTORY_REBUILD_HINT, load_error
from stallscope.collect import recover_session
from stallscope.launcher import save_session
from stallscope.render import speedscope, terminal
from stallscope.render.safe_text import printable, terminal_console
from stallscope.render.summary import print_json, summary_dict, write_summary
from stallscope.session import Session, SessionFormatError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="re-render a saved run (terminal, HTML, Perfetto trace, speedscope)",
                              description="Analyse and render a saved session again (the script is not re-run).",
                              epilog="examples:\n  stallscope report last\n"
                                     "  stallscope report last~1   (the run before the last)\n"
                                     "  stallscope report last --html report.html   (open in any browser, offline)\n"
                                     "  stallscope report last --trace trace.json   (open in ui.perfetto.dev)\n"
                                     "  stallscope report last --quiet --html report.html"
                                     "   (writes it, prints nothing)\n"
                                     "  stallscope report last --speedscope stacks.speedscope.json"
                                     "   (open in speedscope.app)",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", default="last",
                   help="run id (or a unique prefix), a session.json path, a run directory, 'last' (default) or "
                        "'last~N' (N saved runs before the last); a run whose session was never saved (stallscope "
                        "killed, disk full) is rebuilt from its raw events")
    p.add_argument("--json", metavar="PATH", help="write the summary JSON here")
    p.add_argument("--html", metavar="PATH", help="write a self-contained HTML report here")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace-event JSON (for ui.perfetto.dev) here")
    p.add_argument("--speedscope", metavar="PATH",
                   help="write the Python stacks sampled during the training loader's fetches as a speedscope file "
                        "here (one profile per stage, the limiting one first; open in https://www.speedscope.app)")
    p.add_argument("--store", metavar="DIR", type=folder,
                   help="the store to look in (default ./.stallscope or $STALLSCOPE_HOME)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print neither the summary nor the names of the files written: only write the files asked "
                        "for (--json, --html, --trace, --speedscope; --json - still prints the JSON) and say what "
                        "went wrong, if anything (as run --quiet)")
    p.set_defaults(handler=handle)


def _fail(message: str) -> int:
    print(printable(f"stallscope report: {message}"), file=sys.stderr)
    return 2


def _recover(run_dir: Path, verb: str = "report") -> tuple[Session, Path]:
    """Rebuild a run that was never saved from its raw events, save it, and add it to the history; said as
    ``stallscope VERB``. A run still going is read as it stands, and nothing is saved."""
    session = recover_session(run_dir, running=True)
    if session.ended_by == "running":
        print(printable(f"stallscope {verb}: {run_dir} is still running: its summary so far (nothing saved; "
                        "report it again once it has ended for the whole run)"), file=sys.stderr)
        return session, run_dir
    saved, error = save_session(session, run_dir)
    if error:  # a read-only store, a full disk: show it all the same, and keep the raw events for a later try
        print(printable(f"stallscope {verb}: {run_dir} had no saved session; rebuilt it from its raw events, but "
                        f"could not save it ({error}): shown without saving"), file=sys.stderr)
        return session, run_dir
    assert saved is not None
    print(printable(f"stallscope {verb}: {run_dir} had no saved session; rebuilt it from its raw events into {saved}"),
          file=sys.stderr)
    if run_dir.parent.name != "runs":  # not in a store (a copied run folder): no history to add it to
        return session, saved
    history_error = record_history(run_dir.parent.parent, session, analysis_of(session), saved)
    if history_error:
        print(printable(f"stallscope {verb}: warning: the run was not added to the history: {history_error}"
                        f"{HISTORY_REBUILD_HINT}"), file=sys.stderr)
    return session, saved


#: The analysis of the session ``_recover`` rebuilt last (a rebuilt run is analysed for its history row, then for the
#: report: once is enough; a run of days takes seconds to analyse).
_analysed: list[tuple[Session, Analysis]] = []


def analysis_of(session: Session) -> Analysis:
    """``analyze(session)``, once per session this command rebuilt."""
    for known, analysis in _analysed:
        if known is session:
            return analysis
    analysis = analyze(session)
    _analysed[:] = [(session, analysis)]
    return analysis


def load_run(run: str, store: str | None, verb: str = "report") -> tuple[Session, Path]:
    """A RUN argument (id, ``last``, a session file or a run folder) as its session and path; a run folder
    whose session was never saved is rebuilt from its raw events (said as ``stallscope VERB``). Raises OSError
    or ValueError."""
    path = paths.resolve_run(run, paths.store_dir(store))
    if path.is_dir():
        return _recover(path, verb)
    try:
        return Session.load(path), path
    except SessionFormatError as exc:
        back = 0 if run == "last" else int(run[5:]) if run.startswith("last~") and run[5:].isdigit() else None
        if back is None or not exc.unparsable:
            raise
        # ``last`` is the newest session file here, damaged; compare's ``last`` (the history's newest row) may be
        # another run: say how to reach the ones around it
        try:
            paths.resolve_run(f"last~{back + 1}", paths.store_dir(store))
            before = f"stallscope {verb} last~{back + 1} for the saved run before it, or "
        except FileNotFoundError:
            before = ""
        raise SessionFormatError(f"{exc}. To go on: {before}a run id from stallscope history",
                                 unparsable=True) from None


def handle(args: argparse.Namespace) -> int:
    try:
        session, path = load_run(args.run, args.store)
    except (OSError, ValueError) as exc:
        return _fail(load_error(exc, args.run))
    if problem := (output_error([args.json], args.store, path, dash_is_stdout=True)
                   or output_error([args.trace, args.speedscope, args.html], args.store, path)):
        return _fail(problem)
    analysis = analysis_of(session)
    written: list[str] = []
    target = ""
    stacks = None
    if args.speedscope:
        stacks = speedscope.render(session, analysis)
        if stacks is None:  # before anything is written
            return _fail("--speedscope: this run has no stack samples of the training loader's fetches (where "
                         f"sampling could not run, `stallscope report {args.run}` says why in its notes)")
    try:
        if args.json and args.json != "-":
            target = args.json
            write_summary(args.json, summary_dict(session, analysis, path))
            written.append(f"summary JSON: {Path(args.json).resolve()}")
        if args.trace:
            from stallscope.render import trace

            target = args.trace
            written.append(f"trace: {trace.write_trace(args.trace, trace.render(session, analysis))}"
                           "   (open it in https://ui.perfetto.dev)")
        if stacks is not None:
            target = args.speedscope
            written.append(f"speedscope profile: {speedscope.write_speedscope(args.speedscope, stacks)}"
                           "   (open it in https://www.speedscope.app)")
        if args.html:
            try:
                from stallscope.render import html

                page = html.render(session, analysis)
            except ImportError as exc:  # plotly (the charts) is the `report` extra
                return _fail(f"--html needs plotly ({exc.name or exc}); install it with: "
                             "pip install 'stallscope[report]'")
            target = args.html
            written.append(f"HTML report: {html.write_html(args.html, page)}")
    except OSError as exc:
        return _fail(f"cannot write {target}: {exc.strerror or exc}")
    if args.json == "-":  # the JSON alone on standard output, for a pipe; what was written is said on stderr
        print_json(summary_dict(session, analysis, path))
        for line in [] if args.quiet else written:
            print(f"wrote {line}", file=sys.stderr)
        return 0
    if args.quiet:
        return 0
    terminal.render(session, analysis, terminal_console(), session_ref=str(path), just_saved=False)
    for line in written:
        print(f"wrote {line}")
    return 0
