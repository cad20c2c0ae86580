"""``stallscope tune``: try DataLoader changes on the real script, confirm the winner, print the change."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.markup import escape

from stallscope.cli.common import after_dashes, fail
from stallscope.render.tune import config_text, rate_text, render
from stallscope.settings import format_value
from stallscope.tuning.trials import TrialResult
from stallscope.tuning.tuning import DEFAULT_STEPS, tune

EPILOG = """examples:
  stallscope tune -- python train.py --epochs 1
  stallscope tune --trials 8 --steps 60 -- python train.py
  stallscope tune --budget 300 --batch-size -- python train.py

Each trial runs the unmodified script for --steps training steps with --set overrides (its output
goes to the trial's folder). The first steps and the batches prefetched at start-up are discarded;
a change wins only when it is faster by more than twice the combined standard error of the
per-step rates. The winner and the original are then run again, alternately, to confirm."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tune", help="try DataLoader changes on the script and confirm the fastest",
                              description="Try the changes the diagnosis predicts to matter, measure each on "
                                          "the real script, and confirm the winner against the original.",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    limit = p.add_mutually_exclusive_group()
    limit.add_argument("--trials", type=int, metavar="N", help="at most N runs in all, confirmation included "
                                                               "(default 10 when no --budget)")
    limit.add_argument("--budget", type=float, metavar="SECONDS", help="wall-clock budget for all runs")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                   help=f"training steps per trial (default {DEFAULT_STEPS})")
    p.add_argument("--batch-size", dest="tune_batch_size", action="store_true",
                   help="also try half and double the batch size (changes the training, so off by default)")
    p.add_argument("--max-workers", type=int, metavar="N", help="never try more than N workers")
    p.add_argument("--trial-timeout", type=float, metavar="SECONDS",
                   help="a trial running longer is killed and recorded as failed "
                        "(default: 3x the original run, at least 60 s)")
    p.add_argument("--confirm-rounds", type=int, default=1, metavar="N",
                   help="pairs of confirmation runs (winner and original, alternating; default 1)")
    p.add_argument("--json", metavar="PATH", help="write the result (schema stallscope.tune/1) here")
    p.add_argument("--store", metavar="DIR", help="where sessions and trial folders are saved")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command: python train.py ARGS")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    command = after_dashes(args.command)
    if not command:
        return fail("tune", "no command given; usage: stallscope tune [options] -- python train.py ARGS")
    if args.trials is not None and args.trials < 1 or args.steps < 4:
        print("stallscope tune: --trials must be at least 1 and --steps at least 4", file=sys.stderr)
        return 2
    console = Console(stderr=True)
    if not console.is_terminal:
        console.width = 140  # logs and CI: keep the table readable
    status = console.status("starting")
    status.start()

    def on_start(index: int, label: str, overrides: dict) -> None:
        text = " ".join(f"{k}={format_value(v)}" for k, v in overrides.items()) or "original configuration"
        status.update(f"trial {index} ({label}): {escape(text)} ...")

    def on_done(trial: TrialResult) -> None:
        mark = "[green]ok[/]" if trial.ok else f"[red]failed[/]: {escape(str(trial.reason))}"
        rate = f"{rate_text(trial)} {trial.unit}" if trial.ok else ""
        console.print(f"  trial {trial.index:>2} {trial.label:<20} {escape(config_text(trial)):<48} {rate}  "
                      f"({trial.wall_s:.0f} s) {mark}", highlight=False)

    try:
        result = tune(command, trials=args.trials, budget_s=args.budget, steps=args.steps,
                      tune_batch_size=args.tune_batch_size, max_workers=args.max_workers,
                      trial_timeout_s=args.trial_timeout, confirm_rounds=args.confirm_rounds,
                      store=args.store, on_start=on_start, on_done=on_done)
    except OSError as exc:  # the store cannot take the trial folders
        status.stop()
        return fail("tune", f"cannot write {exc.filename or 'the store'}: {exc.strerror or exc}")
    finally:
        status.stop()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result.to_dict(), fh, indent=1)
    render(result, console)
    return 0 if result.original is not None and result.original.ok else 1
