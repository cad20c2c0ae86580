"""Trains for N steps (about 20 ms each) and prints as it goes, on stdout and stderr: the live view's job.

Each fetched sample sleeps 2 ms (input-bound); every 20 steps it prints a numbered line to stdout and,
every 40, one to stderr, so a test can check that the script's lines reach the terminal intact
around the status line. Seeded: the output is the same on every run.

Options for the harder cases: ``--interleave N`` first writes N numbered lines alternately to stdout and
stderr (raw writes, so their order is the order written); ``--orphan`` leaves a process behind that
prints for two more seconds after the script ended; ``--exit-code C`` ends with that code.
"""

import argparse
import os
import subprocess
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int):
        time.sleep(0.002)
        return torch.full((8,), float(index % 7)), index % 2


ORPHAN = "import time\nfor k in range(20):\n    print(f'orphan line {k}', flush=True)\n    time.sleep(0.1)\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int, nargs="?", default=150)
    parser.add_argument("--interleave", type=int, default=0)
    parser.add_argument("--orphan", action="store_true")
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args()
    steps = args.steps
    for k in range(args.interleave):
        os.write(1, f"O{k}\n".encode())
        os.write(2, f"E{k}\n".encode())
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(), batch_size=8, num_workers=0)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"script line {step // 20}: loss {loss.item():.4f} and some words after it", flush=True)
        if step % 40 == 0:
            print(f"script warning {step // 40}", file=sys.stderr, flush=True)
        if step + 1 == steps:
            break
    print("script done", flush=True)
    if args.orphan:
        subprocess.Popen([sys.executable, "-c", ORPHAN], start_new_session=True)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
