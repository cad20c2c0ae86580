"""``stallscope run``: record an unmodified training script and print where its steps' time goes."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from stallscope import paths
from stallscope.analysis import analyze
from stallscope.api import RunResult, record_history
from stallscope.cli.common import add_run_options, after_dashes, fail, parse_set, record, run_options_error, say
from stallscope.gather import DEFAULT_WAIT_S, FAILED_JOB_WAIT_S, gather
from stallscope.render import terminal
from stallscope.render.safe_text import terminal_console
from stallscope.settings import SETTABLE

EPILOG = f"""examples:
  stallscope run -- python train.py --epochs 1
  stallscope run train.py --lr 0.1                 (a .py file runs with this Python)
  stallscope run -m mypkg.train                    (a module)
  stallscope run --steps 50 --set num_workers=4 --json out.json -- python train.py

--set names: {", ".join(sorted(SETTABLE))}. They apply to every DataLoader the script creates.
The script's own exit code is stallscope's exit code; the session is saved even when the script
crashes or is interrupted. Re-render a saved run with: stallscope report last

many nodes: run one `stallscope run -- torchrun --nnodes N ...` per node (or `srun stallscope run -- python
train.py`). Each node saves its own session; then the nodes' sessions are gathered into one job report, with
no manual step: through the store folder where the nodes share it (--store on a shared file system; the last
node to finish merges), else over torch.distributed's TCPStore at the job's MASTER_ADDR:MASTER_PORT once the
job has let it go (the node that owns that address merges). The job's session is saved under STORE/jobs/."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="record a training script and diagnose its input pipeline",
                              description="Run a training script unmodified, record every DataLoader and "
                                          "training step, and say which stage limits it.",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(p)
    p.add_argument("-m", dest="module", metavar="MODULE",
                   help="run a module, like python -m; every argument after MODULE is the module's, so give "
                        "stallscope's options before -m")
    p.add_argument("--gather-wait", type=float, default=DEFAULT_WAIT_S, metavar="SECONDS",
                   help="a job with ranks on other nodes: how long to wait for their sessions before merging what "
                        f"came, naming the ranks that sent nothing (default {DEFAULT_WAIT_S:.0f}, and at most "
                        f"{FAILED_JOB_WAIT_S:.0f} after a job that failed; 0: do not gather)")
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
    if not math.isfinite(args.gather_wait) or args.gather_wait < 0:
        return fail("run", "--gather-wait must be 0 (do not gather) or a number of seconds")
    code, result = record("run", command, module=args.module, store=args.store, overrides=overrides,
                          max_steps=args.steps, json_path=args.json, quiet=args.quiet,
                          sample_interval_s=args.sample_interval, log_to=args.log_to)
    if result is not None and result.session_path is not None and args.gather_wait > 0:
        gather_job(result, paths.store_dir(args.store), args.gather_wait, args.quiet)
    return code


def gather_job(result: RunResult, store: Path, wait_s: float, quiet: bool) -> None:
    """One report for a job whose ranks ran on several nodes. Never changes the exit code: a failure to gather costs
    the job's report, which ``stallscope merge`` can still make from the nodes' sessions."""
    def note(line: str) -> None:
        say("run", line)

    assert result.session_path is not None
    try:
        gathered = gather(result.session, Path(result.session_path), store, wait_s=wait_s, say=note)
        if gathered is None:
            return
        for line in gathered.lines:
            note(line)
        if gathered.merged is not None and gathered.path is not None:
            analysis = analyze(gathered.merged)
            if not quiet:
                terminal.render(gathered.merged, analysis, terminal_console(stderr=True),
                                session_ref=str(gathered.path))
            if problem := record_history(store, gathered.merged, analysis, gathered.path):
                note(f"warning: the job's report was not added to the history: {problem}")
            note(f"the job's {len(gathered.merged.clock_alignment)} node sessions merged into {gathered.path}"
                 + (f"; rank(s) {', '.join(map(str, gathered.missing))} sent nothing" if gathered.missing else ""))
    except KeyboardInterrupt:
        note("stopped gathering the job's nodes (Ctrl-C); merge their sessions with stallscope merge")
    except (OSError, ValueError, RuntimeError) as exc:  # a MergeError is a ValueError
        note(f"warning: the job's nodes were not gathered: {exc}; merge their sessions with stallscope merge")
