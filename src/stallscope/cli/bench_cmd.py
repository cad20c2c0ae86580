"""``stallscope bench``: the input pipeline's own capacity, the compute-only ceiling, or a decoder race."""

from __future__ import annotations

import argparse
import json
import math
import sys

from rich.markup import escape

from stallscope.cli.args import folder, output_error
from stallscope.cli.common import after_dashes, fail, store_write_error
from stallscope.launcher import LaunchError, resolve_command
from stallscope.paths import OutsideStoreError, write_file
from stallscope.render.bench import render, render_race
from stallscope.render.safe_text import printable, terminal_console
from stallscope.settings import MAX_WORKERS
from stallscope.tuning.bench import DEFAULT_SECONDS, DEFAULT_STEPS, bench
from stallscope.tuning.decoders import race_decoders
from stallscope.tuning.trials import interrupt_on_sigterm, interrupted_exit_code

EPILOG = """examples:
  stallscope bench -- python train.py            input capacity per worker count, ceiling, current throughput
  stallscope bench --workers 0,2,4 --seconds 5 -- python train.py
  stallscope bench --decoders DATA_DIR           JPEG decoder race on your files, one core

Input capacity: the script's first DataLoader drained with no model (its dataset, sampler,
collate and worker set-up) at each worker count. Ceiling: already-loaded batches replayed to the
script's own loop, so the model runs as if data were free. Ceiling / current throughput is the
most any input-side fix can gain."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="input pipeline capacity, compute-only ceiling, decoder race",
                              description="Measure the input pipeline alone and the model alone on your script, "
                                          "or race JPEG decoders on your files.",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decoders", metavar="DIR", help="race JPEG decoders on the files under DIR (no script needed)")
    p.add_argument("--files", type=int, default=64, help="decoder race: files to use (default 64)")
    p.add_argument("--workers", metavar="N,N,...",
                   help="worker counts to drain the loader with (default 0, 1, half and all usable CPUs, and the "
                        "script's own)")
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="drain time per worker count")
    p.add_argument("--ceiling-steps", type=int, default=30, help="replayed steps measured for the ceiling")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="steps of the normal run")
    p.add_argument("--no-normal", action="store_true", help="skip the normal run")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a run is killed")
    p.add_argument("--json", metavar="PATH", help="write the result as JSON here")
    p.add_argument("--store", metavar="DIR", type=folder, help="where sessions and bench folders are saved")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command: python train.py ARGS")
    p.set_defaults(handler=handle)


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def worker_counts(text: str | None) -> list[int] | None:
    """``--workers 0,2,4`` as a list (None: the default counts); ValueError says what is wrong."""
    if not text:
        return None
    try:
        counts = [int(w) for w in text.split(",")]
    except ValueError:
        raise ValueError("--workers takes comma-separated integers, e.g. 0,2,4") from None
    if any(n < 0 for n in counts):
        raise ValueError("--workers counts must be 0 or more")
    if any(n > MAX_WORKERS for n in counts):
        raise ValueError(f"--workers counts must be at most {MAX_WORKERS} (a few per CPU core is already plenty)")
    return counts


def options_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the numbers given, if anything: refused before any run, since a bench with a negative
    drain time or zero files would run and report on nothing."""
    if args.files < 1:
        return "--files must be at least 1"
    if not _positive(args.seconds):
        return "--seconds must be a positive number of seconds"
    if args.ceiling_steps < 1:
        return "--ceiling-steps must be at least 1"
    if args.steps < 4:
        return "--steps must be at least 4 (the first steps of the normal run are warm-up)"
    if not _positive(args.timeout):
        return "--timeout must be a positive number of seconds"
    return None


def handle(args: argparse.Namespace) -> int:
    if (problem := options_error(args)) is not None:
        return fail("bench", problem)
    console = terminal_console(stderr=True)
    if args.decoders:
        try:
            with console.status("decoder race (one core)"):
                race = race_decoders(args.decoders, files=args.files)
        except (FileNotFoundError, RuntimeError) as exc:
            print(printable(f"stallscope bench: {exc}"), file=sys.stderr)
            return 2
        if args.json and not _saved(args.json, race.to_dict()):
            return 2
        render_race(race, console)
        return 0
    command = after_dashes(args.command)
    if not command:
        return fail("bench", "no command given; usage: stallscope bench -- python train.py ARGS (or --decoders DIR)")
    try:
        workers = worker_counts(args.workers)
        resolve_command(command)  # the checks `stallscope run` makes: a missing script fails both runs
    except (ValueError, LaunchError) as exc:
        return fail("bench", str(exc))
    if problem := output_error([args.json], args.store):  # known now, not after the runs
        return fail("bench", problem)
    try:
        with console.status("bench") as status, interrupt_on_sigterm():
            result = bench(command, workers=workers, seconds=args.seconds, ceiling_steps=args.ceiling_steps,
                           normal_steps=args.steps, normal=not args.no_normal, timeout_s=args.timeout,
                           store=args.store, progress=lambda text: status.update(escape(text)))
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the running trial was stopped and saved its session
        print("stallscope bench: interrupted", file=sys.stderr)
        return interrupted_exit_code(exc)
    except OSError as exc:  # the store cannot take the bench folders
        return fail("bench", store_write_error(exc, args.store))
    except OutsideStoreError as exc:  # a link in the store leads out of it
        return fail("bench", str(exc))
    if args.json and not _saved(args.json, result.to_dict()):
        return 2
    render(result, console)
    return 0 if result.ceiling_rate and result.capacity_rate else 1


def _saved(path: str, document: dict) -> bool:
    """Write ``--json`` (``paths.write_file``); False after saying why it could not be written."""
    try:
        write_file(path, json.dumps(document, indent=1, default=str))
    except OSError as exc:
        print(printable(f"stallscope bench: cannot write {path}: {exc.strerror or exc}"), file=sys.stderr)
        return False
    return True
