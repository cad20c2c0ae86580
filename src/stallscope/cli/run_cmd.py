"""``stallscope run``: record an unmodified training script and print where its steps' time goes."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from stallscope import store as history
from stallscope.analyze import Analysis, analyze
from stallscope.launcher import LaunchError, run
from stallscope.record.overrides import SETTABLE, OverrideError, parse_overrides
from stallscope.render import terminal
from stallscope.render.summary import summary_dict, write_summary

EPILOG = f"""examples:
  stallscope run -- python train.py --epochs 1
  stallscope run train.py --lr 0.1                 (a .py file runs with this Python)
  stallscope run -m mypkg.train                    (a module)
  stallscope run --steps 50 --set num_workers=4 --json out.json -- python train.py

--set names: {", ".join(sorted(SETTABLE))}. They apply to every DataLoader the script creates.
The script's own exit code is stallscope's exit code; the session is saved even when the script
crashes or is interrupted. Re-render a saved run with: stallscope report last"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="record a training script and diagnose its input pipeline",
                              description="Run a training script unmodified, record every DataLoader and "
                                          "training step, and say which stage limits it.",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(p)
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module, like python -m")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command: python train.py ARGS, or train.py ARGS")
    p.set_defaults(handler=handle)


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="PATH", help="write the summary JSON (schema stallscope.summary/1) here")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME=VALUE",
                   help="override a DataLoader argument at construction, e.g. --set num_workers=4 (repeatable)")
    p.add_argument("--steps", type=int, metavar="N", help="stop the job cleanly after N training steps")
    p.add_argument("--store", metavar="DIR", help="where sessions are saved (default ./.stallscope or $STALLSCOPE_HOME)")
    p.add_argument("--quiet", action="store_true", help="do not print the summary")
    p.add_argument("--sample-interval", type=float, default=0.1, metavar="SECONDS",
                   help="period of the system sampler (CPU, memory, GPU); 0 turns it off (default 0.1)")


def handle(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        overrides = parse_overrides(args.overrides)
    except OverrideError as exc:
        print(f"stallscope run: {exc}", file=sys.stderr)
        return 2
    if args.steps is not None and args.steps < 1:
        print("stallscope run: --steps must be at least 1", file=sys.stderr)
        return 2
    if not command and not args.module:
        print("stallscope run: no command given; usage: stallscope run [options] -- python train.py ARGS",
              file=sys.stderr)
        return 2
    if args.sample_interval < 0:
        print("stallscope run: --sample-interval must be 0 (off) or positive", file=sys.stderr)
        return 2
    return record(command, module=args.module, store=args.store, overrides=overrides, max_steps=args.steps,
                  json_path=args.json, quiet=args.quiet, sample_interval_s=args.sample_interval)[0]


def record_and_report(command: list[str], *, module: str | None, store: str | None, overrides: dict,
                      max_steps: int | None, json_path: str | None, quiet: bool) -> int:
    return record(command, module=module, store=store, overrides=overrides, max_steps=max_steps,
                  json_path=json_path, quiet=quiet)[0]


def record(command: list[str], *, module: str | None, store: str | None, overrides: dict,
           max_steps: int | None, json_path: str | None, quiet: bool,
           sample_interval_s: float = 0.1) -> tuple[int, Analysis | None]:
    """Run, analyse, save to history, write JSON, print: the exit code and the analysis (None if not started)."""
    try:
        outcome = run(command, module=module, store=store, overrides=overrides, max_steps=max_steps,
                      sample_interval_s=sample_interval_s)
    except LaunchError as exc:
        print(f"stallscope run: {exc}", file=sys.stderr)
        return 2, None
    analysis = analyze(outcome.session)
    history.record_run_or_warn(store, outcome.session, analysis, outcome.session_path)
    if json_path:
        write_summary(json_path, summary_dict(outcome.session, analysis, outcome.session_path))
    if not quiet:
        terminal.render(outcome.session, analysis, Console(stderr=True), session_ref=str(outcome.session_path))
    return outcome.exit_code, analysis
