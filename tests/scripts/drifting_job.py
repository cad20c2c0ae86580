"""A training job that changes over time, one planted cause at a time (the over-time findings' e2e tests).

--plant leak            the loop computes a metric with a second forward outside torch.no_grad and keeps it,
                        graph and all, logging the running mean with torch.cat each step: the step's own code slows
                        as the list grows, and memory grows with it
--plant python-leak     the loop keeps 200 small Python dicts a step (a per-step record that is never dropped): each
                        full garbage collection walks more of them, so its pauses grow
--plant growing-inputs  samples grow longer over the run (a curriculum): forward and backward take longer per step
--plant copy-on-read    the dataset holds its index as Python dicts; the workers, reading it in order, copy its
                        pages one by one as they touch the objects' reference counts: their memory grows
--plant none            the same job, steady
--seconds S             stop after about S seconds of training
--items N               copy-on-read: entries in the dataset's index, read once over about --seconds
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

WIDTH = 64


class Growing(Dataset):
    """Item i is a sequence whose length grows with i (every item of a batch the same length)."""

    def __init__(self, n: int, batch: int, grow: bool) -> None:
        self.n, self.batch, self.grow = n, batch, grow

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        length = 4 + (i // self.batch) // 8 if self.grow else 4
        return torch.ones(length, WIDTH) * (i % 7), torch.tensor(i % 2)


class Indexed(Dataset):
    """A dataset whose index is a list of Python dicts, as a CSV of file names often becomes."""

    def __init__(self, n: int) -> None:
        self.items = [{"id": i, "label": i % 2, "path": f"images/{i:08d}.jpg"} for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        item = self.items[i]
        return torch.full((4, WIDTH), float(len(item["path"]) % 5)), torch.tensor(item["label"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plant", choices=("leak", "python-leak", "growing-inputs", "copy-on-read", "none"), default="none")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--items", type=int, default=400_000)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    batch = 16
    if args.plant == "copy-on-read":
        data: Dataset = Indexed(args.items)  # read in order, 64 at a time, over about --seconds
        pause = max(0.0, 0.9 * args.seconds / (args.items / 64) - 0.001)
        loader = DataLoader(data, batch_size=64, num_workers=2, persistent_workers=True)
    else:
        loader = DataLoader(Growing(10_000_000, batch, args.plant == "growing-inputs"), batch_size=batch)
    model = nn.Sequential(nn.Linear(WIDTH, 256), nn.ReLU(), nn.Linear(256, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    kept: list[torch.Tensor] = []
    history: list[list[dict[str, object]]] = []
    started = time.perf_counter()
    steps = 0
    for x, y in loader:
        out = model(x).mean(dim=1)
        loss = loss_fn(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.plant == "leak":
            kept.append(model(x).mean(dim=1))  # its graph holds the activations: a classic, kept "for logging"
            running = torch.cat(kept).mean().item()
            assert running == running
        elif args.plant == "python-leak":
            history.append([{"step": steps, "values": [k]} for k in range(200)])
        elif args.plant == "copy-on-read":
            time.sleep(pause)  # the rest of the step, so that one epoch lasts the run
        steps += 1
        if time.perf_counter() - started > args.seconds:
            break
    print(f"{steps} steps in {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
