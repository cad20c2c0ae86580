"""``stallscope demo``: make the reference dataset, run the reference training, apply the fix, prove it."""

from __future__ import annotations

import argparse
import errno
import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from stallscope.analysis.findings import Recommendation
from stallscope.api import RunResult
from stallscope.cli.common import add_run_options, after_dashes, fail, parse_set, record, run_options_error, say
from stallscope.demo.changes import (
    ALREADY_APPLIED,
    APPLY,
    LOADER_BUILT_ONCE,
    NO_DATASET_CODE,
    NO_REQUESTS,
    NUMERICS,
    ONE_PROCESS,
    PLANTED_LATENCY,
    STEP_CODE,
    NotApplied,
    ScriptFlags,
    ThroughSet,
    choose,
    how_to_apply,
)
from stallscope.demo.dataset import default_cache_dir
from stallscope.demo.scenarios import REFERENCE_SCRIPT, SCENARIOS, scenario_command
from stallscope.render import words
from stallscope.render.safe_text import terminal_console
from stallscope.render.summary import write_summary

DEFAULT_STEPS = 40
#: Before/after pairs measured by default. One pair is one run each way, and on a shared or virtual machine two runs
#: of the same configuration differ by more than the predictions' error (calibration: demo-default-pairs). Two pairs
#: in the order before, after, after, before cancel a drift by a steady ratio per run (an even number of pairs does; an
#: odd one leaves one pair's drift) and halve the variance of the ratio.
DEFAULT_PAIRS = 2
#: Pairs whose ratios differ by more than this factor say more about the machine than about the change.
UNSTEADY_PAIRS = 1.25


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    lines = "\n".join(f"  {s.name:16s} {s.about}" for s in SCENARIOS.values())
    p = subparsers.add_parser(
        "demo", help="run the reference training on a generated JPEG dataset",
        description="Generate (once, cached) a 2,000-image JPEG dataset from real photos, run the reference "
                    "training script under `stallscope run`, then apply the top recommendation and measure it: "
                    "a --set change through its overrides, a code change through the reference script's own flag "
                    "for it (--cheaper-transforms, --uint8-to-device, --reduced-size-decode). Runs with and without "
                    "the change, alternated (--pairs), give a measured before/after beside the prediction; --json "
                    "writes the first run's summary with what the verification found (\"verification\").",
        epilog=f"scenarios (plant a known bottleneck):\n{lines}\n\n"
               "Arguments after -- go to the reference script, e.g.  stallscope demo -- --batch-size 64",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="starved",
                   help="which bottleneck to plant (default: starved, num_workers=0)")
    p.add_argument("--no-verify", action="store_true", help="do not re-run with the recommended change")
    p.add_argument("--pairs", type=int, default=DEFAULT_PAIRS, metavar="N",
                   help="before/after pairs to measure the change with, in the order before, after, after, before, "
                        f"... (default {DEFAULT_PAIRS}; 1 is the quickest; an even number cancels a steady drift of "
                        "the machine's own speed, and more pairs average out more of its noise); the speedup is the "
                        "geometric mean of the pairs' ratios")
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
    if args.pairs < 1:
        return fail("demo", f"--pairs must be at least 1, not {args.pairs}")
    console = terminal_console(stderr=True)
    console.print(f"stallscope demo: preparing the dataset for scenario {args.scenario!r} "
                  "(generated once, then cached)")
    try:
        command = scenario_command(args.scenario, extra, progress=True)
    except OSError as exc:
        return fail("demo", cache_error(exc))
    steps = args.steps if args.steps is not None else DEFAULT_STEPS
    code, first = record("demo", command, module=None, store=args.store, overrides=overrides, max_steps=steps,
                         json_path=args.json, quiet=args.quiet, sample_interval_s=args.sample_interval,
                         log_to=args.log_to)
    if code != 0 or first is None or args.no_verify:
        return code
    code, found = verify(args, console, command, overrides, steps, first)
    if args.json:
        save_verification(args.json, first.summary, found)
    return code


def verify(args: argparse.Namespace, console: Console, command: list[str], overrides: dict, steps: int,
           first: RunResult) -> tuple[int, dict[str, Any]]:
    """Measure the first run's top recommendation in alternated before/after pairs (``--pairs``): a ``--set``
    change through its overrides, a code change through the reference script's own flag for it (``demo/changes``).
    The exit code, and what was found (the summary JSON's ``verification``)."""
    before = first.analysis
    top, passed_over = choose(before.recommendations, command)
    found: dict[str, Any] = {"recommendation": top.id if top is not None else None, "verified": False,
                             "passed_over": [{"recommendation": r.id, "reason": why.reason} for r, why in passed_over]}
    for rec, why in passed_over:
        console.print(f"[bold]cannot verify[/bold] {escape(words.recommendation(rec).title)}: "
                      f"{escape(not_applied(why, rec))}" + ("; measuring the next recommendation" if top else ""))
    if top is None:
        if not passed_over:
            console.print("[bold]nothing to verify[/bold]: the advice is to change nothing (see above)."
                          if before.recommendations else "nothing to change.")
        return first.exit_code, {**found, "reason": "not-applied" if passed_over else "nothing-to-change"}
    how = how_to_apply(top)
    change = dict(top.overrides) if isinstance(how, ThroughSet) else {}
    flags = list(how.args) if isinstance(how, ScriptFlags) else []
    shown = words.overrides(change) if change else f"{REFERENCE_SCRIPT.name} {' '.join(flags)}"
    found.update(applied={"overrides": change, "script_args": flags}, predicted_speedup=top.predicted_speedup)
    if not before.samples_per_s:
        console.print("[bold]nothing to verify against[/bold]: the run measured no throughput (see above).")
        return first.exit_code, {**found, "reason": "no-throughput"}
    console.rule(f"[bold]verifying: {escape(shown)}")
    if flags:
        console.print(f"{escape(words.recommendation(top).title)}: a code change, which the reference script makes "
                      f"itself behind {escape(' '.join(flags))}")
    rates: dict[str, list[float]] = {"before": [before.samples_per_s], "after": []}
    last_after = None
    code = first.exit_code
    for side in verification_order(args.pairs):
        if len(rates["after"]) + len(rates["before"]) >= 2:
            console.print(f"run {sum(map(len, rates.values())) + 1} of {2 * args.pairs}: {side} again")
        after = side == "after"
        code, result = record("demo", command + flags if after else command, module=None, store=args.store,
                              overrides={**overrides, **change} if after else overrides,
                              max_steps=steps, json_path=None, quiet=True, sample_interval_s=args.sample_interval,
                              log_to=args.log_to, live=not args.quiet)
        analysis = result.analysis if result is not None else None
        if code != 0 or analysis is None or not analysis.samples_per_s:
            done = sum(map(len, rates.values()))
            if code == 0:
                console.print(f"the {side} run measured no throughput (see above): no speedup to report")
                return code, {**found, "reason": "no-throughput"}
            if code in (130, 143):  # Ctrl-C or a kill: what ran is saved, the comparison is not made
                console.print(f"stallscope demo: interrupted during the {side} run; the {done + 1} run(s) so far are "
                              "saved (stallscope history)")
                return code, {**found, "reason": "interrupted"}
            console.print(f"the {side} run failed (exit code {code}; stallscope report last says why): no "
                          "speedup to report")
            return code, {**found, "reason": "run-failed"}
        rates[side].append(analysis.samples_per_s)
        if after:
            last_after = analysis
    if last_after is None:
        return code, {**found, "reason": "no-throughput"}
    measured, low, high = paired_speedup(rates["before"], rates["after"])
    found.update(verified=True, measured_speedup=measured, before_samples_per_s=rates["before"],
                 after_samples_per_s=rates["after"], pairs=[a / b for b, a in zip(rates["before"], rates["after"])])
    console.print(f"before: {_rates(rates['before'])} samples/s ({before.verdict}, data wait "
                  f"{100 * before.data_wait_fraction:.0f}%)")
    console.print(f"after:  {_rates(rates['after'])} samples/s ({last_after.verdict}, data wait "
                  f"{100 * last_after.data_wait_fraction:.0f}%)  with {escape(shown)}")
    predicted = f"{top.predicted_speedup:.2f}x" if top.predicted_speedup else "no prediction"
    spread = f", pairs {low:.2f}x-{high:.2f}x" if args.pairs > 1 else ""
    console.print(f"[bold]measured speedup {measured:.2f}x[/bold] (predicted {predicted}{spread}); compare two "
                  f"of the runs: stallscope compare {_ref(2 * args.pairs - 1)} {_ref(2 * args.pairs - 2)}")
    if high > low * UNSTEADY_PAIRS:
        console.print(f"the pairs differ by {100 * (high / low - 1):.0f}%: this machine's speed changed between "
                      f"runs of the same configuration; --pairs {2 * args.pairs} gives a firmer figure")
    return code, found


#: Why the demo cannot apply a change (``demo.changes.NotApplied`` reasons).
NOT_APPLIED = {
    ONE_PROCESS: "it is advice for the ranks of a distributed job, and the reference training runs in one process",
    LOADER_BUILT_ONCE: "the reference script builds its DataLoader once already",
    NO_DATASET_CODE: "the reference script's dataset is torchvision's ImageFolder, with no Python code of its own to "
                     "speed up",
    NO_REQUESTS: "the reference script reads files from a local disk: it makes no request to an object store to "
                 "put in flight beside another",
    PLANTED_LATENCY: "the reference script's storage latency is planted on every file it reads: a packed dataset "
                     "would skip the plant, not the latency of a real file system, so measuring it would prove nothing",
    STEP_CODE: "it is a change to the training step's own code, and the reference script carries one version of it",
    NUMERICS: "it changes what the training computes (its precision or memory layout), so it is measured only where "
              "the user asks for it",
}


def not_applied(why: NotApplied, rec: Recommendation) -> str:
    """Why the demo cannot apply ``rec``, in words."""
    if why.reason == ALREADY_APPLIED:
        flags = APPLY[rec.id]
        return (f"the reference script runs with it already ({' '.join(flags.args)})" if isinstance(flags, ScriptFlags)
                else "the reference script runs with it already")
    return NOT_APPLIED.get(why.reason, "the demo has no way to apply it to its script")


def save_verification(path: str, summary: dict[str, Any], found: dict[str, Any]) -> None:
    """The first run's summary JSON again, with what the verification found (``verification``). A file that cannot
    be written is said, as an unwritten --json is, and leaves the exit code as it is."""
    try:
        write_summary(path, {**summary, "verification": found})
    except OSError as exc:
        say("demo", f"error: the verification was not added to the summary JSON at {path}: {exc.strerror or exc}")


def cache_error(exc: OSError) -> str:
    """Why the demo dataset could not be written to the cache, and the fix that fits the cause: room for a full
    disk, another folder for one this user may not write (making room there would change nothing)."""
    cache = default_cache_dir()
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        where = Path(exc.filename or cache)
        # a folder that could not be made: its parent refused (os.path.exists: a folder we may not search is no error)
        while not os.path.exists(where) and where != where.parent:
            where = where.parent
        return (f"cannot write the demo dataset in {cache}: {where} is not writable ({exc.strerror}): set "
                "XDG_CACHE_HOME to a folder you can write (the dataset takes about 80 MB)")
    return (f"cannot write the demo dataset in {cache}: {exc.strerror or exc} (it takes about 80 MB; what was written "
            "is kept and finished next time): make room there, or set XDG_CACHE_HOME to a folder that has it")


def verification_order(pairs: int) -> list[str]:
    """The runs after the first (a before), pairs alternating in order: before, after, after, before, before, ..."""
    order = []
    for pair in range(pairs):
        order += ["after"] if pair == 0 else (["after", "before"] if pair % 2 else ["before", "after"])
    return order


def paired_speedup(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """The geometric mean of the pairs' after/before ratios, and the lowest and highest ratio."""
    ratios = [a / b for b, a in zip(before, after, strict=True)]
    return math.exp(sum(map(math.log, ratios)) / len(ratios)), min(ratios), max(ratios)


def _rates(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def _ref(back: int) -> str:
    """How history names the run ``back`` runs before the last."""
    return "last" if back == 0 else f"last~{back}"
