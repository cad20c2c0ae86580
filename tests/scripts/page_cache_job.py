"""A training job that reads records at random offsets of one large file (a packed dataset without an index cache):
fast while the page cache holds the file, slower once it does not (benchmarks/long_run.py's page-cache plant runs it
in a memory-limited cgroup and evicts the cache partway).

--file PATH        the dataset file (made with --make MB first where it does not exist)
--record-kb KB     bytes read per sample
--seconds S        stop after about S seconds of training
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Records(Dataset):
    def __init__(self, path: str, record: int) -> None:
        self.path, self.record = path, record
        self.count = os.path.getsize(path) // record
        self.fd: int | None = None

    def __len__(self) -> int:
        return 10_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        at = (i * 7_919) % self.count  # a fixed scattered order: readahead does not help
        raw = os.pread(self.fd, self.record, at * self.record)
        head = np.frombuffer(raw[:64], dtype=np.uint8).astype(np.float32)
        return torch.from_numpy(head) / 255.0, torch.tensor(i % 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--file", required=True)
    parser.add_argument("--make", type=int, default=0, help="write a file of this many MB of random bytes first")
    parser.add_argument("--record-kb", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=240.0)
    args = parser.parse_args()
    if args.make and not os.path.exists(args.file):
        with open(args.file, "wb") as f:
            for _ in range(args.make):
                f.write(os.urandom(1 << 20))
            f.flush()
            os.fsync(f.fileno())  # written back: a cache dropped later drops all of it
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(Records(args.file, args.record_kb << 10), batch_size=8)
    model = nn.Linear(64, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    started, steps = time.perf_counter(), 0
    for x, y in loader:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        if time.perf_counter() - started > args.seconds:
            break
    print(f"{steps} steps in {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
