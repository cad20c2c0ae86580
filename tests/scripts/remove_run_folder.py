"""A job whose run folder is removed while it trains (a cleanup script, an rm -rf of the store): stallscope must
say the events were lost, not that the recorder never started. Exits 0."""

import os
import shutil

import torch
from torch.utils.data import DataLoader, TensorDataset

from stallscope.settings import ENV_RUN_DIR

loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.zeros(64)), batch_size=8)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    if step == 4:
        shutil.rmtree(os.environ[ENV_RUN_DIR])
    loss = (model(x).squeeze(1) - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
