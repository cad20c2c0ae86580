"""Trains for N steps (about 20 ms each) and prints as it goes, on stdout and stderr: the live view's job.

Each fetched sample sleeps 2 ms (input-bound); every 20 steps it prints a numbered line to stdout and,
every 40, one to stderr, so a test can check that the script's lines reach the terminal intact
around the status line. Seeded: the output is the same on every run.
"""

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


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 150
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
