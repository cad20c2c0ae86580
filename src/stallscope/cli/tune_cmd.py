"""``stallscope tune``: try DataLoader changes on the real script, confirm the winner, print the change."""

from __future__ import annotations

import argparse
import json
import math
import sys

from rich.console import Console
from rich.markup import escape

from stallscope.cli.args import folder, output_error
from stallscope.cli.common import after_dashes, fail, store_write_error
from stallscope.launcher import LaunchError, resolve_command
from stallscope.paths import OutsideStoreError, write_file
from stallscope.render.safe_text import printable, terminal_console
from stallscope.render.tune import config_text, rate_text, render
from stallscope.settings import overrides_text
from stallscope.tuning.trials import (
    TrialResult,
    interrupt_on_sigterm,
    interrupted_exit_code,
)
from stallscope.tuning.tuning import (
    DEFAULT_STEPS,
    TuneInterrupted,
    TuneResult,
    min_trials,
    reserved_runs,
    tune,
)

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
                                                               f"(default 10 when no --budget; at least "
                                                               f"{min_trials(1)}: the original, one change and "
                                                               "its confirmation, more with --confirm-rounds)")
    limit.add_argument("--budget", type=float, metavar="SECONDS", help="wall-clock budget for all runs")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                   help=f"training steps per trial (default {DEFAULT_STEPS})")
    p.add_argument("--batch-size", dest="tune_batch_size", action="store_true",
                   help="also try half and double the batch size (changes the training, so off by default)")
    p.add_argument("--numerics", action="store_true",
                   help="on a GPU, also try the numerics the compute findings name: TF32 matmuls "
                        "(--set matmul_precision=high), cuDNN's algorithm search (--set cudnn_benchmark=true), "
                        "bfloat16 autocast (--set autocast=bfloat16) and channels_last (--set channels_last=true); "
                        "they change what is computed, so off by default")
    p.add_argument("--max-workers", type=int, metavar="N", help="never try more than N workers")
    p.add_argument("--trial-timeout", type=float, metavar="SECONDS",
                   help="a trial running longer is killed and recorded as failed "
                        "(default: 3x the original run, at least 60 s)")
    p.add_argument("--confirm-rounds", type=int, default=1, metavar="N",
                   help="pairs of confirmation runs (winner and original, alternating; default 1)")
    p.add_argument("--json", metavar="PATH", help="write the result (schema stallscope.tune/1) here")
    p.add_argument("--store", metavar="DIR", type=folder, help="where sessions and trial folders are saved")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command: python train.py ARGS")
    p.set_defaults(handler=handle)


def options_error(args: argparse.Namespace, command: list[str]) -> str | None:
    """What is wrong with the options or the command, if anything: refused before any trial runs, since a
    bad value would otherwise surface trials later (a trial with -1 workers, an original killed at once)."""
    if args.confirm_rounds < 1:
        return "--confirm-rounds must be at least 1"
    if args.trials is not None and args.trials < min_trials(args.confirm_rounds):
        return (f"--trials {args.trials} leaves no room for a candidate: the original takes 1 run and confirming "
                f"a winner keeps {reserved_runs(args.confirm_rounds)} (--confirm-rounds {args.confirm_rounds}); "
                f"use --trials {min_trials(args.confirm_rounds)} or more")
    if args.budget is not None and not (math.isfinite(args.budget) and args.budget > 0):
        return "--budget must be a positive number of seconds"
    if args.steps < 4:
        return "--steps must be at least 4 (the first steps of each trial are warm-up)"
    if args.max_workers is not None and args.max_workers < 0:
        return "--max-workers must be 0 or more"
    if args.trial_timeout is not None and not (math.isfinite(args.trial_timeout) and args.trial_timeout > 0):
        return "--trial-timeout must be a positive number of seconds"
    try:
        resolve_command(command)  # the checks `stallscope run` makes: a missing script fails every trial
    except LaunchError as exc:
        return str(exc)
    return output_error([args.json], args.store)  # known now, not after the last trial


def write_json(path: str, result: TuneResult) -> None:
    """The result as JSON; a path that cannot be written costs this file only, not the table."""
    try:
        write_file(path, json.dumps(result.to_dict(), indent=1))
    except OSError as exc:
        print(printable(f"stallscope tune: warning: cannot write {path}: {exc.strerror or exc}"), file=sys.stderr)


def report_interrupted(exc: TuneInterrupted, json_path: str | None, console: Console) -> int:
    """Ctrl-C or SIGTERM: the runs that completed, in the JSON and as a table, then 128 + the signal."""
    partial = exc.result
    if json_path:
        write_json(json_path, partial)
    if partial.original is not None:
        render(partial, console)
    else:  # interrupted during the original run: there is no table, and nothing failed
        for note in partial.notes:
            console.print(note, markup=False)
    return interrupted_exit_code(exc)


def handle(args: argparse.Namespace) -> int:
    command = after_dashes(args.command)
    if not command:
        return fail("tune", "no command given; usage: stallscope tune [options] -- python train.py ARGS")
    if (problem := options_error(args, command)) is not None:
        return fail("tune", problem)
    console = terminal_console(stderr=True)
    status = console.status("starting")
    status.start()

    def on_start(index: int, label: str, overrides: dict) -> None:
        text = overrides_text(overrides) or "original configuration"
        status.update(f"trial {index} ({label}): {escape(text)} ...")

    def on_done(trial: TrialResult) -> None:
        mark = "[green]ok[/]" if trial.ok else f"[red]failed[/]: {escape(str(trial.reason))}"
        rate = f"{rate_text(trial)} {trial.unit}" if trial.ok else ""
        console.print(f"  trial {trial.index:>2} {trial.label:<20} {escape(config_text(trial)):<48} {rate}  "
                      f"({trial.wall_s:.0f} s) {mark}", highlight=False)

    try:
        with interrupt_on_sigterm():
            result = tune(command, trials=args.trials, budget_s=args.budget, steps=args.steps,
                          tune_batch_size=args.tune_batch_size, max_workers=args.max_workers,
                          trial_timeout_s=args.trial_timeout, confirm_rounds=args.confirm_rounds,
                          store=args.store, on_start=on_start, on_done=on_done, numerics=args.numerics)
    except TuneInterrupted as exc:
        status.stop()
        return report_interrupted(exc, args.json, console)
    except OSError as exc:  # the store cannot take the trial folders
        status.stop()
        return fail("tune", store_write_error(exc, args.store))
    except OutsideStoreError as exc:  # a link in the store leads out of it
        status.stop()
        return fail("tune", str(exc))
    finally:
        status.stop()
    if args.json:
        write_json(args.json, result)
    render(result, console)
    return 0 if result.original is not None and result.original.ok else 1
