"""A training script that fails only under some DataLoader configurations (for stallscope tune's tests).

The worker count is read back from the DataLoader after construction, so ``--set num_workers=N``
decides whether this run crashes or hangs.
"""

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n, sleep_ms):
        self.n, self.sleep = n, sleep_ms / 1000.0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.sleep)
        return torch.full((16,), float(i)), i % 4


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sleep-ms", type=float, default=2.0)
    p.add_argument("--crash-workers", type=int, default=None, help="crash when run with exactly this many workers")
    p.add_argument("--hang-from-workers", type=int, default=None, help="hang when run with at least this many")
    p.add_argument("--pid-file", default=None, help="when hanging, write this process's pid here first")
    a = p.parse_args()
    loader = DataLoader(Slow(10_000, a.sleep_ms), batch_size=8, num_workers=0)
    if a.crash_workers is not None and loader.num_workers == a.crash_workers:
        raise RuntimeError(f"planted failure with {loader.num_workers} workers")
    if a.hang_from_workers is not None and loader.num_workers >= a.hang_from_workers:
        if a.pid_file:
            with open(a.pid_file + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.replace(a.pid_file + ".tmp", a.pid_file)  # whole or absent: the test polls for it
        while True:
            time.sleep(1)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
