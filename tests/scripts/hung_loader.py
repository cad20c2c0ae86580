"""A DataLoader whose workers block forever after some samples (a deadlock, a read that never returns).

--timeout S passes DataLoader(timeout=S), which turns the hang into a RuntimeError; without it the
script waits until it is interrupted. Prints "batch N" per batch so a test knows where it is.
"""

import argparse
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Hangs(Dataset):
    def __init__(self, block_after: int) -> None:
        self.block_after = block_after

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        if index >= self.block_after:
            threading.Event().wait()  # never set
        time.sleep(0.002)
        return torch.full((8,), float(index))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--block-after", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=0)
    args = parser.parse_args()
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Hangs(args.block_after), batch_size=10, num_workers=args.workers, timeout=args.timeout)
    for i, x in enumerate(loader):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"batch {i}", flush=True)


if __name__ == "__main__":
    main()
