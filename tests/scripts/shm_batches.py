"""Batches of 8 MiB from two workers: more than a small /dev/shm holds (the e2e test mounts one of 2 MiB), so the
workers cannot allocate the shared memory a batch travels in."""

import torch
from torch.utils.data import DataLoader, Dataset


class Frames(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.ones(256, 1024)  # 1 MiB


if __name__ == "__main__":
    total = 0.0
    for batch in DataLoader(Frames(), batch_size=8, num_workers=2):
        total += float(batch.sum())
    print(total)
