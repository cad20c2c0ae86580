"""Recorder overhead on a DDP job: a 2-rank gloo job on CPU with and without ``stallscope run``.

Jobs of ``tests/scripts/ddp_train.py``:
- ``images``: the reference workload under DDP: the demo ImageFolder (500x400 JPEGs) decoded and augmented
  (``RandomResizedCrop`` to 96 px, flip, ``ToTensor``, ``Normalize``) by one DataLoader worker per rank, the
  reference script's small CNN, batches of 16, 2 epochs (40-55 ms per step here, input-bound: the workers'
  per-call timing is what costs); ``images224``: the same at the reference workload's 224 px (~90 ms per step);
- ``small``, a 4-layer MLP on batches of 64 (~10 ms per step), ``toy``, a 2-layer MLP on batches of 8 (~2 ms per
  step: the recorder's absolute cost per step, magnified) and ``large`` (3 x 2048 MLP, ~90 ms), all with the
  dataset read in the training process (``num_workers=0``, so fetch timing runs in the training thread).
Each round runs three jobs, plain, a second plain (the control) and recorded, in an order that cycles through all
six, so that each figure comes with what two identical runs differ by on this machine at that moment
(``--without-sampler`` adds a fourth run: recorded with the system sampler off). Each rank reports its median step
time after 3 warm-up steps, its training thread's CPU time per step and its own plus its DataLoader workers' CPU
per step; the figures are medians over rounds, with quartiles. The default runs images, small and toy.

Run:  python benchmarks/ddp_overhead.py [--rounds 8] [--jobs images,images224,small,toy,large] [--sample-interval 0.1]

Measured on the 2-core development machine, 2026-11-30, after workers time library calls in one batch of every
few where timing each call would cost more than 0.5% of a fetch (``record.calls.timing_interval``):
- images, 16 rounds (38.7 ms per step): recorded / mean of plain and control 1.010 (quartiles 0.986-1.022),
  +0.43 ms per step; recorded/plain 0.999 (0.982-1.021) while control/plain was 0.997 (0.948-1.024); rank plus
  workers' CPU per step recorded/plain 1.003 (0.996-1.008), control/plain 0.981 (0.963-1.002).
- 8 rounds an hour earlier: images (41.2 ms) 1.025 (0.993-1.047), +1.1 ms (recorded/plain 1.041, control/plain
  1.037); small (8.0 ms) 1.014 (0.961-1.032), +111 us; toy (1.47 ms) 1.065 (1.038-1.138), +97 us.
- The same session before that change, host noisier (48-55 ms per images step): images 1.035 (0.999-1.070) and
  1.072 (1.009-1.109); with ``--without-sampler`` the recorder without its system sampler cost the same (1.028
  against 1.034 with it). Earlier still (every call of every batch timed): images 1.024 (1.017-1.045), images224
  1.017 (1.000-1.045), small 1.027 (+0.28 ms), toy 1.121 (+0.26 ms).
So the reference workload under DDP loses about 1% (the workers' share is measured more precisely, per batch, by
benchmarks/fetch_overhead.py: +0.75% of a fetch); what remains in the training thread is ~0.1 ms per step, which
is under 2% from steps of ~5 ms and not for ~1.5 ms steps (toy: 6.5%).
"""

from __future__ import annotations

import argparse
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
    "images224": ["--images", "{images}", "--workers", "1", "--batch-size", "16", "--image-size", "224",
                  "--epochs", "2"],
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
    p.add_argument("--files", type=int, default=2000, help="JPEGs in the generated demo dataset (the images job)")
    p.add_argument("--without-sampler", action="store_true",
                   help="a fourth run per round: recorded with the system sampler off (its share of the cost)")
    a = p.parse_args()
    jobs = [j for j in a.jobs.split(",") if j]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        p.error(f"unknown job(s) {', '.join(unknown)}; choose from {', '.join(JOBS)}")
    if any("{images}" in JOBS[job] for job in jobs):
        from stallscope.demo.dataset import DatasetSpec, demo_dataset

        images = str(demo_dataset(DatasetSpec(n_files=a.files), progress=True))
        for job in jobs:
            JOBS[job] = [images if arg == "{images}" else arg for arg in JOBS[job]]
    sides = (*SIDES, "no sampler") if a.without_sampler else SIDES
    # each side in each position equally often: every rotation of the sides, forwards and backwards
    # (for three sides, all six orders)
    rotations = [sides[k:] + sides[:k] for k in range(len(sides))]
    orders = [order for rotation in rotations for order in (rotation, rotation[::-1])]
    others = [side for side in sides if side != "plain"]
    ratios = {j: {side: [[] for _ in METRICS] for side in others} for j in jobs}
    added = {j: [[] for _ in METRICS] for j in jobs}
    plain_steps: dict[str, list[float]] = {j: [] for j in jobs}
    # step time against the mean of the two plain runs of the round: (ratio, added ms)
    against_both: dict[str, list[tuple[float, float]]] = {j: [] for j in jobs}
    with tempfile.TemporaryDirectory() as store:
        def recorder(interval: str) -> list[str]:
            return [sys.executable, "-m", "stallscope", "run", "--quiet", "--store", store,
                    "--sample-interval", interval, "--"]

        prefix = {"plain": [], "control": [], "recorded": recorder(a.sample_interval), "no sampler": recorder("0")}
        for rnd in range(a.rounds):
            for job in jobs:
                got = {side: measure(prefix[side], JOBS[job]) for side in orders[rnd % len(orders)]}
                plain_steps[job].append(got["plain"][0])
                baseline = (got["plain"][0] + got["control"][0]) / 2
                against_both[job].append((got["recorded"][0] / baseline, got["recorded"][0] - baseline))
                for i in range(len(METRICS)):
                    for side in others:
                        ratios[job][side][i].append(got[side][i] / got["plain"][i])
                    added[job][i].append(got["recorded"][i] - got["plain"][i])
                each = [f"{m} x{ratios[job]['recorded'][i][-1]:.3f} (control x{ratios[job]['control'][i][-1]:.3f})"
                        for i, m in enumerate(METRICS)]
                print(f"round {rnd} {job}: plain {got['plain'][0]:.3f} ms/step, control {got['control'][0]:.3f}, "
                      f"recorded {got['recorded'][0]:.3f}; " + ", ".join(each), flush=True)
    for job in jobs:
        print(f"\n{job} job ({statistics.median(plain_steps[job]):.2f} ms per step plain, {a.rounds} rounds):")
        for i, metric in enumerate(METRICS):
            print(f"  {metric}: recorded/plain {_quartiles(ratios[job]['recorded'][i])}, added "
                  f"{statistics.median(added[job][i]) * 1000:+.0f} us; "
                  f"control/plain {_quartiles(ratios[job]['control'][i])}")
            if "no sampler" in ratios[job]:
                print(f"    recorded with the sampler off / plain {_quartiles(ratios[job]['no sampler'][i])}")
        print(f"  step time, recorded / mean of plain and control: {_quartiles([r for r, _ in against_both[job]])}, "
              f"added {statistics.median(d for _, d in against_both[job]) * 1000:+.0f} us")


if __name__ == "__main__":
    main()
