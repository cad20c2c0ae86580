"""``stallscope run``: record an unmodified training script and print where its steps' time goes."""

from __future__ import annotations

import argparse

from stallscope.cli.common import add_run_options, after_dashes, fail, parse_set, record, run_options_error
from stallscope.settings import SETTABLE

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
    p.add_argument("-m", dest="module", metavar="MODULE",
                   help="run a module, like python -m; every argument after MODULE is the module's, so give "
                        "stallscope's options before -m")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command: python train.py ARGS, or train.py ARGS")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    command = after_dashes(args.command)
    overrides = parse_set("run", args.overrides)
    if overrides is None:
        return 2
    if (problem := run_options_error(args)) is not None:
        return fail("run", problem)
    if not command and not args.module:
        return fail("run", "no command given; usage: stallscope run [options] -- python train.py ARGS")
    return record("run", command, module=args.module, store=args.store, overrides=overrides, max_steps=args.steps,
                  json_path=args.json, quiet=args.quiet, sample_interval_s=args.sample_interval,
                  log_to=args.log_to)[0]
