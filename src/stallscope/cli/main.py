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
    "history": "stallscope.cli.history_cmd",
    "compare": "stallscope.cli.compare_cmd",
    "tune": "stallscope.cli.tune_cmd",
    "bench": "stallscope.cli.bench_cmd",
    "merge": "stallscope.cli.merge_cmd",
    "export": "stallscope.cli.export_cmd",
    "plan": "stallscope.cli.plan_cmd",
}



def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every verb, or with ``only`` one: a verb's module is imported only when needed,
    so ``stallscope run`` starts fast and one broken optional verb cannot break the others."""
    parser = argparse.ArgumentParser(
        prog="stallscope",
        description="Find out which stage of the input pipeline starves a PyTorch training job, and fix it.",
        epilog="Start with: stallscope run -- python train.py ARGS   (or: stallscope demo)",
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, module_name in VERBS.items():
        if only is not None and verb != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            subparsers.add_parser(verb, help=f"(unavailable: {exc})")
            continue
        module.add_parser(subparsers)
    return parser


def _verb_in(argv: list[str]) -> str | None:
    for token in argv:
        if token.startswith("-"):
            return None  # global options (--help, --version) need the full parser
        return token if token in VERBS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(argv) if argv is not None else sys.argv[1:]
    parser = build_parser(_verb_in(args_list))
    args = parser.parse_args(args_list)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except KeyboardInterrupt:
        print("stallscope: interrupted", file=sys.stderr)
        return 130
