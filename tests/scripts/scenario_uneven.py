"""Samples whose reads take uneven times: most come from a warm cache (2 ms), one in twenty from a cold store
(120 ms), so a batch of 8 takes 16 ms or several times that. Workers hand their batches over in order, so a batch
with a cold read holds up the ones behind it: what ``analysis/in_order.py`` prices.

    python scenario_uneven.py [WORKERS] [STEPS]
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

WARM_S, COLD_S, COLD_EVERY = 0.002, 0.12, 20


class UnevenReads(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        cold = (index * 2654435761) % 2**32 % COLD_EVERY == 0  # a fixed one in twenty, spread over the indices
        time.sleep(COLD_S if cold else WARM_S)
        image = torch.full((3, 32, 32), float(index % 251)) / 251
        return image, index % 10


def main() -> int:
    torch.set_num_threads(1)
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
    torch.manual_seed(0)
    loader = DataLoader(UnevenReads(8000), batch_size=8, shuffle=True, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step >= steps:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
