"""A dataset that yields ready batches of 8 (as WebDataset's ``.batched(8)`` does) under ``batch_size=None``: the
DataLoader fetches one item per batch, and each item is 8 samples. Each sample sleeps ``--sleep-ms``."""

import sys
import time

import torch
from torch.utils.data import DataLoader, IterableDataset


class Batches(IterableDataset):
    def __init__(self, batches: int, size: int, sleep_ms: float) -> None:
        self.batches, self.size, self.sleep = batches, size, sleep_ms / 1000

    def __iter__(self):
        for b in range(self.batches):
            for _ in range(self.size):
                time.sleep(self.sleep)
            yield torch.randn(self.size, 16), torch.arange(self.size) % 4


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    loader = DataLoader(Batches(40, 8, 2.0), batch_size=None, num_workers=workers)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
