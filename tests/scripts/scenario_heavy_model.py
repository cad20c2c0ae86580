"""A wide MLP on small tensors held in memory: the model, not the data, sets the pace.

Wide enough that receiving a batch from the worker (a fixed cost of a few ms) stays well under a
tenth of the step on a slow, shared CI machine too.
"""

import sys

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> int:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(4096, 512), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.Linear(512, 3072), torch.nn.ReLU(), torch.nn.Linear(3072, 3072),
                                torch.nn.ReLU(), torch.nn.Linear(3072, 10))
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(10):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
