"""``stallscope plan RUN``: project a recorded run to the machine you will train on."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from stallscope.analysis.plan import NothingToPlan, PlanError, plan_dict, plan_run
from stallscope.cli.args import folder, output_error
from stallscope.cli.common import load_error
from stallscope.cli.report_cmd import load_run
from stallscope.constants import PLAN_SCHEMA
from stallscope.render import plan as plan_view
from stallscope.render.safe_text import printable
from stallscope.render.summary import print_json, write_summary


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="project a recorded run to another machine: workers per GPU, the stage that saturates, fixes",
        description="Project a recorded run to another machine. The run's per-sample costs (CPU per stage, time "
                    "blocked on storage, the training process's own work) are kept; the cores, GPUs and step time "
                    "are the target's. Prints the input pipeline's rate for each worker count, the workers each "
                    "training process (one per GPU) needs to stay fed, the stage that gives out first, and where "
                    "the cores cannot keep up, the fixes with their predicted gain. The assumptions are printed.",
        epilog="examples:\n"
               "  stallscope plan last --cores 32 --gpus 4 --step-ms 180     (180 ms per step on each GPU)\n"
               "  stallscope plan last --cores 16 --gpus 2 --samples-per-s 4000 --json plan.json\n"
               "  stallscope plan last --cores 2 --workers 2                 (a CPU-only machine with 2 cores)\n"
               "  stallscope plan last --cores 96 --gpus 8 --nodes 16 --link-gbps 400   (16 such nodes)\n"
               "RUN: a run id (or a unique prefix), last, a session.json path or a run directory.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", default="last", help="the recorded run (default: last)")
    p.add_argument("--cores", type=float, metavar="N",
                   help="CPU cores the job may use on the target (default: the recorded machine's usable CPUs: "
                        "its affinity and cgroup quota); count hardware threads, as os.cpu_count() does")
    p.add_argument("--threads-per-core", type=float, metavar="T",
                   help="hardware threads per core on the target: 2 with hyper-threading (SMT), 1 without "
                        "(default: as on the recorded machine); a core's second thread adds a fraction of a core")
    p.add_argument("--gpus", type=int, default=None, metavar="G",
                   help="GPUs on the target, one training process each (default: as recorded, one per rank on "
                        "the recorded machine; 0 without a GPU)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--step-ms", type=float, metavar="MS",
                      help="milliseconds of one training step on the target's GPU (per process, with the recorded "
                           "samples per step)")
    rate.add_argument("--samples-per-s", type=float, metavar="S",
                      help="samples/s the whole job's compute could take on the target (all GPUs together)")
    rate.add_argument("--device-speedup", type=float, metavar="X",
                      help="the target's device X times as fast as the recorded one: forward, backward and "
                           "optimizer (on a GPU run, the GPU's busy time) shrink, the step's own code on the host "
                           "does not, so a host-bound job stays host-bound")
    p.add_argument("--workers", type=int, metavar="W", help="also show the prediction for W workers per process")
    p.add_argument("--nodes", type=int, metavar="N",
                   help="the job over N machines like the target (--cores and --gpus are per node): the DDP "
                        "gradients' ring all-reduce over all ranks is priced on --link-gbps and replaces the recorded "
                        "wait for other ranks; the table stays per node, the job's rate is N times it")
    p.add_argument("--link-gbps", type=float, metavar="GBPS",
                   help="with --nodes: each node's link to the others in Gb/s (100 for 100 Gb Ethernet)")
    p.add_argument("--store-probe", metavar="DOCTOR_JSON",
                   help="the object store the run read, as `stallscope doctor s3://BUCKET/PREFIX --json PATH` measured "
                        "it: the plan then says whether its workers keep the requests in flight its rate needs")
    p.add_argument("--json", metavar="PATH", help="write the plan (schema stallscope.plan/1) here; '-' for stdout")
    p.add_argument("--store", metavar="DIR", type=folder,
                   help="the store to look in (default ./.stallscope or $STALLSCOPE_HOME)")
    p.set_defaults(handler=handle)


def _fail(message: str) -> int:
    print(printable(f"stallscope plan: {message}"), file=sys.stderr)
    return 2


def handle(args: argparse.Namespace) -> int:
    try:
        session, source = load_run(args.run, args.store, "plan")
    except (OSError, ValueError) as exc:
        return _fail(load_error(exc))
    if problem := output_error([args.json], args.store, source, dash_is_stdout=True):
        return _fail(problem)
    if args.link_gbps is not None and args.nodes is None:
        return _fail("--link-gbps prices the all-reduce between nodes: give --nodes N with it")
    probe = None
    if args.store_probe:
        from stallscope.health.object_store import StoreProbe

        try:
            probe = StoreProbe.from_doctor(json.loads(Path(args.store_probe).read_text()))
        except OSError as exc:
            return _fail(f"cannot read --store-probe {args.store_probe}: {exc.strerror or exc}")
        except ValueError as exc:  # not JSON, or no probe in it
            return _fail(f"--store-probe {args.store_probe}: {exc}")
    try:
        plan = plan_run(session, cores=args.cores, gpus=args.gpus, step_ms=args.step_ms,
                        samples_per_s=args.samples_per_s, workers=args.workers,
                        threads_per_core=args.threads_per_core, device_speedup=args.device_speedup,
                        nodes=args.nodes, link_gbps=args.link_gbps, store_probe=probe)
    except NothingToPlan as exc:
        again = f"--store {shlex.quote(args.store)} " if args.store else ""
        return _fail(f"{exc} (`stallscope report {again}{shlex.quote(args.run)}` shows what was recorded)")
    except PlanError as exc:
        return _fail(str(exc))

    document = plan_dict(plan, session.run_id, PLAN_SCHEMA)
    if args.json == "-":
        print_json(document)
        return 0
    if args.json:
        try:
            write_summary(args.json, document)  # the one JSON writer: no half-written file on a full disk
        except OSError as exc:
            return _fail(f"cannot write {args.json}: {exc.strerror or exc}")
    plan_view.render(plan, session.run_id or args.run)
    return 0
