"""Two DataLoaders fed together with zip(): a slow one (it sleeps in __getitem__) asked first, a cheap one second,
so the cheap one's batch is always the last before the optimizer step. ``--swap`` asks the cheap one first."""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, n: int, sleep_ms: float) -> None:
        self.n, self.sleep = n, sleep_ms / 1000

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.sleep)
        return torch.full((16,), float(i)), i % 4


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=320)
    p.add_argument("--sleep-ms", type=float, default=3.0)
    p.add_argument("--swap", action="store_true")
    a = p.parse_args()
    slow = DataLoader(Slow(a.n, a.sleep_ms), batch_size=8)  # the slow loader's line
    cheap = DataLoader(torch.randn(a.n, 4), batch_size=8)  # the cheap loader's line
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pairs = zip(cheap, slow) if a.swap else zip(slow, cheap)
    for first, second in pairs:
        (x, y), noise = (second, first) if a.swap else (first, second)
        loss = torch.nn.functional.cross_entropy(model(x), y) + 0 * noise.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
