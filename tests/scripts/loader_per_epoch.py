"""A new DataLoader every epoch from one call site, as many training loops are written; an evaluation loader
from another site after each epoch. ``--workers W``, ``--epochs E``; 10 training batches per epoch."""

import argparse
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--sleep-ms", type=float, default=2.0)
    p.add_argument("--once", action="store_true", help="build the training loader once (the fix)")
    a = p.parse_args()
    train = TensorDataset(torch.randn(320, 8), torch.randint(0, 2, (320,)))
    val = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    once = DataLoader(train, batch_size=32, num_workers=a.workers, persistent_workers=a.workers > 0) if a.once else None
    for epoch in range(a.epochs):
        for x, y in once or DataLoader(train, batch_size=32, num_workers=a.workers):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(a.sleep_ms / 1000)
            steps += 1
        with torch.no_grad():
            for x, _ in DataLoader(val, batch_size=32):
                model(x)
    print(f"steps {steps}")


if __name__ == "__main__":
    main()
