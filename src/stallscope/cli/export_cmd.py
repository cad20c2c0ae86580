"""``stallscope export RUN --to mlflow|wandb|tensorboard``: send a saved run's results to a tracker.

The same as ``stallscope run --log-to``, for a run already recorded: metrics, tags, the summary JSON and the
HTML report go to the script's own tracker run when it started one, else to a new run.
"""

from __future__ import annotations

import argparse
import sys

from stallscope.analysis import analyze
from stallscope.cli.args import folder
from stallscope.cli.common import load_error
from stallscope.cli.report_cmd import load_run
from stallscope.render.safe_text import printable
from stallscope.render.summary import summary_dict
from stallscope.trackers import TRACKERS, TrackerUnavailable, failure_line, log_run

EPILOG = """examples:
  stallscope export last --to mlflow                        (the script's MLflow run, else $MLFLOW_TRACKING_URI)
  stallscope export last --to mlflow --uri sqlite:///mlflow.db
  stallscope export RUN_ID --to wandb --project my-project  (respects WANDB_MODE, WANDB_DIR, ...)
  stallscope export last --to tensorboard --dir runs/exp1

Where it goes by default: MLflow: the tracking URI of the run the script started, else MLFLOW_TRACKING_URI,
else MLflow's default (MLFLOW_EXPERIMENT_NAME/ID choose the experiment of a new run). W&B: the script's run,
resumed in its mode (online, offline), else a new run in project $WANDB_PROJECT or "stallscope".
TensorBoard: the script's SummaryWriter folder, else ./runs/stallscope/RUN_ID."""

#: option -> the one tracker it belongs to
_OPTION_OF = {"uri": "mlflow", "project": "wandb", "log_dir": "tensorboard"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="send a saved run's results to MLflow, W&B or TensorBoard",
                              description="Log a saved run's metrics, verdict, summary JSON and HTML report to an "
                                          "experiment tracker.",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", default="last",
                   help="run id (or a unique prefix), a session.json path, a run directory, or 'last' (default)")
    p.add_argument("--to", required=True, choices=sorted(TRACKERS), help="the tracker")
    p.add_argument("--uri", metavar="URI", help="MLflow tracking URI (default: the script's, else "
                                                "$MLFLOW_TRACKING_URI, else MLflow's default)")
    p.add_argument("--project", metavar="NAME", help="W&B project (default: the script's run's, else "
                                                     "$WANDB_PROJECT, else stallscope)")
    p.add_argument("--dir", "--log-dir", dest="log_dir", metavar="DIR",
                   help="TensorBoard log folder (default: the script's SummaryWriter folder, else "
                        "./runs/stallscope/RUN_ID)")
    p.add_argument("--store", metavar="DIR", type=folder,
                   help="the store to look in (default ./.stallscope or $STALLSCOPE_HOME)")
    p.set_defaults(handler=handle)


def _fail(message: str, code: int = 2) -> int:
    print(printable(f"stallscope export: {message}"), file=sys.stderr)
    return code


def handle(args: argparse.Namespace) -> int:
    for option, tracker in _OPTION_OF.items():
        if getattr(args, option) is not None and args.to != tracker:
            flag = "--dir" if option == "log_dir" else f"--{option}"
            return _fail(f"{flag} goes with --to {tracker}, not --to {args.to}")
    try:
        session, path = load_run(args.run, args.store, "export")
    except (OSError, ValueError) as exc:
        return _fail(load_error(exc))
    analysis = analyze(session)
    summary = summary_dict(session, analysis, path)
    try:
        where = log_run(summary, session, args.to, analysis=analysis, uri=args.uri, log_dir=args.log_dir,
                        project=args.project, warn=lambda line: print(printable(f"stallscope export: {line}"),
                                                         file=sys.stderr))
    except TrackerUnavailable as exc:
        return _fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - the tracker's own failure (server, store, credentials): one line
        return _fail(f"could not log to {args.to}: {failure_line(exc)}", code=1)
    print(printable(f"stallscope export: logged run {session.run_id} to {where}"))
    return 0
