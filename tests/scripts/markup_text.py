"""Trains a few steps, then fails with a message full of square brackets (rich markup if unescaped).
Its arguments (Hydra list syntax) and its folder name are brackets too, in the test that runs it."""

import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(data, batch_size=8):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
if "--fail" in sys.argv:
    raise ValueError("failed to read [/data/train/x.jpg]: reduction must be one of [mean, sum, none], got [red]")
