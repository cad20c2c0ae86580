"""``stallscope doctor [DATA_DIR | s3://bucket/prefix] [--json PATH]``: a wrapper over ``stallscope.health``.

Exit codes: 0 when no check failed, 1 when at least one failed, 2 for bad input (missing or unreadable DATA_DIR).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from stallscope.cli.args import at_least, output_error
from stallscope.health import FAIL, PROBE_S, DoctorReport, LoaderAssumptions, run_doctor
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
    parser.add_argument("data_dir", nargs="?", metavar="DATA_DIR",
                        help="the dataset folder the DataLoader reads, or s3://bucket/prefix for an object store "
                             "(endpoint and keys from boto3's usual environment and config files)")
    parser.add_argument("--rate", type=at_least(0, float), default=None, metavar="OBJECTS_PER_S",
                        help="with s3://...: the objects per second the training must read, for the requests in "
                             "flight that takes")
    parser.add_argument("--json", metavar="PATH", dest="json_path", help="also write the checks as JSON to PATH")
    parser.add_argument("--no-bench", action="store_true",
                        help="skip the micro-benchmarks: storage speed (--bench-seconds) and the CPU capacity probe "
                             "(3 s: a busy loop on one core alone, then on all, 3 times)")
    parser.add_argument("--bench-seconds", type=at_least(0, float), default=3.0, metavar="S",
                        help="time budget of the storage micro-benchmark, or of the object store's connection sweep "
                             "for s3://... (default 3, at least 2 for a store)")
    parser.add_argument("--num-workers", type=at_least(0), default=None, metavar="N",
                        help="DataLoader num_workers to size /dev/shm against (default: usable CPUs)")
    parser.add_argument("--batch-size", type=at_least(1), default=256, metavar="N",
                        help="samples per batch (default 256)")
    parser.add_argument("--prefetch-factor", type=at_least(1), default=2, metavar="N",
                        help="batches per worker (default 2)")
    parser.add_argument("-v", "--verbose", action="store_true", help="explain every check, not only the problems")
    parser.set_defaults(handler=handle)
    return parser


def with_store_checks(report: DoctorReport, url: str, rate: float | None, seconds: float) -> DoctorReport:
    """The report with the object store's checks in place of the dataset folder's."""
    from stallscope.health.object_store import probe_store, store_checks, store_unreachable

    try:
        import boto3  # noqa: F401
    except ImportError:
        raise ImportError("doctor s3://... needs boto3: pip install 'stallscope[s3]'") from None
    start = time.perf_counter()
    try:
        checks = store_checks(probe_store(url, seconds=max(2.0, seconds)), rate)
    except (ValueError, ImportError):
        raise
    except Exception as exc:  # noqa: BLE001 (botocore's errors: unreachable, refused, no credentials)
        checks = [store_unreachable(url, exc)]
    kept = tuple(c for c in report.checks if c.id != "dataset")
    return dataclasses.replace(report, checks=kept + tuple(checks), data_dir=url,
                               elapsed_s=report.elapsed_s + time.perf_counter() - start)


def handle(args: argparse.Namespace) -> int:
    if problem := output_error([args.json_path], None, dash_is_stdout=True):
        print(printable(f"stallscope doctor: {problem}"), file=sys.stderr)
        return 2
    loader = LoaderAssumptions(num_workers=args.num_workers, prefetch_factor=args.prefetch_factor,
                               batch_size=args.batch_size)
    store_url = args.data_dir if args.data_dir and args.data_dir.startswith("s3://") else None
    if store_url:
        from stallscope.health.object_store import parse_s3_url

        try:
            parse_s3_url(store_url)
        except ValueError as exc:
            print(printable(f"stallscope doctor: {exc}"), file=sys.stderr)
            return 2
    try:
        report = run_doctor(None if store_url else args.data_dir,
                            bench_seconds=0.0 if args.no_bench else args.bench_seconds, loader=loader,
                            cpu_probe_seconds=0.0 if args.no_bench else PROBE_S)
    except OSError as exc:
        print(printable(f"stallscope doctor: {exc}"), file=sys.stderr)
        return 2
    if store_url:
        try:
            report = with_store_checks(report, store_url, args.rate, args.bench_seconds)
        except (ValueError, ImportError) as exc:
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
