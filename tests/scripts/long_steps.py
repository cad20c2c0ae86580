"""Many tiny training steps over in-memory data: the long-run recording's workload (benchmarks/long_run.py).

--steps N         training steps in all (the loader is iterated over as many epochs as it takes)
--workers W       DataLoader workers (0: the training process loads its own batches)
--epoch-steps E   steps per epoch (a new iterator, so an epoch start, every E steps)
--slow-every K    every K-th step sleeps --slow-ms longer (an anomaly the recording keeps in detail); 0: none
--step-ms MS      each step computes (a busy loop) until it has taken at least MS since the last one ended
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 8)
        self.y = torch.randint(0, 2, (n,))

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--epoch-steps", type=int, default=5_000)
    parser.add_argument("--slow-every", type=int, default=0)
    parser.add_argument("--slow-ms", type=float, default=50.0)
    parser.add_argument("--step-ms", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    batch = 4
    loader = DataLoader(Rows(args.epoch_steps * batch), batch_size=batch, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    done = 0
    started = last = time.perf_counter()
    while done < args.steps:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            while time.perf_counter() - last < args.step_ms / 1000:
                pass
            opt.step()
            last = time.perf_counter()
            done += 1
            if args.slow_every and done % args.slow_every == 0:
                time.sleep(args.slow_ms / 1000)
            if done >= args.steps:
                break
    elapsed = time.perf_counter() - started
    print(f"steps {done} in {elapsed:.1f} s ({elapsed / done * 1000:.3f} ms a step)", flush=True)


if __name__ == "__main__":
    main()
