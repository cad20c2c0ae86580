"""Recorder overhead on a DDP job: a 2-rank gloo job on CPU with and without ``stallscope run``.

Jobs of ``tests/scripts/ddp_train.py``, all with the dataset read in the training process
(``num_workers=0``, so the recorder's fetch timing runs there too): ``large``, a 3-layer MLP of
width 2048 on batches of 256 (about 90 ms per step here); ``small``, a 4-layer MLP on batches of 64
(about 9 ms per step, the scale of a small real step); and ``toy``, a 2-layer MLP on batches of 8
(about 1.7 ms per step: the recorder's absolute cost per step, magnified). The default runs small
and toy.
Pairs alternate which side runs first, so drifts in machine load hit both alike. Each rank reports
its median step time after 3 warm-up steps, its process's CPU time per step and its training
thread's; the figures of merit are the medians over pairs of recorded / plain, and the added time
per step. Under the recorder each step carries the DataLoader and fetch timing, the optimizer-step
hooks, DDP's gradient-wait timing (see ``stallscope.record.distributed.patch_ddp``) and events.

Run:  python benchmarks/ddp_overhead.py [--pairs 8] [--jobs large,small,toy] [--sample-interval 0.1] [--calibrate]

Measured on the 2-core development machine (2026-11-30, after DDP's wait stopped going through a Python
communication hook), medians over pairs with quartiles:
- large (~90 ms per step, 6 pairs): step x1.013 (0.972-1.076), training thread CPU x0.993: no measurable cost;
- small (8.6-9.4 ms per step): step x1.043 (1.009-1.084) over 16 pairs, +0.36 ms per step; an earlier run of
  16 pairs x1.025 (0.981-1.090), one of 12 pairs x1.040; training thread CPU x1.028-1.041 (+0.17-0.24 ms);
- toy (1.6-1.8 ms per step, 16 pairs): step x1.104 (1.063-1.137), +0.16 ms; training thread CPU x1.104.
  Before (the Python comm hook timing every bucket): x1.18, +0.22 ms per step.
- ``--calibrate`` (plain against plain, 12 pairs): small x1.009 (0.957-1.095), toy x1.014 (0.972-1.077):
  this machine's noise floor. So the recorder's cost is ~0.15-0.3 ms per step of Python work in the training
  thread (DataLoader and fetch timing, optimizer hooks, DDP's wait, events), i.e. about 2-4% of a 9 ms step
  and 10% of a 1.7 ms one on this 2-core VM, where both ranks saturate both cores.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "ddp_train.py"
#: What each rank prints about itself (tests/scripts/ddp_train.py), in ms.
RANK_LINE = re.compile(r"median step ([0-9.]+) ms, CPU per step ([0-9.]+) ms, training thread ([0-9.]+) ms, "
                       r"workers ([0-9.]+) ms")
METRICS = ("step time", "training thread CPU per step", "rank + its workers' CPU per step")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(prefix: list[str], args: list[str]) -> tuple[float, float, float]:
    """(step time, training thread's CPU per step, the rank's and its workers' CPU per step) in ms:
    medians over ranks of what each rank measured itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLSCOPE")}
    for attempt in range(2):  # a free port can be taken between choosing it and torchrun binding it
        cmd = [*prefix, sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
               "127.0.0.1", "--master_port", str(_port()), str(SCRIPT), *args]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode == 0:
            break
        print(f"run failed (exit {proc.returncode}){', retrying' if attempt == 0 else ''}:\n{proc.stderr[-1500:]}",
              file=sys.stderr)
    else:
        raise SystemExit("the DDP job failed twice")
    found = RANK_LINE.findall(proc.stdout)
    if len(found) != 2:
        raise RuntimeError(f"expected two ranks' step times in:\n{proc.stdout[-2000:]}")
    ranks = [[float(v) for v in rank] for rank in found]
    return (statistics.median(r[0] for r in ranks), statistics.median(r[2] for r in ranks),
            statistics.median(r[1] + r[3] for r in ranks))


def _quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{q[1]:.3f} (quartiles {q[0]:.3f}-{q[2]:.3f})"


#: job name -> its ddp_train.py arguments ("{images}": the demo dataset's folder, made on first use)
JOBS: dict[str, list[str]] = {
    "images": ["--images", "{images}", "--workers", "1", "--batch-size", "16", "--image-size", "96", "--epochs", "2"],
    "large": ["--samples", "16384", "--hidden", "2048", "--layers", "3", "--batch-size", "256"],
    "small": ["--samples", "32768", "--hidden", "512", "--layers", "4", "--batch-size", "64"],
    "toy": ["--samples", "8192", "--hidden", "256", "--batch-size", "8"],
}
#: Each round runs these three, in an order that cycles through all six: the second plain run is the
#: control, so the same run shows what two identical jobs differ by on this machine at this time.
SIDES = ("plain", "control", "recorded")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=8, help="rounds of three runs (plain, control, recorded)")
    p.add_argument("--jobs", default="images,small,toy", help=f"comma-separated, of: {', '.join(JOBS)}")
    p.add_argument("--sample-interval", default="0.1", help="passed to stallscope run (0: system sampler off)")
    a = p.parse_args()
    jobs = [j for j in a.jobs.split(",") if j]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        p.error(f"unknown job(s) {', '.join(unknown)}; choose from {', '.join(JOBS)}")
    if "images" in jobs:
        from stallscope.demo.dataset import demo_dataset

        images = str(demo_dataset(progress=True))
        JOBS["images"] = [images if arg == "{images}" else arg for arg in JOBS["images"]]
    orders = list(itertools.permutations(SIDES))
    ratios = {j: {side: [[] for _ in METRICS] for side in ("recorded", "control")} for j in jobs}
    added = {j: [[] for _ in METRICS] for j in jobs}
    plain_steps: dict[str, list[float]] = {j: [] for j in jobs}
    with tempfile.TemporaryDirectory() as store:
        recorder = [sys.executable, "-m", "stallscope", "run", "--quiet", "--store", store,
                    "--sample-interval", a.sample_interval, "--"]
        for rnd in range(a.rounds):
            for job in jobs:
                got = {side: measure(recorder if side == "recorded" else [], JOBS[job])
                       for side in orders[rnd % len(orders)]}
                plain_steps[job].append(got["plain"][0])
                for i in range(len(METRICS)):
                    for side in ("recorded", "control"):
                        ratios[job][side][i].append(got[side][i] / got["plain"][i])
                    added[job][i].append(got["recorded"][i] - got["plain"][i])
                print(f"round {rnd} {job}: plain {got['plain'][0]:.3f} ms/step, control {got['control'][0]:.3f}, "
                      f"recorded {got['recorded'][0]:.3f}; "
                      + ", ".join(f"{m} x{ratios[job]['recorded'][i][-1]:.3f} (control x{ratios[job]['control'][i][-1]:.3f})"
                                  for i, m in enumerate(METRICS)), flush=True)
    for job in jobs:
        print(f"\n{job} job ({statistics.median(plain_steps[job]):.2f} ms per step plain, {a.rounds} rounds):")
        for i, metric in enumerate(METRICS):
            print(f"  {metric}: recorded/plain {_quartiles(ratios[job]['recorded'][i])}, added "
                  f"{statistics.median(added[job][i]) * 1000:+.0f} us; "
                  f"control/plain {_quartiles(ratios[job]['control'][i])}")


if __name__ == "__main__":
    main()
