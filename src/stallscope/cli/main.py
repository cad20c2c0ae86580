"""``stallscope`` entry point: builds the parser from one module per verb and dispatches."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from stallscope import __version__

#: verb -> module defining ``add_parser(subparsers)``; each parser sets ``handler(args) -> int``.
VERBS: dict[str, str] = {
    "run": "stallscope.cli.run_cmd",
    "report": "stallscope.cli.report_cmd",
    "demo": "stallscope.cli.demo_cmd",
    "pack": "stallscope.cli.pack_cmd",
    "doctor": "stallscope.cli.doctor_cmd",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stallscope",
        description="Find out which stage of the input pipeline starves a PyTorch training job, and fix it.",
        epilog="Start with: stallscope run -- python train.py ARGS   (or: stallscope demo)",
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for module_name in VERBS.values():
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else sys.argv[1:])
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        print("stallscope: interrupted", file=sys.stderr)
        return 130
