"""One epoch through 2 persistent workers, then the script ends with them still alive: persistent_workers.py START.

multiprocessing terminates such workers at the job's exit, under torch's own SIGTERM handler (which runs no
Python): whatever a worker had not written out by then was lost. Each sample costs about 10 ms on one line.
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Costly(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        start = time.perf_counter()
        value = float(i)
        while time.perf_counter() - start < 0.01: value = value * 0.999 + 0.5  # the sample's cost
        return torch.full((8,), value % 1.0), i % 2


if __name__ == "__main__":
    # at module level, as in most scripts: the loader (and its workers) outlive the loop until the interpreter ends
    loader = DataLoader(Costly(), batch_size=4, num_workers=2, persistent_workers=True,
                        multiprocessing_context=sys.argv[1])
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
    print("steps", steps)
