"""A straggler node's fix, predicted from the job's gathered report and then measured on the job: two "nodes" (one
launcher each, ``torchrun --nnodes 2`` over loopback, one rank per node, gloo, ``tests/scripts/ddp_train.py
--barrier``), each pinned to its own core.

Cases (``--case``):
- ``cpus``: 800 generated 500x400 JPEGs (``--images``, 1 worker); node 1 also in a cgroup v1 CPU quota of half a
  core: the report names rank 1 the straggler, its node's CPUs the cause (``straggler-cpus``), with a job-level gain;
  the fix lifts the quota.
- ``data``: in-memory samples and a heavier MLP (``--repeat 6 --hidden 256 --layers 4``, no workers), node 1's
  dataset sleeping ``--slow-ms`` a sample (a slow store): the straggler's own advice (its DataLoader workers,
  ``--set num_workers=N`` on node 1 alone) with its job-level gain; the fix applies that ``--set``.

Each pair runs the job as recorded, then with the fix, and reads the job's steps/s from the gathered report; the
predicted gain is the first pair's report's. Needs root and a cgroup v1 ``cpu`` controller for ``cpus``, and 2 CPUs.

Run:  sudo python benchmarks/job_straggler.py --case cpus [--pairs 2]
      sudo python benchmarks/job_straggler.py --case data [--pairs 2]

Measured on the 2-core development VM: see the docs' calibration table (job-straggler-fix).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DDP = REPO / "tests" / "scripts" / "ddp_train.py"
QUOTA = Path("/sys/fs/cgroup/cpu/stallscope-bench-half")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(work: Path, images: Path, case: str, fixed: bool, node1_set: list[str], slow_ms: float) -> dict:
    """One 2-node job; the gathered job's summary."""
    port, store = _port(), work / f"store-{os.urandom(3).hex()}"
    procs = []
    for node in (0, 1):
        set_args = node1_set if node == 1 else []
        job = [sys.executable, "-m", "stallscope", "run", "--quiet", "--store", str(store), *set_args, "--",
               sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
               "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port), str(DDP),
               "--barrier"]
        if case == "data":  # in-memory points, a heavier model; the slow rank's samples sleep
            job += ["--samples", "2048", "--repeat", "6", "--hidden", "256", "--layers", "4", "--slow-rank", "1",
                    "--slow-ms", str(slow_ms)]
        else:
            job += ["--images", str(images), "--workers", "1"]
        pinned = ["taskset", "-c", str(node), *job]
        if case == "cpus" and node == 1 and not fixed:
            pinned = ["sh", "-c", f'echo $$ > {QUOTA}/tasks; exec "$@"', "sh", *pinned]
        procs.append(subprocess.Popen(pinned, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("the job failed:\n" + "\n".join(o[-2000:] for o in outs))
    merged = next((store / "jobs").glob("*/*.session.json"))
    from stallscope.analysis import analyze
    from stallscope.render.summary import summary_dict
    from stallscope.session import Session

    session = Session.load(merged)
    return summary_dict(session, analyze(session), merged)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", choices=("cpus", "data"), default="cpus")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--slow-ms", type=float, default=6.0)
    args = p.parse_args()
    if args.case == "cpus":
        if os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpu").is_dir():
            raise SystemExit("--case cpus needs root and a cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
        QUOTA.mkdir(exist_ok=True)
        (QUOTA / "cpu.cfs_period_us").write_text("100000")
        (QUOTA / "cpu.cfs_quota_us").write_text("50000")
    from stallscope.demo.dataset import DatasetSpec, make_dataset

    with tempfile.TemporaryDirectory(prefix="job-straggler-") as tmp:
        work = Path(tmp)
        images = make_dataset(work / "images", DatasetSpec(n_files=800))
        predicted, fix_set, ratios = None, [], []
        for pair in range(args.pairs):
            before = run_job(work, images, args.case, False, [], args.slow_ms)
            if predicted is None:
                straggler = (before["distributed"] or {}).get("straggler") or {}
                wanted = "straggler-cpus" if args.case == "cpus" else "num-workers"
                rec = next((r for r in before["recommendations"] if r["id"] == wanted), None)
                print(f"straggler: rank {straggler.get('rank')} ({straggler.get('node')}; cpus {straggler.get('cpus')})"
                      f"; advice: {[(r['id'], r['predicted_speedup']) for r in before['recommendations']][:3]}")
                if rec is None:
                    raise SystemExit(f"the report did not advise {wanted}")
                predicted = rec["predicted_speedup"]
                fix_set = [f"--set={k}={v}" for k, v in rec.get("overrides", {}).items()]
            after = run_job(work, images, args.case, True, fix_set, args.slow_ms)
            ratio = after["throughput"]["steps_per_s"] / before["throughput"]["steps_per_s"]
            ratios.append(ratio)
            print(f"pair {pair + 1}: {before['throughput']['steps_per_s']:.2f} -> "
                  f"{after['throughput']['steps_per_s']:.2f} steps/s, {ratio:.2f}x", flush=True)
        measured = statistics.median(ratios)
        print(json.dumps({"case": args.case, "predicted": predicted, "measured_median": round(measured, 3),
                          "pairs": [round(r, 3) for r in ratios],
                          "error": round(predicted / measured - 1, 3) if predicted else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
