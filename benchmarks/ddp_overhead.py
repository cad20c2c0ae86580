"""Recorder overhead on a DDP job: a 2-rank gloo job on CPU with and without ``stallscope run``.

Pairs alternate which side runs first, so drifts in machine load hit both alike. Each rank of
``tests/scripts/ddp_train.py`` reports its own median step time after 3 warm-up steps (identical
code on both sides); the figure of merit is the median over pairs of (recorded / plain) step time,
and the absolute added time per step. Under the recorder every step also carries the DDP comm
hook's timing, the collective wrappers and the optimizer-step hooks.

Run:  python benchmarks/ddp_overhead.py [--pairs 5] [--samples 512]

Measured on the 2-core development machine (2026-11-29), 2 ranks, batch 8, 32 steps per rank,
5 pairs: see the closing note of issue 8 for the figures (about +0.1 ms per step).
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


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(prefix: list[str], args: list[str]) -> float:
    """Median over ranks of each rank's median step time, in ms."""
    cmd = [*prefix, sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(_port()), str(SCRIPT), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STALLSCOPE")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, timeout=600).stdout
    steps = [float(m) for m in re.findall(r"median step ([0-9.]+) ms", out)]
    if len(steps) != 2:
        raise RuntimeError(f"expected two ranks' step times in:\n{out[-2000:]}")
    return statistics.median(steps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--hidden", type=int, default=256)
    a = p.parse_args()
    args = ["--samples", str(a.samples), "--hidden", str(a.hidden)]
    with tempfile.TemporaryDirectory() as store:
        recorder = [sys.executable, "-m", "stallscope", "run", "--quiet", "--store", store, "--"]
        ratios, added = [], []
        for pair in range(a.pairs):
            order = [("plain", []), ("recorded", recorder)]
            if pair % 2:
                order.reverse()
            times = {name: measure(prefix, args) for name, prefix in order}
            ratios.append(times["recorded"] / times["plain"])
            added.append(times["recorded"] - times["plain"])
            print(f"pair {pair}: plain {times['plain']:.3f} ms/step, recorded {times['recorded']:.3f} ms/step, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"median recorded/plain step time: {statistics.median(ratios):.3f}   "
          f"median added per step: {statistics.median(added):+.3f} ms")


if __name__ == "__main__":
    main()
