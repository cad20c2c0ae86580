"""Each sample is a dict of hundreds of small tensors (multi-task features): collate dominates."""

import sys

import torch
from torch.utils.data import DataLoader, Dataset

FIELDS = 400


class FeatureDicts(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        base = torch.arange(4, dtype=torch.float32)
        # Features come ready-made (from a cache); assembling the batch is the only real work.
        self.sample = {f"feature_{k}": base + k for k in range(FIELDS)}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        return self.sample


def main() -> int:
    torch.set_num_threads(1)  # the training process gets one core, as a GPU job's would
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    loader = DataLoader(FeatureDicts(100000), batch_size=64, num_workers=workers)
    model = torch.nn.Linear(FIELDS * 4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for batch in loader:
        features = torch.cat([batch[f"feature_{k}"] for k in range(FIELDS)], dim=1)
        loss = model(features).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
