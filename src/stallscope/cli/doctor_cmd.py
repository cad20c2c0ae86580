"""``stallscope doctor [DATA_DIR] [--json PATH]``: a thin wrapper over ``stallscope.health.run_doctor``.

Exit codes: 0 when no check failed, 1 when at least one failed, 2 for bad input (missing or unreadable DATA_DIR).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stallscope.cli.args import at_least, output_error
from stallscope.health import FAIL, PROBE_S, LoaderAssumptions, run_doctor
from stallscope.paths import write_file
from stallscope.render.doctor import render
from stallscope.render.safe_text import printable, terminal_console
from stallscope.render.summary import print_json


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "doctor",
        help="check the machine, GPU and dataset around the input pipeline",
        description="Environment and storage checks, each pass / warn / fail / n/a / unknown with the number behind "
                    "it.",
    )
    parser.add_argument("data_dir", nargs="?", metavar="DATA_DIR", help="the dataset folder the DataLoader reads")
    parser.add_argument("--json", metavar="PATH", dest="json_path", help="also write the checks as JSON to PATH")
    parser.add_argument("--no-bench", action="store_true",
                        help="skip the micro-benchmarks: storage speed (--bench-seconds) and the CPU capacity probe "
                             "(3 s: a busy loop on one core alone, then on all, 3 times)")
    parser.add_argument("--bench-seconds", type=at_least(0, float), default=3.0, metavar="S",
                        help="time budget of the storage micro-benchmark (default 3)")
    parser.add_argument("--num-workers", type=at_least(0), default=None, metavar="N",
                        help="DataLoader num_workers to size /dev/shm against (default: usable CPUs)")
    parser.add_argument("--batch-size", type=at_least(1), default=256, metavar="N",
                        help="samples per batch (default 256)")
    parser.add_argument("--prefetch-factor", type=at_least(1), default=2, metavar="N",
                        help="batches per worker (default 2)")
    parser.add_argument("-v", "--verbose", action="store_true", help="explain every check, not only the problems")
    parser.set_defaults(handler=handle)
    return parser


def handle(args: argparse.Namespace) -> int:
    if problem := output_error([args.json_path], None, dash_is_stdout=True):
        print(printable(f"stallscope doctor: {problem}"), file=sys.stderr)
        return 2
    loader = LoaderAssumptions(num_workers=args.num_workers, prefetch_factor=args.prefetch_factor,
                               batch_size=args.batch_size)
    try:
        report = run_doctor(args.data_dir, bench_seconds=0.0 if args.no_bench else args.bench_seconds, loader=loader,
                            cpu_probe_seconds=0.0 if args.no_bench else PROBE_S)
    except OSError as exc:
        print(printable(f"stallscope doctor: {exc}"), file=sys.stderr)
        return 2
    if args.json_path == "-":  # the checks alone on standard output, for a pipe
        print_json(report.to_dict())
        return 1 if report.count(FAIL) else 0
    console = terminal_console()
    render(report, console, verbose=args.verbose)
    if args.json_path:
        out = Path(args.json_path)
        try:
            write_file(out, json.dumps(report.to_dict(), indent=1) + "\n")
        except OSError as exc:
            print(printable(f"stallscope doctor: cannot write {out}: {exc.strerror or exc}"), file=sys.stderr)
            return 2
        console.print(f"wrote {out}", highlight=False)
    return 1 if report.count(FAIL) else 0
