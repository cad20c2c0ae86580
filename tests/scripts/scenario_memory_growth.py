"""A dataset that caches every decoded sample in its worker: each worker's memory keeps growing."""

import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class CachingDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.cache = {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if index not in self.cache:
            rng = np.random.default_rng(index)
            image = rng.random((3, 256, 256), dtype=np.float32)  # 768 KiB, "decoded" and kept forever
            for _ in range(12):  # some preprocessing work per sample
                image = np.sqrt(image * image + 0.5)
            self.cache[index] = image
        return torch.from_numpy(self.cache[index][:, :64, :64].copy()), index % 10


def main() -> int:
    torch.set_num_threads(1)  # the training process gets one core, as a GPU job's would
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    loader = DataLoader(CachingDataset(100000), batch_size=16, num_workers=workers)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for images, labels in loader:
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
