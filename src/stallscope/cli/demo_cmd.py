"""``stallscope demo``: make the reference dataset and run the reference training under ``run``."""

from __future__ import annotations

import argparse
import sys

from stallscope.cli.run_cmd import add_run_options, record_and_report
from stallscope.demo.scenarios import SCENARIOS, scenario_command
from stallscope.record.overrides import OverrideError, parse_overrides


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    lines = "\n".join(f"  {s.name:16s} {s.about}" for s in SCENARIOS.values())
    p = subparsers.add_parser(
        "demo", help="run the reference training on a generated JPEG dataset",
        description="Generate (once, cached) a 2,000-image JPEG dataset from real photos and run the reference "
                    "training script under `stallscope run`.",
        epilog=f"scenarios (plant a known bottleneck):\n{lines}\n\n"
               "Arguments after -- go to the reference script, e.g.  stallscope demo -- --batch-size 64",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="default")
    add_run_options(p)
    p.add_argument("script_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(handler=handle, steps=None)


def handle(args: argparse.Namespace) -> int:
    extra = list(args.script_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    try:
        overrides = parse_overrides(args.overrides)
    except OverrideError as exc:
        print(f"stallscope demo: {exc}", file=sys.stderr)
        return 2
    print(f"stallscope demo: preparing the dataset for scenario {args.scenario!r} (cached after the first run)",
          file=sys.stderr)
    command = scenario_command(args.scenario, extra, progress=True)
    steps = args.steps if args.steps is not None else 40
    return record_and_report(command, module=None, store=args.store, overrides=overrides, max_steps=steps,
                             json_path=args.json, quiet=args.quiet)
