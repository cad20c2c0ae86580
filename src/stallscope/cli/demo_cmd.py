"""``stallscope demo``: make the reference dataset, run the reference training, apply the fix, prove it."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from stallscope.cli.common import add_run_options, after_dashes, fail, parse_set, record, run_options_error
from stallscope.demo.scenarios import SCENARIOS, scenario_command
from stallscope.render import words

DEFAULT_STEPS = 40


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    lines = "\n".join(f"  {s.name:16s} {s.about}" for s in SCENARIOS.values())
    p = subparsers.add_parser(
        "demo", help="run the reference training on a generated JPEG dataset",
        description="Generate (once, cached) a 2,000-image JPEG dataset from real photos, run the reference "
                    "training script under `stallscope run`, then apply the top recommendation with --set and "
                    "run again: a measured before/after.",
        epilog=f"scenarios (plant a known bottleneck):\n{lines}\n\n"
               "Arguments after -- go to the reference script, e.g.  stallscope demo -- --batch-size 64",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="starved",
                   help="which bottleneck to plant (default: starved, num_workers=0)")
    p.add_argument("--no-verify", action="store_true", help="do not re-run with the recommended change")
    add_run_options(p)
    p.add_argument("script_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(handler=handle, steps=None)


def handle(args: argparse.Namespace) -> int:
    extra = after_dashes(args.script_args)
    overrides = parse_set("demo", args.overrides)
    if overrides is None:
        return 2
    if (problem := run_options_error(args)) is not None:
        return fail("demo", problem)
    console = Console(stderr=True)
    console.print(f"stallscope demo: preparing the dataset for scenario {args.scenario!r} "
                  "(generated once, then cached)")
    command = scenario_command(args.scenario, extra, progress=True)
    steps = args.steps if args.steps is not None else DEFAULT_STEPS
    code, first = record("demo", command, module=None, store=args.store, overrides=overrides, max_steps=steps,
                         json_path=args.json, quiet=args.quiet, sample_interval_s=args.sample_interval,
                         log_to=args.log_to)
    if code != 0 or first is None or args.no_verify:
        return code
    before = first.analysis
    top = next((r for r in before.recommendations if r.overrides), None)
    if top is None:
        console.print("[bold]no --set change to verify[/bold]: the top recommendation is a code change "
                      "(see above)." if before.recommendations else "nothing to change.")
        return code
    change = dict(top.overrides)
    shown = words.overrides(change)
    console.rule(f"[bold]verifying: {escape(shown)}")
    code, second = record("demo", command, module=None, store=args.store, overrides={**overrides, **change},
                          max_steps=steps, json_path=None, quiet=True, sample_interval_s=args.sample_interval,
                          log_to=args.log_to, live=not args.quiet)
    after = second.analysis if second is not None else None
    if code != 0 or after is None or not before.samples_per_s or not after.samples_per_s:
        return code
    measured = after.samples_per_s / before.samples_per_s
    console.print(f"before: {before.samples_per_s:.1f} samples/s ({before.verdict}, data wait "
                  f"{100 * before.data_wait_fraction:.0f}%)")
    console.print(f"after:  {after.samples_per_s:.1f} samples/s ({after.verdict}, data wait "
                  f"{100 * after.data_wait_fraction:.0f}%)  with {shown}")
    predicted = f"{top.predicted_speedup:.2f}x" if top.predicted_speedup else "no prediction"
    console.print(f"[bold]measured speedup {measured:.2f}x[/bold] (predicted {predicted}); compare the two runs: "
                  "stallscope compare last~1 last")
    return code
