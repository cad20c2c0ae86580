"""Trains a few steps, then its dataset raises a FileNotFoundError whose file name carries terminal control codes
(an OSC title change, a screen clear, hidden text, a C1 CSI byte): as a planted or odd file name would."""

import sys

import torch
from torch.utils.data import DataLoader, Dataset

EVIL = "/data/cats/\x1b]0;OWNED\x07\x1b[2J\x1b[8mhidden.jpg\x9b31m"


class Images(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        if i >= 32 and "--fail" in sys.argv:
            raise FileNotFoundError(EVIL)
        return torch.randn(4), i % 2


model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(Images(), batch_size=8, num_workers=1):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
